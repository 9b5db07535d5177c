"""AgentHost: a Host whose file operations are served by the agent over a byte stream.

The stream is any pair of pipes to a process running :mod:`gpudoctor.hosts.agent.server`
(``python3 -I -c BOOTSTRAP``): a local subprocess (:class:`ProcessStream`), an SSH
exec channel (:class:`gpudoctor.hosts.ssh.host.ChannelStream`), or ``lxc-attach`` /
``pct exec`` run on a container's host. Requests carry ids and the agent serves them
concurrently, so checks running in parallel threads share one agent.

The far side is untrusted (a compromised container, a hostile host): every read from it
is bounded (:data:`MAX_LINE` per reply line, :data:`MAX_STREAM` per agent), every call
has a deadline at which the agent is KILLED (nothing is read from it after that), and
every reply is checked against the shape the protocol promises
(:mod:`gpudoctor.hosts.agent.replies`) before it is used.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpudoctor.hosts.agent import server as agent_mod
from gpudoctor.hosts.agent.replies import BadReply, record, typed
from gpudoctor.hosts.agent.streams import ProcessStream
from gpudoctor.hosts.base import (
    CommandResult,
    DiskUsage,
    FileStat,
    Host,
    HostError,
    OpenResult,
)
from gpudoctor.hosts.byte_stream import ByteStream
from gpudoctor.hosts.snapshot import Kept, snapshot_key

AGENT_SOURCE = Path(agent_mod.__file__).read_bytes()
DEFAULT_CALL_TIMEOUT = 30.0
START_TIMEOUT = 30.0
# A ``run`` call may take its own timeout plus this margin before the client gives up.
RUN_MARGIN = 15.0
# Bounds on what is read from an agent: one reply line, and all lines of one agent
# (a new agent is started after that). A longer line ends the agent.
MAX_LINE = 16 << 20
MAX_STREAM = 256 << 20
# read_bytes asks for at most this much per request (base64 keeps a reply under MAX_LINE).
READ_CHUNK = 8 << 20


def agent_command(python: str = "python3") -> list[str]:
    """Return the argv that starts an agent reading its source from stdin."""
    return [python, "-I", "-c", agent_mod.BOOTSTRAP]


def agent_preamble() -> bytes:
    """Return the bytes to send first: the agent source, length-prefixed."""
    return f"{len(AGENT_SOURCE)}\n".encode() + AGENT_SOURCE


class _Pending:
    """One request waiting for its reply."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.reply: dict[str, Any] | None = None


def read_line(stream: ByteStream, label: str) -> bytes:
    """Return the next line of ``stream`` (``b""`` at EOF); raise :class:`BadReply` when it
    is longer than :data:`MAX_LINE` (the rest is never read)."""
    line = stream.readline(MAX_LINE + 1)
    if len(line) > MAX_LINE:
        raise BadReply(
            f"{label}: the agent sent a line longer than {MAX_LINE >> 20} MiB; it was stopped"
        )
    return line


def read_with_deadline(stream: ByteStream, label: str, timeout: float) -> bytes:
    """Return the next line of ``stream`` if it comes within ``timeout`` seconds; otherwise
    abort the stream (kill the process) and raise HostError."""
    box: list[bytes | BaseException] = []

    def reader() -> None:
        try:
            box.append(read_line(stream, label))
        except (OSError, ValueError, EOFError, HostError) as exc:
            box.append(exc)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    thread.join(timeout)
    if not box:
        stream.abort()
        raise HostError(f"{label}: the agent did not answer within {timeout:g} s; it was stopped")
    if isinstance(box[0], BaseException):
        stream.abort()
        raise (
            HostError(str(box[0]))
            if isinstance(box[0], HostError)
            else HostError(f"{label}: cannot read from the agent: {box[0]}")
        )
    return box[0]


class AgentConnection:
    """One running agent: sends requests, routes replies to waiting callers by id.

    Reading is bounded (:data:`MAX_LINE`, :data:`MAX_STREAM`); a call that gets no reply
    by its deadline KILLS the agent (a hung driver or a hostile container cannot keep a
    reader, a thread or memory of ours busy), and the next call starts a fresh one.
    """

    kind = "python"
    has_python = True  # the agent itself runs on the host's python
    pipelined = False  # requests go one by one (no call_many)

    def __init__(self, stream: ByteStream, label: str, hello: dict[str, Any] | None = None) -> None:
        self.stream = stream
        self.label = label
        self.broken: str | None = None
        self.received = 0
        self._lock = threading.Lock()
        self._next_id = 0
        self._pending: dict[int, _Pending] = {}
        self.hello = hello if hello is not None else self._start()
        self._reader = threading.Thread(target=self._read_replies, daemon=True)
        self._reader.start()

    def _start(self) -> dict[str, Any]:
        try:
            self.stream.write(agent_preamble())
        except (OSError, EOFError, ValueError) as exc:
            raise self._fail(f"cannot send the agent: {exc}") from exc
        try:
            line = read_with_deadline(self.stream, self.label, START_TIMEOUT)
        except HostError as exc:
            raise self._fail(str(exc).removeprefix(f"{self.label}: ")) from None
        return self.check_hello(line)

    def check_hello(self, line: bytes) -> dict[str, Any]:
        """Return the agent's hello line as a dict; raise HostError when it is not one."""
        try:
            hello = json.loads(line)
        except ValueError:
            hello = None
        if not isinstance(hello, dict) or hello.get("hello") != "gpudoctor-agent":
            raise self._fail("the agent did not start")
        return hello

    def _fail(self, what: str) -> HostError:
        detail = self.stream.stderr_text().strip()
        message = f"{self.label}: {what}" + (
            f" ({detail.splitlines()[-1][:300]})" if detail else ""
        )
        self.broken = message
        return HostError(message)

    def _read_replies(self) -> None:
        while not self.broken:
            try:
                line = read_line(self.stream, self.label)
            except BadReply as exc:
                self._stop(str(exc))
                break
            except (OSError, ValueError, EOFError):
                line = b""
            if not line:
                break
            self.received += len(line)
            if self.received > MAX_STREAM:
                self._stop(f"{self.label}: the agent sent more than {MAX_STREAM >> 20} MiB; "
                           "it was stopped")  # fmt: skip
                break
            try:
                reply = json.loads(line)
            except ValueError:
                continue
            if not isinstance(reply, dict) or not isinstance(reply.get("id"), int):
                continue
            with self._lock:
                pending = self._pending.pop(reply["id"], None)
            if pending is not None:
                pending.reply = reply
                pending.done.set()
        error = self.broken or str(self._fail("the connection to the agent was lost"))
        self._release_waiting(error)

    def _release_waiting(self, error: str) -> None:
        with self._lock:
            waiting, self._pending = list(self._pending.values()), {}
        for pending in waiting:
            pending.reply = {"ok": False, "broken": error}
            pending.done.set()

    def _stop(self, message: str) -> None:
        """Mark the connection broken with ``message``, kill the agent, wake the callers."""
        self.broken = self.broken or message
        self.stream.abort()
        self._release_waiting(self.broken)

    def call(self, op: str, args: dict[str, Any], timeout: float) -> Any:
        """Send one request and return its result; raise OSError or HostError. At the
        deadline the agent is killed (other calls waiting on it fail too)."""
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
            message = (
                f"{self.label}: {op} got no answer within {timeout:g} s; the agent was stopped"
            )
            self._stop(message)
            raise HostError(message)
        return unpack_reply(pending.reply or {}, f"{self.label}: {op}")

    @property
    def idle(self) -> bool:
        """Return True when no call is waiting for a reply."""
        with self._lock:
            return not self._pending

    def close(self) -> None:
        """End the agent (EOF on its stdin) and close the stream."""
        self.broken = self.broken or f"{self.label}: the connection was closed"
        self.stream.close()


def unpack_reply(reply: dict[str, Any], where: str) -> Any:
    """Return a reply's result; re-raise an agent-side OSError as the right subclass;
    raise HostError for a broken connection or a malformed failure reply."""
    if reply.get("ok") is True:
        return reply.get("result")
    if "broken" in reply:
        raise HostError(str(reply["broken"]))
    err = reply.get("errno")
    if isinstance(err, int) and not isinstance(err, bool) and 0 < err < 4096:
        strerror, filename = reply.get("strerror"), reply.get("filename")
        raise OSError(
            err,
            strerror[:200] if isinstance(strerror, str) else os.strerror(err),
            filename if isinstance(filename, str) else None,
        )
    error = reply.get("error")
    raise HostError(f"{where}: agent error: {str(error)[:300] if error else 'unknown'}")


class AgentHost(Host):
    """A Host served by a gpudoctor agent at the other end of a byte stream.

    ``stream_factory`` starts a process running :func:`agent_command` and returns its
    :class:`ByteStream`; ``connect`` (optional) turns a fresh stream into a connection
    (the container host uses it to pick the python or the POSIX-sh agent). The agent is
    started on first use; when its stream breaks (e.g. the container restarted) or a
    call overruns its deadline, the failing call raises :class:`HostError` and the next
    call starts a fresh agent.
    """

    def __init__(
        self,
        stream_factory: Callable[[], ByteStream],
        name: str = "agent",
        python: str = "python3",
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        connect: Callable[[ByteStream, str], Any] | None = None,
    ) -> None:
        self.name = name
        self.python = python
        self.call_timeout = call_timeout
        self._stream_factory = stream_factory
        self._connect = connect or AgentConnection
        self._conn: Any = None
        self._conn_lock = threading.Lock()
        self._snapshot: dict[tuple[Any, ...], Any] | None = None

    def _connection(self) -> Any:
        with self._conn_lock:
            conn = self._conn
            if conn is not None and conn.broken:
                conn.close()
                self._conn = None
                self._snapshot = None  # answers of the old agent: maybe of an older CT
            if self._conn is None:
                self._conn = self._start_connection()
            return self._conn

    def _start_connection(self) -> Any:
        try:
            stream = self._stream_factory()
        except HostError as exc:
            text = str(exc)
            raise HostError(
                text if text.startswith(self.name) else f"{self.name}: {text}"
            ) from None
        try:
            return self._connect(stream, self.name)
        except HostError:
            stream.abort()
            raise

    def call(self, op: str, timeout: float | None = None, **args: Any) -> Any:
        """Run one agent op and return its raw result (OSError/HostError on failure); an
        answer kept by :meth:`prefetch` is served from there."""
        snapshot = self._snapshot
        if snapshot is not None:
            kept = snapshot.get(snapshot_key(op, args))
            if kept is not None:
                return kept.result()
        return self._connection().call(op, args, timeout or self.call_timeout)

    def prefetch(
        self, requests: Sequence[tuple[str, dict[str, Any]]], timeout: float | None = None
    ) -> int:
        """Ask the agent for every ``(op, args)`` in ONE round trip (when the agent can
        take them pipelined: the sh agent) and keep the answers until :meth:`close`: a later
        call with the same op and args (results and OSErrors) is answered from them, as a
        per-run snapshot of the target. Return how many answers were kept (0: nothing
        pipelined). Only for one check run: a fix's re-check must not see old answers."""
        conn = self._connection()
        if not conn.pipelined or not requests:
            return 0
        answers = conn.call_many(requests, timeout or self.call_timeout)
        kept = {}
        for (op, args), answer in zip(requests, answers, strict=True):
            if answer is not None and not isinstance(answer, BadReply):
                kept[snapshot_key(op, args)] = Kept(answer)
        with self._conn_lock:
            self._snapshot = {**(self._snapshot or {}), **kept}
        return len(kept)

    def read_text(self, path: str, limit: int = 1 << 20) -> str:
        """Return the file's text (``cat PATH``), at most ``limit`` bytes; raise OSError."""
        return typed(self.call("read_text", path=path, limit=limit), str, f"{self.name}: read_text")

    def read_bytes(self, path: str, length: int, offset: int = 0) -> bytes:
        """Return up to ``length`` bytes of a file from ``offset`` (``dd bs=1 skip=O
        count=L``), asked for in chunks of at most :data:`READ_CHUNK`; raise OSError."""
        parts: list[bytes] = []
        got = 0
        while got < length:
            want = min(READ_CHUNK, length - got)
            text = typed(
                self.call("read_bytes", path=path, length=want, offset=offset + got),
                str,
                f"{self.name}: read_bytes",
            )
            try:
                chunk = base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError):
                raise BadReply(f"{self.name}: read_bytes: bad reply from the agent: "
                               "not base64") from None  # fmt: skip
            if len(chunk) > want:
                raise BadReply(f"{self.name}: read_bytes: the agent sent more than asked")
            parts.append(chunk)
            got += len(chunk)
            if len(chunk) < want:
                break
        return b"".join(parts)

    def stat(self, path: str) -> FileStat:
        """Return ``stat PATH`` (symlinks followed); raise OSError."""
        return record(FileStat, self.call("stat", path=path), f"{self.name}: stat")

    def try_open(self, path: str, write: bool = True) -> OpenResult:
        """Open and close ``path`` (``O_RDWR`` or ``O_RDONLY``, non-blocking); never raise
        for the open's own failure."""
        return record(
            OpenResult, self.call("try_open", path=path, write=write), f"{self.name}: try_open"
        )

    def list_dir(self, path: str) -> list[str]:
        """Return the sorted entry names of a directory (``ls -A PATH``); raise OSError."""
        names = self.call("list_dir", path=path)
        return list(typed(names, list, f"{self.name}: list_dir", items=str))

    def disk_usage(self, path: str) -> DiskUsage:
        """Return the usage in bytes of the filesystem holding ``path`` (``df -B1 PATH``)."""
        return record(DiskUsage, self.call("disk_usage", path=path), f"{self.name}: disk_usage")

    def run(
        self, argv: Sequence[str], timeout: float = 30.0, input: str | None = None
    ) -> CommandResult:
        """Run ``argv`` on the far side in its own session; its process group is killed
        at ``timeout`` seconds (returncode 127 when the program is missing)."""
        args = {"argv": list(argv), "timeout": timeout, "input": input}
        result = self._connection().call("run", args, timeout + RUN_MARGIN)
        return record(CommandResult, result, f"{self.name}: run")

    def ping(self) -> dict[str, Any]:
        """Return the agent's ``{"pid", "python"}`` (starts the agent if needed)."""
        return typed(self.call("ping"), dict, f"{self.name}: ping")

    def close(self) -> None:
        """Stop the agent (if started); forget what :meth:`prefetch` kept."""
        with self._conn_lock:
            self._snapshot = None
            if self._conn is not None:
                self._conn.close()
            self._conn = None


def local_agent_host(python: str = "python3", name: str = "local-agent") -> AgentHost:
    """Return an AgentHost whose agent is a local ``python3 -I`` subprocess (for tests
    and for running probes under a different interpreter)."""
    return AgentHost(lambda: ProcessStream(agent_command(python)), name=name, python=python)
