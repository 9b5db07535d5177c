"""One inference server process: start, wait for readiness, watch, stop; never orphaned.

Every server runs in its own session/process group on a free loopback port, with
stdout+stderr appended to a per-configuration log. Every process of a campaign carries
the environment variable ``GPUDOCTOR_BENCH_TAG=<run id>:<launch id>``, which its children
inherit, so whatever a server spawns can be found and killed:

- :meth:`ServerProcess.stop` sends SIGTERM to the group, SIGKILL after a grace period,
  then kills any tagged straggler (``kill -TERM -PGID; sleep; kill -KILL -PGID``);
- each server gets ``PR_SET_PDEATHSIG`` (SIGTERM when the launcher dies);
- a small guardian process (``python -m gpudoctor.bench.launch.server --guard TAG``) waits
  for the launcher's pipe to close (the launcher exited or was SIGKILLed) and then
  kills every process with its launch's tag;
- a new launch on the same run directory first reaps every process of that run.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from gpudoctor import fsio
from gpudoctor.bench.launch import interrupts
from gpudoctor.bench.launch.engine_error import with_engine_error

TAG_VAR = "GPUDOCTOR_BENCH_TAG"
_PR_SET_PDEATHSIG = 1


class ServerCrashed(RuntimeError):
    """The server exited (or never became ready); ``tail`` holds its last log lines."""

    def __init__(self, message: str, tail: list[str], returncode: int | None) -> None:
        super().__init__(message)
        self.tail = tail
        self.returncode = returncode


class NoFreePort(RuntimeError):
    """Every port of the plan's ``engine.port_range`` is in use (the message says which)."""


class ExternalServer:
    """A server gpudoctor did not start (the plan's ``engine.server_url``): the face of a
    :class:`ServerProcess` with nothing to watch, read or stop. It counts as alive; a server
    that goes away shows as failed requests (connection errors), never as a crash."""

    pid = None
    returncode = None
    log_ready_s = None

    def __init__(self) -> None:
        self.started_at = time.monotonic()

    def alive(self) -> bool:
        """Return True: its process is not ours to see."""
        return True

    def tail(self, count: int = 50) -> list[str]:
        """Return []: its log is not ours."""
        return []

    def wait_ready(self, probe: Callable[[], bool], timeout_s: float, log_pattern: str = "",
                   interval_s: float = 0.2) -> float:  # fmt: skip
        """Return the seconds until ``probe()`` was True; ServerCrashed after ``timeout_s``."""
        deadline = self.started_at + timeout_s
        while not probe():
            if time.monotonic() > deadline:
                raise ServerCrashed(f"no answer after {timeout_s:.0f} s", [], None)
            time.sleep(interval_s)
        return time.monotonic() - self.started_at

    def wait_exit(self, timeout_s: float) -> None:
        """Return at once: it is not ours to wait for."""

    def stop(self, grace_s: float = 30.0) -> None:
        """Leave it running (it is not ours); return None (no exit code)."""
        return None


def free_port(
    host: str = "127.0.0.1",
    port_range: tuple[int, int] | None = None,
    avoid: frozenset[int] = frozenset(),
) -> int:
    """Return a TCP port that is free on ``host`` right now: any (bind to port 0), or one of
    ``port_range`` (low, high inclusive) not in ``avoid`` (ports handed to servers still
    starting), tried from a random one on. Raises NoFreePort when the whole range is taken."""
    if port_range is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])
    low, high = port_range
    count = high - low + 1
    first = random.randrange(count)
    for step in range(count):
        port = low + (first + step) % count
        if port in avoid:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise NoFreePort(
        f"no free port in engine.port_range {low}-{high} ({count} port(s), all in use on"
        f" {host}): widen the range or stop what listens there (ss -ltnp)"
    )


try:  # resolved in the parent: the child between fork and exec only calls it
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # pragma: no cover - not Linux
    _PRCTL = None


def _set_pdeathsig() -> None:  # runs in the child between fork and exec
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def _child_setup() -> None:  # runs in the child between fork and exec
    """Give the child the default SIGINT/SIGTERM/SIGHUP (the launcher's handler only
    records them while it forks: a stop's SIGTERM would be lost), leave at once when one
    was already recorded (a Ctrl-C as it forked), and ask for SIGTERM at the launcher's
    death; returns None."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    if interrupts.pending():
        os._exit(128 + signal.SIGINT)
    _set_pdeathsig()


def tail_lines(path: Path, count: int = 50) -> list[str]:
    """Return the last ``count`` lines of a log file (``tail -n 50 LOG``)."""
    try:
        with os.fdopen(fsio.open_regular(path), "rb") as fh:  # never through a link
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 256 * 1024))
            data = fh.read()
    except OSError:
        return []
    return data.decode("utf-8", "replace").splitlines()[-count:]


def tagged_processes(prefix: str) -> list:
    """Return the live processes whose ``GPUDOCTOR_BENCH_TAG`` starts with ``prefix``."""
    import psutil

    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            tag = proc.environ().get(TAG_VAR, "")
        except (psutil.Error, OSError):
            continue
        if tag.startswith(prefix) and tag:
            found.append(proc)
    return found


def reap(prefix: str, grace_s: float = 10.0) -> int:
    """Terminate every process tagged ``prefix*`` (SIGTERM, SIGKILL after ``grace_s``);
    return how many there were."""
    import psutil

    procs = tagged_processes(prefix)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    alive = wait_gone(procs, grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    wait_gone(alive, 5.0)
    return len(procs)


def _gone(proc) -> bool:  # type: ignore[no-untyped-def]
    """Return True when ``proc`` has exited: gone, or a zombie its parent has not waited
    for yet (it runs nothing; ``psutil.wait_procs`` would wait for it to the end)."""
    import psutil

    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def wait_gone(procs: list, timeout_s: float, interval_s: float = 0.05) -> list:
    """Return those of ``procs`` still running after up to ``timeout_s`` (polled every
    ``interval_s``); never reaps a child (its own ``Popen.wait`` gets the exit code)."""
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if not _gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(interval_s)
        alive = [p for p in alive if not _gone(p)]
    return alive


class ServerProcess:
    """A started server (see the module docstring for how it is kept from orphaning)."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, tag: str) -> None:
        self.argv = argv
        self.log_path = log_path
        self.tag = tag
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(fsio.open_append(log_path, require_trusted_dir=True), "ab") as log:
            log.write(f"\n### gpudoctor bench: {' '.join(argv)}\n".encode())
            log.flush()
            # where this server's output starts: taken before it runs (a fast server
            # writes its first lines, the ready line too, before Popen returns)
            self._log_start = self._log_offset = os.fstat(log.fileno()).st_size
            self.started_at = time.monotonic()
            with interrupts.deferred():  # a Ctrl-C in Popen would lose the started server
                self.proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **env, TAG_VAR: tag},
                    start_new_session=True,
                    preexec_fn=_child_setup,
                )
        try:  # a Ctrl-C while it forked (recorded, or dropped by an at-fork callback)
            interrupts.raise_if_interrupted()
        except KeyboardInterrupt:
            self.stop(grace_s=5.0)
            raise
        self._log_carry = ""  # the unfinished last line read so far (bounded)
        self.log_bytes_read = 0  # bytes read from the log by the readiness scan
        self.log_ready_s: float | None = None

    @property
    def pid(self) -> int:
        """Return the server's pid (also its process group id)."""
        return self.proc.pid

    def alive(self) -> bool:
        """Return True while the server process has not exited."""
        return self.proc.poll() is None

    def tail(self, count: int = 50) -> list[str]:
        """Return the last ``count`` lines of the server's log."""
        return tail_lines(self.log_path, count)

    def _scan_log(self, pattern: re.Pattern[str], chunk: int = 8 << 20) -> None:
        """Read the log from where the last scan stopped (``tail -c +OFFSET``), at most
        ``chunk`` bytes per call, and note when ``pattern`` first shows. Each byte is read
        once; only the unfinished last line (at most 4 KiB) is carried to the next scan."""
        if self.log_ready_s is not None:
            return
        try:
            with os.fdopen(fsio.open_regular(self.log_path), "rb") as fh:
                fh.seek(self._log_offset)
                new = fh.read(chunk)
        except OSError:
            return
        self._log_offset += len(new)
        self.log_bytes_read += len(new)
        text = self._log_carry + new.decode("utf-8", "replace")
        head, _, self._log_carry = text.rpartition("\n")
        self._log_carry = self._log_carry[-4096:]
        if pattern.search(head) or pattern.search(self._log_carry):
            self.log_ready_s = time.monotonic() - self.started_at

    def wait_ready(
        self,
        probe: Callable[[], bool],
        timeout_s: float,
        log_pattern: str = "",
        interval_s: float = 0.05,
    ) -> float:
        """Wait until ``probe()`` is True; return the seconds since start.

        Raises ServerCrashed when the process exits first or ``timeout_s`` passes (the
        server is then stopped). Also notes when ``log_pattern`` first shows in the log
        (:attr:`log_ready_s`, the server's own view of its start)."""
        pattern = re.compile(log_pattern) if log_pattern else None
        deadline = self.started_at + timeout_s
        while True:
            if pattern is not None:
                self._scan_log(pattern)
            if not self.alive():
                code, tail = self.proc.returncode, self.tail()
                reason = with_engine_error(f"server exited with code {code} during startup", tail)
                raise ServerCrashed(reason, tail, code)
            if probe():
                if pattern is not None:
                    self._scan_log(pattern, chunk=64 << 20)  # catch up with the log
                return time.monotonic() - self.started_at
            if time.monotonic() > deadline:
                tail = self.tail()
                self.stop(grace_s=10)
                reason = with_engine_error(f"server not ready after {timeout_s:.0f} s", tail)
                raise ServerCrashed(reason, tail, None)
            time.sleep(interval_s)

    def wait_exit(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the process to exit (a dying server's exit to land)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout_s)

    @property
    def returncode(self) -> int | None:
        """Return the exit code, None while it runs."""
        return self.proc.returncode

    def stop(self, grace_s: float = 30.0) -> int | None:
        """Stop the server's whole process group (SIGTERM, then SIGKILL after ``grace_s``)
        and any tagged straggler; return the exit code."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        reap(self.tag, grace_s=5.0)
        return self.proc.poll()


class Guardian:
    """A watchdog process that kills this launch's servers when the launcher dies."""

    def __init__(self, tag: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpudoctor.bench.launch.server", "--guard", tag],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def close(self) -> None:
        """Release the guardian (it reaps, finds nothing left, and exits)."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _guard(tag: str) -> None:
    """Block until stdin closes, then kill every process tagged ``tag``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except OSError:
        pass
    reap(tag, grace_s=10.0)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--guard":
    _guard(sys.argv[2])
