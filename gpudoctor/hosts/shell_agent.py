"""The POSIX-sh agent: the in-CT agent (busybox ash, dash); no python3 needed in the CT.

:data:`SH_AGENT` is a shell loop run inside the container (``sh -c``, see
:mod:`gpudoctor.hosts.container`). It serves the file operations the device checks
need, each with the plain tool a shell has:

========== ===================================================================
op         inside the CT
========== ===================================================================
stat       ``stat -L -c '%f %t %T %u %g %s %Y' PATH`` (no stat: ``ls -lnLd PATH``)
try_open   ``(exec 3<>PATH)`` (``exec 3<PATH`` for read-only), errno from its message
read_text  ``R=$(head -c LIMIT PATH)`` (text: NUL bytes dropped; one write with the answer)
read_bytes ``tail -c +OFF+1 PATH | head -c LEN`` (raw bytes, then a newline)
list_dir   a glob loop (``PATH/* PATH/.[!.]* PATH/..?*``)
disk_usage ``stat -f -c '%S %b %f %a' PATH`` (no stat: ``df -Pk PATH``)
ping       ``$$``
========== ===================================================================

Protocol: the client first sends a random terminator ``T`` on a line; then one request
per line, ``OP ARG PATH`` (ARG ``-`` when unused; PATH absolute, no newline). The agent
answers with data (a file's raw bytes and a newline, or ``|NAME`` entries), then ``T ok
[FIELDS]`` or ``T err MESSAGE`` where MESSAGE is the strerror text of the failing tool.
Requests are served one at a time, with few processes started (builtins where a shell has
them) and one or two writes per answer. Only a CT-side process that knows the session's
terminator could forge an answer, and then only about its own CT. ``run`` is not served
here: the container host runs commands with a fresh ``lxc-attach``/``pct exec`` instead.

:class:`ShellConnection` is the client: it turns answers into the python agent's result
dicts, so :class:`~gpudoctor.hosts.remote.AgentHost` serves both. Reads are bounded
and every call has a deadline at which the agent is killed, as for the python agent.
"""

from __future__ import annotations

import base64
import errno as errno_mod
import os
import re
import secrets
import threading
import time
from typing import Any

from gpudoctor.hosts.agent import file_kind
from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.remote import MAX_LINE, MAX_STREAM, START_TIMEOUT, ByteStream
from gpudoctor.hosts.replies import BadReply

SH_AGENT = r"""
IFS= read -r T || exit 0
S=; command -v stat >/dev/null 2>&1 && S=1
NL='
'
R=
end() { printf '%s%s %s\n' "$R" "$T" "$*"; R=; }
bad() { end err "${1##*: }"; }
ex() {
  [ -e "$1" ] && return 0
  d=$1
  while d=${d%/*}; [ -n "$d" ] && [ ! -e "$d" ]; do :; done
  if [ -z "$d" ] || [ -d "$d" ]; then end err "No such file or directory"
  else end err "Not a directory"; fi
  return 1
}
end hello "$$"
while IFS=' ' read -r op arg p; do
  case $op in
  stat)
    ex "$p" || continue
    if [ -n "$S" ]; then
      stat -L -c "$T ok s %f %t %T %u %g %s %Y" "$p" 2>/dev/null \
        || bad "$(stat -L -c %f "$p" 2>&1)"
    elif o=$(ls -lnLd "$p" 2>&1); then end ok "l $o"; else bad "$o"; fi ;;
  open)
    ex "$p" || continue
    if [ "$arg" = w ]; then o=$( (exec 3<>"$p") 2>&1 ); else o=$( (exec 3<"$p") 2>&1 ); fi \
      && end ok || bad "$o" ;;
  read|bytes)
    ex "$p" || continue
    if [ -d "$p" ]; then end err "Is a directory"; continue; fi
    if [ ! -r "$p" ]; then end err "Permission denied"; continue; fi
    if [ "$op" = read ]; then R=$(head -c "$arg" "$p" 2>/dev/null; echo .); R="${R%.}$NL"
    else
      if [ "${arg%:*}" = 0 ]; then head -c "${arg#*:}" "$p"
      else tail -c "+$((${arg%:*} + 1))" "$p" | head -c "${arg#*:}"; fi 2>/dev/null
      printf '\n'
    fi
    end ok ;;
  list)
    ex "$p" || continue
    if [ ! -d "$p" ]; then end err "Not a directory"; continue; fi
    if [ ! -r "$p" ] || [ ! -x "$p" ]; then end err "Permission denied"; continue; fi
    for f in "$p"/* "$p"/.[!.]* "$p"/..?*; do
      if [ -e "$f" ] || [ -L "$f" ]; then R="$R|${f##*/}$NL"; fi
    done
    end ok ;;
  df)
    ex "$p" || continue
    if [ -n "$S" ] && stat -f -c "$T ok s %S %b %f %a" "$p" 2>/dev/null; then :
    elif o=$(df -Pk "$p" 2>&1); then end ok "d $(printf '%s\n' "$o" | tail -n 1)"
    else bad "$o"; fi ;;
  ping) end ok "$$" ;;
  *) end err "unknown op" ;;
  esac
done
"""

# strerror texts -> errno: the C library's, plus the shells' own words (dash, busybox).
_ERRNOS = {os.strerror(e).lower(): e for e in errno_mod.errorcode}
_ERRNOS.update(
    {
        "no such file": errno_mod.ENOENT,
        "directory nonexistent": errno_mod.ENOENT,
        "nonexistent directory": errno_mod.ENOENT,
        "not found": errno_mod.ENOENT,
    }
)
_DF_LINE = re.compile(r"(\d+)\s+(\d+)\s+(\d+)\s+\d+%")
_LS_TYPES = {"c": "char", "b": "block", "d": "dir", "-": "file", "l": "link"}


def errno_of(message: str) -> int:
    """Return the errno whose strerror text is ``message`` (``EIO`` when unknown)."""
    return _ERRNOS.get(message.strip().lower(), errno_mod.EIO)


def check_path(path: str) -> str:
    """Return ``path`` when the shell protocol can carry it (absolute, one line, no
    surrounding blanks); raise OSError(EINVAL) otherwise."""
    if (
        not isinstance(path, str)
        or not path.startswith("/")
        or "\n" in path
        or "\r" in path
        or path != path.strip()
    ):
        raise OSError(errno_mod.EINVAL, "path not supported by the shell agent", path)
    return path


def stat_result(path: str, fields: list[str]) -> dict[str, Any]:
    """Return the FileStat dict for ``s RAWMODE MAJ MIN UID GID SIZE MTIME`` (stat -c, hex
    mode and numbers) or ``l <ls -lnLd line>``; raise ValueError on anything else."""
    if fields[0] == "s" and len(fields) == 8:
        raw, major, minor = int(fields[1], 16), int(fields[2], 16), int(fields[3], 16)
        uid, gid, size, mtime = (int(v) for v in fields[4:8])
        kind = file_kind(raw)
        return {
            "path": path,
            "kind": kind,
            "mode": raw & 0o7777,
            "major": major if kind in ("char", "block") else 0,
            "minor": minor if kind in ("char", "block") else 0,
            "uid": uid,
            "gid": gid,
            "size": size,
            "mtime": float(mtime),
        }
    if fields[0] == "l" and len(fields) >= 6:
        perms = fields[1]
        kind = _LS_TYPES.get(perms[0], "other")
        mode = 0
        for i, char in enumerate(perms[1:10]):
            if char not in "-ST":  # S/T: set-id/sticky WITHOUT the x bit
                mode |= 1 << (8 - i)
        mode |= (0o4000 if perms[3] in "sS" else 0) | (0o2000 if perms[6] in "sS" else 0)
        mode |= 0o1000 if perms[9] in "tT" else 0
        uid, gid = int(fields[3]), int(fields[4])
        major = minor = size = 0
        if kind in ("char", "block"):
            major, minor = int(fields[5].rstrip(",")), int(fields[6])
        else:
            size = int(fields[5])
        return {"path": path, "kind": kind, "mode": mode, "major": major, "minor": minor,
                "uid": uid, "gid": gid, "size": size, "mtime": 0.0}  # fmt: skip
    raise ValueError("unknown stat answer")


def usage_result(fields: list[str]) -> dict[str, int]:
    """Return the DiskUsage dict for ``s FRSIZE BLOCKS BFREE BAVAIL`` or ``d <df -Pk line>``."""
    if fields[0] == "s" and len(fields) == 5:
        frsize, blocks, bfree, bavail = (int(v) for v in fields[1:])
        return {"total": blocks * frsize, "used": (blocks - bfree) * frsize,
                "free": bavail * frsize}  # fmt: skip
    found = _DF_LINE.search(" ".join(fields[1:])) if fields[0] == "d" else None
    if found is None:
        raise ValueError("unknown df answer")
    total, used, free = (int(v) * 1024 for v in found.groups())
    return {"total": total, "used": used, "free": free}


class ShellConnection:
    """A running POSIX-sh agent (:data:`SH_AGENT`): one request at a time, read in the
    caller's thread while a timer watches the deadline (at which the agent is killed).
    One reply may hold at most :data:`MAX_LINE` bytes, one agent send :data:`MAX_STREAM`;
    whatever it writes between requests waits in the pipe (bounded by the kernel).
    Results have the python agent's shape."""

    kind = "sh"

    def __init__(self, stream: ByteStream, label: str, has_python: bool = False) -> None:
        self.stream = stream
        self.label = label
        self.has_python = has_python
        self.broken: str | None = None
        self.received = 0
        self._expired: str | None = None
        self._terminator = f"@gpd-{secrets.token_hex(8)}"
        self._call_lock = threading.Lock()
        self._buf = bytearray()
        self._clock = threading.Condition()
        self._deadline: tuple[float, str] | None = None
        self._closed = False
        threading.Thread(target=self._watch, daemon=True).start()
        try:
            stream.write(f"{self._terminator}\n".encode())
        except (OSError, ValueError, EOFError) as exc:
            raise self._stop(f"{label}: cannot talk to the shell agent: {exc}") from None
        _, status, rest = self._collect(START_TIMEOUT, "start")
        if status != "hello":
            raise self._stop(f"{label}: the shell agent did not start")
        self.hello = {"hello": "gpudoctor-sh-agent", "pid": rest}

    def _stop(self, message: str) -> HostError:
        """Mark the connection broken (first reason wins), kill the agent; return the error."""
        if not self.broken:
            detail = self.stream.stderr_text().strip()
            self.broken = message + (f" ({detail.splitlines()[-1][:300]})" if detail else "")
        self.stream.abort()
        with self._clock:
            self._closed = True
            self._clock.notify()
        return HostError(self.broken)

    def _watch(self) -> None:
        """The connection's watchdog: kill the agent when a call's deadline passes."""
        with self._clock:
            while not self._closed:
                if self._deadline is None:
                    self._clock.wait()
                    continue
                left = self._deadline[0] - time.monotonic()
                if left > 0:
                    self._clock.wait(left)
                    continue
                self._expired = self._deadline[1]
                self.broken = self.broken or self._expired
                self._deadline = None
                self.stream.abort()

    def _set_deadline(self, deadline: tuple[float, str] | None) -> None:
        with self._clock:
            self._deadline = deadline
            self._clock.notify()

    def _collect(self, timeout: float, op: str) -> tuple[list[bytes], str, str]:
        """Read one answer under a deadline: (data lines, status, rest of its last line)."""
        message = f"{self.label}: {op} got no answer within {timeout:g} s; the agent was stopped"
        self._set_deadline((time.monotonic() + timeout, message))
        try:
            return self._read_answer()
        finally:
            self._set_deadline(None)

    def _read_answer(self) -> tuple[list[bytes], str, str]:
        data: list[bytes] = []
        size = 0
        marker = self._terminator.encode() + b" "
        buf = self._buf
        start = 0
        while True:
            end = buf.find(b"\n", start)
            if end < 0:
                del buf[:start]
                start = 0
                if len(buf) > MAX_LINE:
                    raise self._stop(f"{self.label}: the agent sent a line longer than "
                                     f"{MAX_LINE >> 20} MiB; it was stopped")  # fmt: skip
                try:
                    chunk = self.stream.read_some(1 << 16)
                except (OSError, ValueError, EOFError):
                    chunk = b""
                if self._expired:
                    raise HostError(self._expired)
                if not chunk:
                    raise self._stop(f"{self.label}: the connection to the agent was lost")
                self.received += len(chunk)
                if self.received > MAX_STREAM:
                    raise self._stop(f"{self.label}: the shell agent sent more than asked; "
                                     "it was stopped")  # fmt: skip
                buf += chunk
                continue
            line = bytes(buf[start : end + 1])
            start = end + 1
            if line.startswith(marker):
                del buf[:start]
                text = line[len(marker) :].decode("utf-8", "replace").rstrip("\n")
                status, _, rest = text.partition(" ")
                return data, status, rest
            size += len(line)
            if size > MAX_LINE:
                raise self._stop(
                    f"{self.label}: the shell agent sent more than asked; it was stopped"
                )
            data.append(line)

    def call(self, op: str, args: dict[str, Any], timeout: float) -> Any:
        """Serve one python-agent op through the shell; return the python agent's result
        shape; raise OSError (the tool's errno) or HostError."""
        if self.broken:
            raise HostError(self.broken)
        request, convert = self._request(op, args)
        with self._call_lock:
            try:
                self.stream.write(request.encode())
            except (OSError, ValueError, EOFError) as exc:
                raise self._stop(f"{self.label}: cannot send to the shell agent: {exc}") from None
            data, status, rest = self._collect(timeout, op)
        path = args.get("path")
        if status == "err":
            if op == "try_open":
                return {"path": path, "flags": "O_RDWR" if args.get("write", True) else "O_RDONLY",
                        "errno": errno_of(rest)}  # fmt: skip
            raise OSError(errno_of(rest), rest.strip()[:200] or "failed", path)
        if status != "ok":
            raise BadReply(f"{self.label}: {op}: bad reply from the shell agent: {status[:40]!r}")
        try:
            return convert(rest, data)
        except (ValueError, IndexError) as exc:
            raise BadReply(f"{self.label}: {op}: bad reply from the shell agent: {exc}") from None

    def _request(self, op: str, args: dict[str, Any]) -> tuple[str, Any]:
        """Return (request line, converter of (rest, data lines) to the result)."""
        if op == "ping":
            return "ping - /\n", lambda rest, data: {"pid": int(rest), "python": ""}
        path = check_path(args.get("path", ""))
        if op == "stat":
            return f"stat - {path}\n", lambda rest, data: stat_result(path, rest.split())
        if op == "try_open":
            write = bool(args.get("write", True))
            flags = "O_RDWR" if write else "O_RDONLY"
            return (
                f"open {'w' if write else 'r'} {path}\n",
                lambda rest, data: {"path": path, "flags": flags, "errno": 0},
            )
        if op == "read_text":
            limit = int(args.get("limit", 1 << 20))
            return f"read {limit} {path}\n", lambda rest, data: raw(data)[:limit].decode(
                "utf-8", "replace"
            )
        if op == "read_bytes":
            offset, length = int(args.get("offset", 0)), int(args["length"])
            return f"bytes {offset}:{length} {path}\n", lambda rest, data: _b64(raw(data)[:length])
        if op == "list_dir":
            return f"list - {path}\n", lambda rest, data: sorted(names(data))
        if op == "disk_usage":
            return f"df - {path}\n", lambda rest, data: usage_result(rest.split())
        raise HostError(
            f"{self.label}: {op} is not served by the shell agent (no python3 in the CT)"
        )

    @property
    def idle(self) -> bool:
        """Return True when no call is in progress."""
        return not self._call_lock.locked()

    def close(self) -> None:
        """End the agent (EOF on its stdin), close the stream, end the watchdog."""
        self.broken = self.broken or f"{self.label}: the connection was closed"
        with self._clock:
            self._closed = True
            self._clock.notify()
        self.stream.close()


def raw(lines: list[bytes]) -> bytes:
    """Return a file's bytes sent raw: all data lines, less the newline the agent adds
    before its terminator line."""
    data = b"".join(lines)
    if not data.endswith(b"\n"):
        raise ValueError("unterminated data")
    return data[:-1]


def names(lines: list[bytes]) -> list[str]:
    """Return the directory entries of ``|NAME`` lines."""
    out = []
    for line in lines:
        if not line.startswith(b"|"):
            raise ValueError("bad directory entry")
        out.append(line[1:].rstrip(b"\n").decode("utf-8", "surrogateescape"))
    return out


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _now() -> float:
    return time.monotonic()
