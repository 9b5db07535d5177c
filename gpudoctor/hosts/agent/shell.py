"""The POSIX-sh agent: the in-CT agent (busybox ash, dash); no python3 needed in the CT.

:data:`SH_AGENT` is a shell loop run inside the container (``sh -c``, see
:mod:`gpudoctor.hosts.container`). It serves the file operations the device checks
need, each with the plain tool a shell has:

========== ===================================================================
op         inside the CT
========== ===================================================================
stat       ``stat -L -c '%f %t %T %u %g %s %Y' PATH`` (no stat: ``ls -lnLd PATH``)
try_open   ``(exec 3<>PATH)`` (``exec 3<PATH`` for read-only), errno from its message;
           ``W``: only when PATH is a char/block node (else ``ok skip``)
read_text  ``/proc`` (not ``/proc/sys``): the shell's ``read`` in a loop (no process); others
           ``R=$(head -c LIMIT PATH)`` (text: NUL bytes dropped; one write with the answer)
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
them) and one or two writes per answer; a client may send several at once
(:meth:`ShellConnection.call_many`: one round trip for all the facts a check run reads),
announced by ``batch N /``: the agent then collects the N answers (one subshell) and
writes them at once (one SSH packet instead of N). Only a CT-side process that knows the session's
terminator could forge an answer, and then only about its own CT. ``run`` is not served
here: the container host runs commands with a fresh ``lxc-attach``/``pct exec`` instead.

:class:`ShellConnection` is the client: it turns answers into the python agent's result
dicts, so :class:`~gpudoctor.hosts.agent.client.AgentHost` serves both. Reads are bounded
and every call has a deadline at which the agent is killed, as for the python agent.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from gpudoctor.hosts.agent.client import MAX_LINE, MAX_STREAM, START_TIMEOUT
from gpudoctor.hosts.agent.replies import BadReply
from gpudoctor.hosts.agent.shell_replies import (
    b64,
    check_path,
    errno_of,
    names,
    raw,
    stat_result,
    usage_result,
)
from gpudoctor.hosts.base import HostError
from gpudoctor.hosts.byte_stream import ByteStream

# Files procfs generates (short lines, readable at any offset) are read with the shell's
# own ``read`` (no process started; it reads byte by byte); other files with ``head -c``
# (bounded however long a line is). Not /proc/sys (sysctl files give EOF at an offset > 0)
# nor /sys.
KERNEL_TEXT = "/proc/"
NOT_KERNEL_TEXT = "/proc/sys/"
# Requests whose answers a batch cannot carry (raw bytes: a command substitution drops NULs).
UNBATCHED = ("read_bytes", "ping")
BUILTIN_READ = True  # False: every read_text through head (the benchmark's "before" path)

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
serve() {
  case $op in
  stat)
    ex "$p" || return
    if [ -n "$S" ]; then
      stat -L -c "$T ok s %f %t %T %u %g %s %Y" "$p" 2>/dev/null \
        || bad "$(stat -L -c %f "$p" 2>&1)"
    elif o=$(ls -lnLd "$p" 2>&1); then end ok "l $o"; else bad "$o"; fi ;;
  open)
    ex "$p" || return
    if [ "$arg" = W ] && [ ! -c "$p" ] && [ ! -b "$p" ]; then end ok skip; return; fi
    if [ "$arg" != r ]; then o=$( (exec 3<>"$p") 2>&1 ); else o=$( (exec 3<"$p") 2>&1 ); fi \
      && end ok || bad "$o" ;;
  read|bytes)
    ex "$p" || return
    if [ -d "$p" ]; then end err "Is a directory"; return; fi
    if [ ! -r "$p" ]; then end err "Permission denied"; return; fi
    if [ "$op" = read ]; then R=$(head -c "$arg" "$p" 2>/dev/null; echo .); R="${R%.}$NL"
    else
      if [ "${arg%:*}" = 0 ]; then head -c "${arg#*:}" "$p"
      else tail -c "+$((${arg%:*} + 1))" "$p" | head -c "${arg#*:}"; fi 2>/dev/null
      printf '\n'
    fi
    end ok ;;
  text)
    ex "$p" || return
    if [ -d "$p" ]; then end err "Is a directory"; return; fi
    if [ ! -r "$p" ]; then end err "Permission denied"; return; fi
    R=; l=
    { while IFS= read -r l; do R="$R$l$NL"; l=; [ ${#R} -lt "$arg" ] || break; done
      R="$R$l$NL"; } < "$p" 2>/dev/null
    end ok ;;
  list)
    ex "$p" || return
    if [ ! -d "$p" ]; then end err "Not a directory"; return; fi
    if [ ! -r "$p" ] || [ ! -x "$p" ]; then end err "Permission denied"; return; fi
    for f in "$p"/* "$p"/.[!.]* "$p"/..?*; do
      if [ -e "$f" ] || [ -L "$f" ]; then R="$R|${f##*/}$NL"; fi
    done
    end ok ;;
  df)
    ex "$p" || return
    if [ -n "$S" ] && stat -f -c "$T ok s %S %b %f %a" "$p" 2>/dev/null; then :
    elif o=$(df -Pk "$p" 2>&1); then end ok "d $(printf '%s\n' "$o" | tail -n 1)"
    else bad "$o"; fi ;;
  ping) end ok "$$" ;;
  *) end err "unknown op" ;;
  esac
}
while IFS=' ' read -r op arg p; do
  if [ "$op" = batch ]; then
    n=$arg
    O=$(while [ "$n" -gt 0 ] && IFS=' ' read -r op arg p; do serve; n=$((n - 1)); done; echo .)
    printf '%s' "${O%.}"
  else serve; fi
done
"""


class ShellConnection:
    """A running POSIX-sh agent (:data:`SH_AGENT`): one request at a time, read in the
    caller's thread while a timer watches the deadline (at which the agent is killed).
    One reply may hold at most :data:`MAX_LINE` bytes, one agent send :data:`MAX_STREAM`;
    whatever it writes between requests waits in the pipe (bounded by the kernel).
    Results have the python agent's shape."""

    kind = "sh"
    pipelined = True  # :meth:`call_many` sends many requests in one write

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

    def _collect(
        self, timeout: float, op: str, deadline: float | None = None
    ) -> tuple[list[bytes], str, str]:
        """Read one answer by ``deadline`` (monotonic; default ``timeout`` s from now):
        (data lines, status, rest of its last line)."""
        message = f"{self.label}: {op} got no answer within {timeout:g} s; the agent was stopped"
        self._set_deadline((deadline or time.monotonic() + timeout, message))
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
        result = self.call_many([(op, args)], timeout)[0]
        if isinstance(result, BaseException):
            raise result
        return result

    def call_many(
        self, requests: Sequence[tuple[str, dict[str, Any]]], timeout: float
    ) -> list[Any]:
        """Send every request in ONE write (pipelined; the agent answers them in order) and
        return one entry per request: its result, or the OSError/BadReply it raised (a
        ``try_open`` asked with ``nodes_only`` that met no device node gives None). Raise
        HostError when the connection breaks; ``timeout`` covers them all."""
        if self.broken:
            raise HostError(self.broken)
        lines = [self._request(op, args) for op, args in requests]
        text = "".join(line for line, _ in lines)
        if len(lines) > 1 and all(op not in UNBATCHED for op, _ in requests):
            text = f"batch {len(lines)} /\n{text}"  # all answers in one write
        with self._call_lock:
            try:
                self.stream.write(text.encode())
            except (OSError, ValueError, EOFError) as exc:
                raise self._stop(f"{self.label}: cannot send to the shell agent: {exc}") from None
            answers = []
            deadline = time.monotonic() + timeout
            for op, _ in requests:
                answers.append(self._collect(timeout, op, deadline))
        out: list[Any] = []
        for (op, args), (_, convert), (data, status, rest) in zip(
            requests, lines, answers, strict=True
        ):
            try:
                out.append(self._result(op, args, convert, data, status, rest))
            except (OSError, BadReply) as exc:
                out.append(exc)
        return out

    def _result(self, op: str, args: dict[str, Any], convert: Callable[[str, list[bytes]], Any],
                data: list[bytes], status: str, rest: str) -> Any:  # fmt: skip
        """Return one answer as the python agent's result; raise OSError or BadReply."""
        path = args.get("path")
        if status == "err":
            if op == "try_open":
                return {"path": path, "flags": "O_RDWR" if args.get("write", True) else "O_RDONLY",
                        "errno": errno_of(rest)}  # fmt: skip
            raise OSError(errno_of(rest), rest.strip()[:200] or "failed", path)
        if status != "ok":
            raise BadReply(f"{self.label}: {op}: bad reply from the shell agent: {status[:40]!r}")
        if op == "try_open" and args.get("nodes_only") and rest == "skip":
            return None
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
            mode = ("W" if args.get("nodes_only") else "w") if write else "r"
            return (
                f"open {mode} {path}\n",
                lambda rest, data: {"path": path, "flags": flags, "errno": 0},
            )
        if op == "read_text":
            limit = int(args.get("limit", 1 << 20))
            builtin = path.startswith(KERNEL_TEXT) and not path.startswith(NOT_KERNEL_TEXT)
            verb = "text" if BUILTIN_READ and builtin else "read"
            return f"{verb} {limit} {path}\n", lambda rest, data: raw(data)[:limit].decode(
                "utf-8", "replace"
            )
        if op == "read_bytes":
            offset, length = int(args.get("offset", 0)), int(args["length"])
            return f"bytes {offset}:{length} {path}\n", lambda rest, data: b64(raw(data)[:length])
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
