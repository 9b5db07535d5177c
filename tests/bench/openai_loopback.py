"""A real OpenAI-compatible streaming HTTP server on loopback, in the test's own process.

It stands for SGLang's / vLLM's HTTP API (GPU servers that cannot run here) in the load
generator's fast tests, where a server process per test would cost seconds: an asyncio
server in its own thread (``LoopbackAsyncServer``) that speaks HTTP/1.1 with keep-alive
(httpx's pool) and ``Connection: close`` (the fast transport). ``POST /v1/completions``
and ``/v1/chat/completions`` stream one SSE event per token (``max_tokens`` of them, the
text ``" tok"``), chunked as SGLang's, the last with ``finish_reason`` and ``usage``, then
``data: [DONE]``; ``POST /flush_cache`` and ``GET /server_info`` answer as SGLang's.

Every completion request is recorded (``requests``: path and JSON body, in arrival
order; ``log``: ``start N`` / ``end N`` and the other requests' ``METHOD PATH``, in the
order they happened). Faults: ``status`` answers chosen requests (by number, 0-based)
with an HTTP status and body; ``hang`` never answers the paths it names; ``hold_until``
holds every stream until that many requests are in flight at once (``peak`` says the most
there ever were), so a concurrency limit shows on the wire; with ``hold_s``, at most that
long (to see that a limit is never passed: the streams go on either way).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from tests.bench.loopback_server import LoopbackAsyncServer


@dataclass(frozen=True)
class Seen:
    """One completion request as the server received it."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


class OpenAIServer(LoopbackAsyncServer):
    """``with OpenAIServer() as srv:`` then send to ``srv.url`` (the server's root)."""

    def __init__(
        self,
        *,
        status: dict[int, tuple[int, bytes]] | None = None,
        hold_until: int = 0,
        spec_verify_ct: int | None = None,
        flush_status: int = 200,
        server_info: dict[str, Any] | None = None,
        hang: tuple[str, ...] = (),
        hold_s: float = 0.0,
    ) -> None:
        super().__init__()
        self.status = status or {}
        self.hold_until = hold_until
        self.spec_verify_ct = spec_verify_ct
        self.flush_status = flush_status
        self.server_info = server_info
        self.hang = hang
        self.hold_s = hold_s
        self.requests: list[Seen] = []
        self.log: list[str] = []
        self.other: list[str] = []  # "METHOD PATH" of every request that is not a completion
        self.in_flight = 0
        self.peak = 0
        self._gate: asyncio.Event | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return  # the client closed its connection
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name:
                        headers[name.strip().lower()] = value.strip()
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                await self._route(method, path, headers, raw, writer)
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    return
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _route(self, method: str, path: str, headers: dict[str, str], raw: bytes,
                     writer: asyncio.StreamWriter) -> None:  # fmt: skip
        if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            await self._complete(path, headers, json.loads(raw), writer)
            return
        self.other.append(f"{method} {path}")
        self.log.append(f"{method} {path}")
        if path in self.hang:
            await asyncio.Event().wait()  # never answers (until the server stops)
        if path == "/flush_cache" and method == "POST":
            _plain(writer, self.flush_status, b"flushed")
        elif path == "/server_info" and method == "GET" and self.server_info is not None:
            _plain(writer, 200, json.dumps(self.server_info).encode())
        else:
            _plain(writer, 404, b'{"detail":"Not Found"}')

    async def _complete(self, path: str, headers: dict[str, str], body: dict[str, Any],
                        writer: asyncio.StreamWriter) -> None:  # fmt: skip
        number = len(self.requests)
        self.requests.append(Seen(path, body, headers))
        if number in self.status:
            code, text = self.status[number]
            _plain(writer, code, text)
            return
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.log.append(f"start {number}")
        if self.hold_until:
            if self._gate is None:
                self._gate = asyncio.Event()
            if self.in_flight >= self.hold_until:
                self._gate.set()
            try:  # hold_s: at most that long (a limit the client must never reach)
                await asyncio.wait_for(self._gate.wait(), self.hold_s or None)
            except asyncio.TimeoutError:
                self._gate.set()
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")  # fmt: skip
        chat = path.endswith("/chat/completions")
        tokens = int(body.get("max_tokens") or 16)
        for i in range(tokens):
            piece = {"delta": {"content": " tok"}} if chat else {"text": " tok"}
            event: dict[str, Any] = {"id": f"cmpl-{number}", "choices": [{"index": 0, **piece}]}
            if i == tokens - 1:
                event["choices"][0]["finish_reason"] = "length"
                event["usage"] = {"prompt_tokens": len(str(body.get("prompt", "")).split()),
                                  "completion_tokens": tokens}  # fmt: skip
                if self.spec_verify_ct is not None:
                    event["meta_info"] = {"spec_verify_ct": self.spec_verify_ct}
            _chunk(writer, b"data: " + json.dumps(event).encode() + b"\n\n")
            await writer.drain()
        self.in_flight -= 1  # before the client can see the end (the order is exact)
        self.log.append(f"end {number}")
        _chunk(writer, b"data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")


def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")


def _plain(writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
    writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
                 f"content-length: {len(body)}\r\n\r\n".encode() + body)  # fmt: skip
