"""NodeHost: a node's connection as its CTs' checks share it during one fleet run.

Every Host operation goes to the node's own Host (an SSHHost), with two savings on the
commands (``run``), which the config check of EVERY CT issues:

* commands run through ONE gpudoctor agent on the node (started once over the node's SSH
  connection, see :mod:`gpudoctor.hosts.agent.client`) instead of one SSH exec session each
  (an sshd session process, a login shell and ``timeout`` per command, saved);
* the output of a few commands whose answer cannot change during a run is remembered
  after the first success: ``lxc-config lxc.lxcpath``, ``readlink <pve root>/local``
  (to locate each CT's config) and ``pveversion``. Nothing is cached across runs;
* the node facts every CT's config check reads again (``ct.device_rules``: the node's
  ``/proc/devices``, ``ls /dev`` and directories, ``stat`` of the NVIDIA nodes and of the
  CT's mount sources) are asked once per run (:data:`REMEMBER_FILES`): answers and
  errors are kept for the run, which only reads.

Command streams (``pct exec``/``lxc-attach`` for the CT agents) still open their own
SSH channel: they need their own pipes.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from gpudoctor.hosts.agent.client import AgentHost, agent_command
from gpudoctor.hosts.base import CommandResult, FileStat, ForwardingHost, Host
from gpudoctor.hosts.byte_stream import ByteStream
from gpudoctor.hosts.snapshot import Kept

REMEMBER_FILES = True  # False: every file question goes to the node (benchmarks)
REMEMBERED_TEXT = ("/proc/devices",)


def constant_for_a_run(argv: Sequence[str]) -> bool:
    """Return True for the commands whose answer is fixed during a fleet run."""
    args = tuple(argv)
    return (
        args == ("lxc-config", "lxc.lxcpath")
        or args == ("pveversion",)
        or (len(args) == 2 and args[0] == "readlink" and args[1].endswith("/local"))
    )


class NodeHost(ForwardingHost):
    """Wraps a node's Host (see the module doc); ``inner`` does the work."""

    def __init__(self, inner: Host, call_timeout: float = 120.0) -> None:
        self.inner = inner
        self.files = inner
        self.name = inner.name
        self.python = inner.python
        self._lock = threading.Lock()
        self._answers: dict[tuple[str, ...], CommandResult] = {}
        self._files: dict[tuple[str, str], Kept] = {}
        self._runner: Host = inner
        if inner.run_opens_session:
            self._runner = AgentHost(
                lambda: inner.open_stream(agent_command(inner.python)),
                name=inner.name,
                python=inner.python,
                call_timeout=call_timeout,
            )

    def _remember(self, op: str, path: str, ask: Any) -> Any:
        """Return ``ask()``'s answer (or raise its OSError), asked once per run."""
        if not REMEMBER_FILES:
            return ask()
        key = (op, path)
        with self._lock:
            kept = self._files.get(key)
        if kept is None:
            try:
                kept = Kept(ask())
            except OSError as exc:
                kept = Kept(exc)
            with self._lock:
                self._files[key] = kept
        return kept.result()

    def stat(self, path: str) -> FileStat:
        """Return ``stat PATH`` on the node (asked once per run)."""
        return self._remember("stat", path, lambda: self.inner.stat(path))

    def list_dir(self, path: str) -> list[str]:
        """Return ``ls -A PATH`` on the node, sorted (asked once per run)."""
        return self._remember("list_dir", path, lambda: self.inner.list_dir(path))

    def read_text(self, path: str, limit: int = 1 << 20) -> str:
        """Return the text of a node file (``cat PATH``); :data:`REMEMBERED_TEXT` once per run."""
        if path not in REMEMBERED_TEXT:
            return self.inner.read_text(path, limit)
        return self._remember(f"read_text:{limit}", path, lambda: self.inner.read_text(path, limit))

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        """Run ``argv`` on the node; a run-constant command (:func:`constant_for_a_run`)
        runs once and its successful result is returned again after that."""
        key = tuple(argv)
        if input is not None or not constant_for_a_run(key):
            return self._runner.run(argv, timeout, input)
        with self._lock:
            known = self._answers.get(key)
        if known is not None:
            return known
        result = self._runner.run(argv, timeout, input)
        if result.ok:
            with self._lock:
                self._answers[key] = result
        return result

    def open_stream(self, argv: Sequence[str]) -> ByteStream:
        """Start ``argv`` on the node and return its pipes (for ``pct exec``/``lxc-attach``)."""
        return self.inner.open_stream(argv)

    def close(self) -> None:
        """Stop the command agent and close the node's connection."""
        if self._runner is not self.inner:
            self._runner.close()
        self.inner.close()
