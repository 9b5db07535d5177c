"""A lean HTTP/1.1 streaming POST on an ``asyncio.Protocol``: the client's fast path.

httpx (h11 + httpcore + anyio) costs ~50-75 µs of CPU per streamed chunk, which caps one
core at ~13,000-18,000 chunks/s (benchmarks/client_overhead.py); a GPU server at high
concurrency streams more than that. Here each read is handled in ``data_received``
with no coroutine switch: status line and headers, chunked or plain body, then SSE
``data:`` lines handed to ``on_event(payload, arrival_time)``.

One connection per request with ``Connection: close``, like SGLang's bench_serving
(a new aiohttp session per request), so TTFT includes the same loopback connect.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


class TransportFailure(Exception):
    """A request failed below HTTP; ``kind`` is ``connect``, ``disconnect`` or ``timeout``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class HttpResult:
    """The outcome of a streamed POST: status, and the body when the status is not 200."""

    status: int
    error_body: str = ""


class _SseProtocol(asyncio.Protocol):
    """Parses one HTTP/1.1 response and feeds its SSE ``data:`` payloads to ``on_event``."""

    def __init__(
        self, request: bytes, on_event: Callable[[bytes, float], None], done: asyncio.Future
    ) -> None:
        self.request = request
        self.on_event = on_event
        self.done = done
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

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)

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
                return
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
        raw = self.raw
        pos = 0
        while True:
            eol = raw.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(raw[pos:eol].split(b";", 1)[0], 16)
            if size == 0:
                self.raw = b""
                self._end()
                return
            start, stop = eol + 2, eol + 2 + size
            if len(raw) < stop + 2:
                break
            self._body(raw[start:stop], now)
            pos = stop + 2
        self.raw = raw[pos:]

    def _body(self, data: bytes, now: float) -> None:
        if self.status != 200:
            self.error_body += data
            return
        buffered = self.lines + data
        lines = buffered.split(b"\n")
        self.lines = lines.pop()
        for line in lines:
            if line.startswith(b"data:"):
                self.on_event(line[5:].strip(), now)

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
) -> HttpResult:
    """POST ``body`` as JSON to ``url``; feed SSE payloads to ``on_event`` as they arrive.

    Returns the status (and the body when not 200). Raises ``TransportFailure`` with kind
    ``connect`` (cannot connect), ``disconnect`` (connection broke mid-response) or
    ``timeout`` (no byte for ``timeout_s``). Shell equivalent: ``curl -sN -X POST URL -d @body``.
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
    protocol = _SseProtocol(request, on_event, done)
    try:
        await asyncio.wait_for(
            loop.create_connection(
                lambda: protocol, host, port,
                ssl=ssl.create_default_context() if secure else None,
                server_hostname=host if secure else None,
            ),
            timeout=min(timeout_s, 30.0),
        )  # fmt: skip
    except (OSError, asyncio.TimeoutError) as exc:
        raise TransportFailure("connect", f"cannot connect to {host}:{port}: {exc}") from exc
    protocol.watchdog = loop.call_later(timeout_s, _watch, protocol, timeout_s)
    try:
        return await done
    finally:
        if protocol.watchdog is not None:
            protocol.watchdog.cancel()
        if protocol.transport is not None:
            protocol.transport.close()


def _watch(protocol: _SseProtocol, timeout_s: float) -> None:
    """Fail the request when no byte arrived for ``timeout_s``, else check again later."""
    idle = time.perf_counter() - protocol.last_read
    if idle >= timeout_s:
        protocol._finish(TransportFailure("timeout", f"no data for {timeout_s:g} s"))
        return
    loop = asyncio.get_running_loop()
    protocol.watchdog = loop.call_later(timeout_s - idle, _watch, protocol, timeout_s)
