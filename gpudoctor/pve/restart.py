"""Start, stop, restart a container and wait for it: ``pct`` on Proxmox, ``lxc-*`` on plain LXC.

All commands run on the CT's host through ``host.run``. The init PID (``lxc-info -p``)
tells a restart that happened from one that did not.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpudoctor.hosts.base import CommandResult, Host
from gpudoctor.pve.apply import ApplyError, Layout, Target, _why
from gpudoctor.pve.startlog import why_lines

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 60.0


class Controller:
    """Drives one container on its host. Subclasses say which commands do what."""

    def __init__(self, host: Host, target: Target, layout: Layout) -> None:
        self.host = host
        self.target = target
        self.layout = layout

    def _lxc_args(self) -> list[str]:
        return ["-n", self.target.ct, *(["-P", self.layout.lxcpath] if self.layout.lxcpath else [])]

    def _run(self, argv: list[str], timeout: float) -> CommandResult:
        return self.host.run(argv, timeout=timeout)

    def state(self) -> str:
        """Return ``RUNNING``, ``STOPPED`` (or another LXC state) from ``lxc-info -s -H``."""
        result = self._run(["lxc-info", *self._lxc_args(), "-s", "-H"], 20)
        return result.stdout.strip().upper() if result.ok else "STOPPED"

    def init_pid(self) -> int | None:
        """Return the container's init PID as the host sees it (``lxc-info -p -H``), or None."""
        result = self._run(["lxc-info", *self._lxc_args(), "-p", "-H"], 20)
        text = result.stdout.strip()
        return int(text) if result.ok and text.isdigit() else None

    def start(self) -> None:
        """Start the container; raise ApplyError when the start command fails."""
        raise NotImplementedError

    def start_failure(self, what: str, result: CommandResult) -> ApplyError:
        """Return the ApplyError for a failed start, with the lines that say why: the CT
        is started once more with a debug log (:meth:`debug_start`) when it is stopped."""
        lines: tuple[str, ...] = ()
        try:
            if self.state() != "RUNNING":
                lines = self.debug_start()
        except ApplyError:
            lines = ()
        why = "; ".join(lines) if lines else _why(result)
        return ApplyError("start_failed", f"{what} {self.target.ct} failed: {why}", lines)

    def debug_start(self) -> tuple[str, ...]:
        """Start the stopped CT with a debug log; return the lines saying why it failed
        (empty when it started this time)."""
        return ()

    def stop(self) -> None:
        """Stop the container; raise ApplyError when the stop command fails."""
        raise NotImplementedError

    def restart(self) -> None:
        """Restart a running container (``pct reboot`` / ``lxc-stop`` + ``lxc-start``)."""
        self.stop()
        self.start()

    def wait_running(
        self, old_pid: int | None, timeout: float = START_TIMEOUT_S, sleep: Callable = time.sleep
    ) -> int:
        """Wait until the container runs with an init PID other than ``old_pid``; return
        the new PID. Raise ApplyError("start_failed") at ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = self.init_pid()
            if self.state() == "RUNNING" and pid is not None and pid != old_pid:
                return pid
            sleep(0.5)
        raise ApplyError(
            "start_failed", f"CT {self.target.ct} is not running {timeout:g} s after the restart"
        )


class PctController(Controller):
    """A Proxmox CT driven with ``pct`` (``pct start|stop|reboot|status``)."""

    def _pct(self, *args: str, timeout: float = START_TIMEOUT_S) -> CommandResult:
        return self._run([self.layout.pct, *args, self.target.ct], timeout)

    def state(self) -> str:
        """Return ``RUNNING`` / ``STOPPED`` from ``pct status <vmid>``."""
        result = self._pct("status", timeout=20)
        if not result.ok:
            raise ApplyError("io", f"pct status {self.target.ct} failed: {_why(result)}")
        return result.stdout.split(":", 1)[-1].strip().upper()

    def start(self) -> None:
        """Run ``pct start <vmid>``."""
        result = self._pct("start")
        if not result.ok:
            raise self.start_failure("pct start", result)

    def debug_start(self) -> tuple[str, ...]:
        """Run ``pct start <vmid> --debug`` (the LXC debug log on its output); return the
        lines of it that say why the start failed."""
        result = self._run([self.layout.pct, "start", self.target.ct, "--debug"], START_TIMEOUT_S)
        return () if result.ok else why_lines(result.stdout + "\n" + result.stderr)

    def stop(self) -> None:
        """Run ``pct stop <vmid>``."""
        result = self._pct("stop", timeout=STOP_TIMEOUT_S)
        if not result.ok:
            raise ApplyError("stop_failed", f"pct stop {self.target.ct} failed: {_why(result)}")

    def restart(self) -> None:
        """Run ``pct reboot <vmid>`` (which skips the lock check: the caller checked it)."""
        result = self._pct("reboot", timeout=START_TIMEOUT_S + STOP_TIMEOUT_S)
        if not result.ok:
            raise self.start_failure("pct reboot", result)


class LxcController(Controller):
    """A plain LXC container (``lxc-start -d``, ``lxc-stop``, ``lxc-info``)."""

    def start(self) -> None:
        """Run ``lxc-start -n NAME [-P PATH] -d``."""
        result = self._run(["lxc-start", *self._lxc_args(), "-d"], START_TIMEOUT_S)
        if not result.ok:
            raise self.start_failure("lxc-start", result)

    def debug_start(self) -> tuple[str, ...]:
        """Run ``lxc-start -d -l DEBUG -o FILE`` (FILE from ``mktemp`` on the host, removed
        after); return the log lines that say why the start failed."""
        made = self._run(["mktemp", "/tmp/gpudoctor-lxc-start.XXXXXX"], 20)
        log = made.stdout.strip()
        if not made.ok or not log.startswith("/tmp/gpudoctor-lxc-start."):
            return ()
        try:
            argv = ["lxc-start", *self._lxc_args(), "-d", "-l", "DEBUG", "-o", log]
            if self._run(argv, START_TIMEOUT_S).ok:
                return ()
            try:
                return why_lines(self.host.read_text(log, 4 << 20))
            except OSError:
                return ()
        finally:
            self._run(["rm", "-f", "--", log], 20)

    def stop(self) -> None:
        """Run ``lxc-stop -n NAME [-P PATH] -t 20`` (a clean shutdown, then a kill)."""
        result = self._run(["lxc-stop", *self._lxc_args(), "-t", "20"], STOP_TIMEOUT_S)
        if not result.ok and self.state() != "STOPPED":
            raise ApplyError("stop_failed", f"lxc-stop {self.target.ct} failed: {_why(result)}")


def controller_for(host: Host, target: Target, layout: Layout) -> Controller:
    """Return the controller for the target's flavor."""
    if target.flavor == "pve":
        return PctController(host, target, layout)
    return LxcController(host, target, layout)
