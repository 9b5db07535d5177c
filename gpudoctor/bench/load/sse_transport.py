"""A lean HTTP/1.1 streaming POST on an ``asyncio.Protocol``: the client's fast path.

httpx (h11 + httpcore + anyio) costs ~50-75 µs of CPU per streamed chunk, which caps one
core at ~13,000-18,000 chunks/s (benchmarks/client_overhead.py); a GPU server at high
concurrency streams more than that. Here each read is handled in ``data_received``
with no coroutine switch: status line and headers, chunked or plain body, then SSE
``data:`` lines handed to ``on_event(payload, arrival_time)``.

One connection per request with ``Connection: close``, like SGLang's bench_serving
(a new aiohttp session per request), so TTFT includes the same loopback connect.

A hostile or broken server must not hang the client or grow its memory: the response
head, one SSE line, one chunk-size line and an error body are capped (``StreamCaps``;
over a cap the request fails with kind ``oversize``), chunked bodies are decoded as
they arrive (a huge announced chunk is never buffered whole), and every request has an
absolute deadline (kind ``timeout``, or ``deadline`` when the cell's deadline is the
one that passed).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


class TransportFailure(Exception):
    """A request failed below HTTP; ``kind`` is ``connect``, ``disconnect``, ``timeout``,
    ``deadline`` or ``oversize``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class StreamCaps:
    """Byte limits on what a server may send (a real server stays far below each).

    Attributes:
        head_bytes: status line + headers (64 KiB; nginx's default is 4-8 KiB).
        line_bytes: one SSE line (1 MiB; a token chunk is ~300 bytes).
        chunk_size_line: one chunked-encoding size line (1 KiB).
        error_body_bytes: the body of a non-200 answer kept for the message (64 KiB;
            the rest is not read).
    """

    head_bytes: int = 64 * 1024
    line_bytes: int = 1024 * 1024
    chunk_size_line: int = 1024
    error_body_bytes: int = 64 * 1024


DEFAULT_CAPS = StreamCaps()


@dataclass(frozen=True)
class Deadline:
    """When a request must be over (``time.perf_counter()`` seconds) and the error kind
    to record then: ``timeout`` (its own limit) or ``deadline`` (the cell's)."""

    at: float
    kind: str = "timeout"
    message: str = ""


@dataclass(frozen=True)
class HttpResult:
    """The outcome of a streamed POST: status, and the body when the status is not 200."""

    status: int
    error_body: str = ""
    written_at: float | None = None  # perf_counter() when the request's bytes were written


class _SseProtocol(asyncio.Protocol):
    """Parses one HTTP/1.1 response and feeds its SSE ``data:`` payloads to ``on_event``."""

    def __init__(
        self, request: bytes, on_event: Callable[[bytes, float], None], done: asyncio.Future,
        caps: StreamCaps = DEFAULT_CAPS,
    ) -> None:  # fmt: skip
        self.request = request
        self.on_event = on_event
        self.done = done
        self.caps = caps
        self.chunk_left = 0  # bytes of the current chunk still to come (chunked bodies)
        self.transport: asyncio.Transport | None = None
        self.head = b""
        self.status = 0
        self.chunked = False
        self.remaining: int | None = None  # content-length left, when not chunked
        self.raw = b""  # undecoded chunked-framing bytes
        self.lines = b""  # SSE bytes not yet ended by a newline
        self.error_body = b""
        self.last_read = time.perf_counter()
        self.watchdog: asyncio.TimerHandle | None = None
        self.written_at: float | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)  # on an idle socket: send() at once, as a server sees it
        self.written_at = time.perf_counter()

    def _finish(self, result: HttpResult | BaseException) -> None:
        if not self.done.done():
            if isinstance(result, BaseException):
                self.done.set_exception(result)
            else:
                self.done.set_result(result)
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        try:
            self._received(data)
        except Exception as exc:  # a malformed response or event: fail this request only
            self._finish(exc)

    def _received(self, data: bytes) -> None:
        now = self.last_read = time.perf_counter()
        if self.done.done():
            return
        if not self.status:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                if len(self.head) > self.caps.head_bytes:
                    raise TransportFailure(
                        "oversize", f"response head over {self.caps.head_bytes} bytes"
                    )
                return
            if end > self.caps.head_bytes:
                raise TransportFailure(
                    "oversize", f"response head over {self.caps.head_bytes} bytes"
                )
            data = self.head[end + 4 :]
            self._parse_head(self.head[:end])
            if self.done.done():
                return
        if self.chunked:
            self.raw += data
            self._dechunk(now)
        else:
            if self.remaining is not None:
                data = data[: self.remaining]
                self.remaining -= len(data)
            self._body(data, now)
            if self.remaining == 0:
                self._end()

    def _parse_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        try:
            self.status = int(lines[0].split(b" ", 2)[1])
        except (IndexError, ValueError):
            self._finish(TransportFailure("disconnect", f"bad status line {lines[0][:80]!r}"))
            return
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"transfer-encoding" and b"chunked" in value.lower():
                self.chunked = True
            elif name == b"content-length":
                self.remaining = int(value.strip())

    def _dechunk(self, now: float) -> None:
        """Decode chunked framing as bytes arrive: chunk data goes to ``_body`` at once,
        so an announced chunk of any size is never buffered whole."""
        raw = self.raw
        pos = 0
        while pos < len(raw) and not self.done.done():
            if self.chunk_left > 0:
                piece = raw[pos : pos + self.chunk_left]
                self.chunk_left -= len(piece)
                pos += len(piece)
                self._body(piece, now)
                if self.chunk_left == 0:
                    self.chunk_left = -2  # the CRLF after the data
                continue
            if self.chunk_left < 0:  # skip the CRLF that ends a chunk's data
                skip = min(-self.chunk_left, len(raw) - pos)
                pos += skip
                self.chunk_left += skip
                continue
            eol = raw.find(b"\r\n", pos)
            if eol < 0:
                if len(raw) - pos > self.caps.chunk_size_line:
                    raise TransportFailure("oversize", "chunk-size line over the cap")
                break
            size = int(raw[pos:eol].split(b";", 1)[0], 16)
            pos = eol + 2
            if size == 0:
                self.raw = b""
                self._end()
                return
            if len(raw) >= pos + size + 2:  # the common case: the whole chunk is here
                self._body(raw[pos : pos + size], now)
                pos += size + 2
                continue
            self.chunk_left = size
        self.raw = raw[pos:]

    def _body(self, data: bytes, now: float) -> None:
        if self.status != 200:
            room = self.caps.error_body_bytes - len(self.error_body)
            self.error_body += data[:room]
            if len(data) >= room:  # enough to classify it: stop reading
                self._finish(HttpResult(self.status, self.error_body.decode("utf-8", "replace")))
            return
        buffered = self.lines + data
        lines = buffered.split(b"\n")
        self.lines = lines.pop()
        if len(self.lines) > self.caps.line_bytes:
            raise TransportFailure("oversize", f"an SSE line over {self.caps.line_bytes} bytes")
        for line in lines:
            if len(line) > self.caps.line_bytes:
                raise TransportFailure("oversize", f"an SSE line over {self.caps.line_bytes} bytes")
            if line.startswith(b"data:"):
                self.on_event(line[5:].strip(), now)
                if self.done.done():
                    return

    def _end(self) -> None:
        if self.status == 200 and self.lines.startswith(b"data:"):
            self.on_event(self.lines[5:].strip(), time.perf_counter())
        self.lines = b""
        self._finish(HttpResult(self.status, self.error_body.decode("utf-8", "replace")))

    def eof_received(self) -> bool:
        if self.status and not self.chunked and self.remaining is None:
            self._end()  # body delimited by the connection's end
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            reason = f"{type(exc).__name__}: {exc}" if exc else "server closed the connection"
            self.done.set_exception(
                TransportFailure("disconnect", f"{reason} before the response ended")
            )


async def stream_post(
    url: str,
    body: dict[str, Any],
    on_event: Callable[[bytes, float], None],
    timeout_s: float,
    deadline: Deadline | None = None,
    caps: StreamCaps = DEFAULT_CAPS,
) -> HttpResult:
    """POST ``body`` as JSON to ``url``; feed SSE payloads to ``on_event`` as they arrive.

    Returns the status (and at most ``caps.error_body_bytes`` of the body when not 200).
    Raises ``TransportFailure`` with kind ``connect`` (cannot connect), ``disconnect``
    (connection broke mid-response), ``timeout`` (no byte for ``timeout_s``, or
    ``deadline`` passed), ``deadline`` (the cell's deadline passed) or ``oversize`` (a
    cap of ``caps`` exceeded). ``on_event`` may raise TransportFailure to end the request.
    Shell equivalent: ``curl -sN --max-time T -X POST URL -d @body``.
    """
    parts = urlsplit(url)
    secure = parts.scheme == "https"
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if secure else 80)
    payload = json.dumps(body).encode()
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    request = (
        f"POST {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
        f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + payload
    loop = asyncio.get_running_loop()
    done: asyncio.Future[HttpResult] = loop.create_future()
    protocol = _SseProtocol(request, on_event, done, caps)
    deadline = deadline or Deadline(time.perf_counter() + 1e9)
    left = deadline.at - time.perf_counter()
    if left <= 0:
        raise TransportFailure(deadline.kind, deadline.message or "deadline passed before sending")
    try:
        await asyncio.wait_for(
            loop.create_connection(
                lambda: protocol, host, port,
                ssl=ssl.create_default_context() if secure else None,
                server_hostname=host if secure else None,
            ),
            timeout=min(timeout_s, 30.0, left),
        )  # fmt: skip
    except (OSError, asyncio.TimeoutError) as exc:
        raise TransportFailure("connect", f"cannot connect to {host}:{port}: {exc}") from exc
    protocol.watchdog = loop.call_later(min(timeout_s, max(deadline.at - time.perf_counter(), 0)),
                                        _watch, protocol, timeout_s, deadline)  # fmt: skip
    try:
        return dataclasses.replace(await done, written_at=protocol.written_at)
    finally:
        if protocol.watchdog is not None:
            protocol.watchdog.cancel()
        if protocol.transport is not None:
            protocol.transport.close()


def _watch(protocol: _SseProtocol, timeout_s: float, deadline: Deadline) -> None:
    """Fail the request at its deadline, or when no byte arrived for ``timeout_s``;
    else check again later."""
    now = time.perf_counter()
    if now >= deadline.at:
        protocol._finish(TransportFailure(deadline.kind, deadline.message or "deadline passed"))
        return
    idle = now - protocol.last_read
    if idle >= timeout_s:
        protocol._finish(TransportFailure("timeout", f"no data for {timeout_s:g} s"))
        return
    loop = asyncio.get_running_loop()
    protocol.watchdog = loop.call_later(min(timeout_s - idle, deadline.at - now), _watch,
                                        protocol, timeout_s, deadline)  # fmt: skip
