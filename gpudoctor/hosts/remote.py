"""AgentHost: a Host whose file operations are served by the agent over a byte stream.

The stream is any pair of pipes to a process running :mod:`gpudoctor.hosts.agent`
(``python3 -I -c BOOTSTRAP``): a local subprocess (:class:`ProcessStream`), an SSH
exec channel (:class:`gpudoctor.hosts.ssh.ChannelStream`), or ``lxc-attach`` /
``pct exec`` run on a container's host. Requests carry ids and the agent serves them
concurrently, so checks running in parallel threads share one agent; every call has a
timeout so a hung agent cannot hang the caller.
"""

from __future__ import annotations

import abc
import base64
import json
import subprocess
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpudoctor.hosts import agent as agent_mod
from gpudoctor.hosts.base import (
    CommandResult,
    DiskUsage,
    FileStat,
    Host,
    HostError,
    OpenResult,
)

AGENT_SOURCE = Path(agent_mod.__file__).read_bytes()
DEFAULT_CALL_TIMEOUT = 30.0
START_TIMEOUT = 30.0
# A ``run`` call may take its own timeout plus this margin before the client gives up.
RUN_MARGIN = 15.0


def agent_command(python: str = "python3") -> list[str]:
    """Return the argv that starts an agent reading its source from stdin."""
    return [python, "-I", "-c", agent_mod.BOOTSTRAP]


def agent_preamble() -> bytes:
    """Return the bytes to send first: the agent source, length-prefixed."""
    return f"{len(AGENT_SOURCE)}\n".encode() + AGENT_SOURCE


class ByteStream(abc.ABC):
    """Two pipes to a process: write requests, read reply lines, read its stderr."""

    @abc.abstractmethod
    def write(self, data: bytes) -> None:
        """Write and flush ``data``; raise OSError (or similar) when the stream broke."""

    @abc.abstractmethod
    def readline(self) -> bytes:
        """Return the next line (with its newline), or ``b""`` at EOF."""

    @abc.abstractmethod
    def stderr_text(self) -> str:
        """Return what the process wrote on stderr so far (best effort, for errors)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close the pipes and end the process."""


class ProcessStream(ByteStream):
    """A local subprocess's stdin/stdout (``argv`` is run, e.g. ``lxc-attach ...``)."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = list(argv)
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise HostError(f"cannot start {self.argv[0]}: {exc.strerror}") from exc
        self._stderr = bytearray()
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_thread.start()

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for chunk in iter(lambda: self.proc.stderr.read1(4096), b""):  # type: ignore[union-attr]
            if len(self._stderr) < 65536:
                self._stderr += chunk

    def write(self, data: bytes) -> None:
        """Write and flush ``data`` to the process's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def readline(self) -> bytes:
        """Return the next line of the process's stdout (``b""`` at EOF)."""
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def stderr_text(self) -> str:
        """Return the process's stderr so far (after a short wait if it has exited)."""
        if self.proc.poll() is not None:
            self._stderr_thread.join(1.0)
        return self._stderr.decode("utf-8", "replace")

    def close(self) -> None:
        """Close stdin (the agent exits at EOF), then make sure the process is gone."""
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(2)  # a real agent exits at once on EOF
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            if pipe:
                pipe.close()


class _Pending:
    """One request waiting for its reply."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.reply: dict[str, Any] | None = None


class AgentConnection:
    """One running agent: sends requests, routes replies to waiting callers by id."""

    def __init__(self, stream: ByteStream, label: str) -> None:
        self.stream = stream
        self.label = label
        self.broken: str | None = None
        # Set when a call timed out: the agent may be stuck (e.g. in a hung driver), so
        # new calls go to a fresh agent; this one is closed once nothing waits on it.
        self.retired = False
        self._lock = threading.Lock()
        self._next_id = 0
        self._pending: dict[int, _Pending] = {}
        self.hello = self._start()
        self._reader = threading.Thread(target=self._read_replies, daemon=True)
        self._reader.start()

    def _start(self) -> dict[str, Any]:
        try:
            self.stream.write(agent_preamble())
        except (OSError, EOFError) as exc:
            raise self._fail(f"cannot send the agent: {exc}") from exc
        box: list[bytes] = []
        reader = threading.Thread(target=lambda: box.append(self.stream.readline()), daemon=True)
        reader.start()
        reader.join(START_TIMEOUT)
        if not box:
            raise self._fail(f"the agent did not answer within {START_TIMEOUT:.0f} s")
        try:
            hello = json.loads(box[0])
        except ValueError:
            hello = {}
        if hello.get("hello") != "gpudoctor-agent":
            raise self._fail("the agent did not start")
        return hello

    def _fail(self, what: str) -> HostError:
        detail = self.stream.stderr_text().strip()
        message = f"{self.label}: {what}" + (f" ({detail.splitlines()[-1]})" if detail else "")
        self.broken = message
        return HostError(message)

    def _read_replies(self) -> None:
        while True:
            try:
                line = self.stream.readline()
            except (OSError, ValueError, EOFError):
                line = b""
            if not line:
                break
            try:
                reply = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                pending = self._pending.pop(reply.get("id"), None)
            if pending is not None:
                pending.reply = reply
                pending.done.set()
        error = (
            HostError(self.broken)
            if self.broken
            else self._fail("the connection to the agent was lost")
        )
        with self._lock:
            waiting, self._pending = list(self._pending.values()), {}
        for pending in waiting:
            pending.reply = {"ok": False, "broken": str(error)}
            pending.done.set()

    def call(self, op: str, args: dict[str, Any], timeout: float) -> Any:
        """Send one request and return its result; raise OSError or HostError."""
        if self.broken:
            raise HostError(self.broken)
        pending = _Pending()
        with self._lock:
            self._next_id += 1
            req_id = self._next_id
            self._pending[req_id] = pending
            data = (json.dumps({"id": req_id, "op": op, "args": args}) + "\n").encode()
            try:
                self.stream.write(data)
            except (OSError, ValueError, EOFError) as exc:
                self._pending.pop(req_id, None)
                raise self._fail(f"cannot send to the agent: {exc}") from exc
        if not pending.done.wait(timeout):
            with self._lock:
                self._pending.pop(req_id, None)
            self.retired = True
            raise HostError(f"{self.label}: {op} got no answer within {timeout:g} s")
        return unpack_reply(pending.reply or {}, self.label)

    @property
    def idle(self) -> bool:
        """Return True when no call is waiting for a reply."""
        with self._lock:
            return not self._pending

    def close(self) -> None:
        """End the agent (EOF on its stdin) and close the stream."""
        self.broken = self.broken or f"{self.label}: the connection was closed"
        self.stream.close()


def unpack_reply(reply: dict[str, Any], label: str) -> Any:
    """Return a reply's result; re-raise an agent-side OSError as the right subclass."""
    if reply.get("ok"):
        return reply.get("result")
    if "broken" in reply:
        raise HostError(reply["broken"])
    if reply.get("errno") is not None:
        raise OSError(reply["errno"], reply.get("strerror") or "", reply.get("filename"))
    raise HostError(f"{label}: agent error: {reply.get('error', 'unknown')}")


class AgentHost(Host):
    """A Host served by a gpudoctor agent at the other end of a byte stream.

    ``stream_factory`` starts a process running :func:`agent_command` and returns its
    :class:`ByteStream`. The agent is started on first use; when its stream breaks
    (e.g. the container restarted) the failing call raises :class:`HostError` and the
    next call starts a fresh agent.
    """

    def __init__(
        self,
        stream_factory: Callable[[], ByteStream],
        name: str = "agent",
        python: str = "python3",
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
    ) -> None:
        self.name = name
        self.python = python
        self.call_timeout = call_timeout
        self._stream_factory = stream_factory
        self._conn: AgentConnection | None = None
        self._retired: list[AgentConnection] = []
        self._conn_lock = threading.Lock()

    def _connection(self) -> AgentConnection:
        with self._conn_lock:
            conn = self._conn
            if conn is not None and (conn.broken or conn.retired):
                self._retired.append(conn)
                self._conn = None
            for old in [c for c in self._retired if c.broken or c.idle]:
                self._retired.remove(old)
                old.close()
            if self._conn is None:
                self._conn = self._start_connection()
            return self._conn

    def _start_connection(self) -> AgentConnection:
        try:
            stream = self._stream_factory()
        except HostError as exc:
            text = str(exc)
            raise HostError(
                text if text.startswith(self.name) else f"{self.name}: {text}"
            ) from None
        try:
            return AgentConnection(stream, self.name)
        except HostError:
            stream.close()
            raise

    def call(self, op: str, timeout: float | None = None, **args: Any) -> Any:
        """Run one agent op and return its raw result (OSError/HostError on failure)."""
        return self._connection().call(op, args, timeout or self.call_timeout)

    def read_text(self, path: str, limit: int = 1 << 20) -> str:
        """Return the file's text (``cat PATH``), at most ``limit`` bytes; raise OSError."""
        return self.call("read_text", path=path, limit=limit)

    def read_bytes(self, path: str, length: int, offset: int = 0) -> bytes:
        """Return up to ``length`` bytes of a file from ``offset`` (``dd bs=1 skip=O
        count=L``); raise OSError."""
        return base64.b64decode(self.call("read_bytes", path=path, length=length, offset=offset))

    def stat(self, path: str) -> FileStat:
        """Return ``stat PATH`` (symlinks followed); raise OSError."""
        return FileStat(**self.call("stat", path=path))

    def try_open(self, path: str, write: bool = True) -> OpenResult:
        """Open and close ``path`` (``O_RDWR`` or ``O_RDONLY``, non-blocking); never raise
        for the open's own failure."""
        return OpenResult(**self.call("try_open", path=path, write=write))

    def list_dir(self, path: str) -> list[str]:
        """Return the sorted entry names of a directory (``ls -A PATH``); raise OSError."""
        return list(self.call("list_dir", path=path))

    def disk_usage(self, path: str) -> DiskUsage:
        """Return the usage in bytes of the filesystem holding ``path`` (``df -B1 PATH``)."""
        return DiskUsage(**self.call("disk_usage", path=path))

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        """Run ``argv`` on the far side in its own session; its process group is killed
        at ``timeout`` seconds (returncode 127 when the program is missing)."""
        args = {"argv": list(argv), "timeout": timeout, "input": input}
        result = self._connection().call("run", args, timeout + RUN_MARGIN)
        result["argv"] = tuple(result["argv"])
        return CommandResult(**result)

    def ping(self) -> dict[str, Any]:
        """Return the agent's ``{"pid", "python"}`` (starts the agent if needed)."""
        return self.call("ping")

    def close(self) -> None:
        """Stop the agent (if started)."""
        with self._conn_lock:
            for conn in [*self._retired, *([self._conn] if self._conn else [])]:
                conn.close()
            self._retired, self._conn = [], None


def local_agent_host(python: str = "python3", name: str = "local-agent") -> AgentHost:
    """Return an AgentHost whose agent is a local ``python3 -I`` subprocess (for tests
    and for running probes under a different interpreter)."""
    return AgentHost(lambda: ProcessStream(agent_command(python)), name=name, python=python)
