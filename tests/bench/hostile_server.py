"""A real loopback HTTP server that never finishes its answer: a hostile or broken
inference server (a compromised container's port, a wedged proxy, a buggy build).

Modes (each endless, until the client goes away):

- ``header``: ``HTTP/1.1 200 OK`` and then one header line that never ends;
- ``line``: a 200 head, then one ``data:`` line that never ends (body read to EOF);
- ``events``: a 200 head, then valid SSE events forever: ``content`` ones (one token
  each) or ``empty`` ones (valid chunks with empty text, as a keep-alive).

``pace_s`` = 0 floods (64 KiB writes as fast as the socket drains); > 0 trickles one
small piece every ``pace_s`` seconds, so no idle timeout ever fires.
"""

from __future__ import annotations

import asyncio
import json

from tests.bench.loopback_server import LoopbackAsyncServer

HEAD_200 = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"


class HostileServer(LoopbackAsyncServer):
    """``with HostileServer("line", pace_s=0) as srv:`` then send requests to ``srv.url``."""

    def __init__(self, mode: str, pace_s: float = 0.0, content: bool = True) -> None:
        super().__init__()
        assert mode in ("header", "line", "events")
        self.mode, self.pace_s, self.content = mode, pace_s, content
        self.bytes_sent = 0

    def _pieces(self) -> tuple[bytes, bytes]:
        """Return (what to send first, the piece repeated forever)."""
        if self.mode == "header":
            return b"HTTP/1.1 200 OK\r\nX-Endless: ", b"a"
        if self.mode == "line":
            return HEAD_200 + b"data: ", b"a"
        event = {"choices": [{"index": 0, "text": "x" if self.content else ""}]}
        return HEAD_200, b"data: " + json.dumps(event).encode() + b"\n\n"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first, piece = self._pieces()
        block = piece * max(1, (64 * 1024) // len(piece)) if self.pace_s == 0 else piece
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(first)
            while True:
                writer.write(block)
                self.bytes_sent += len(block)
                await writer.drain()
                await asyncio.sleep(self.pace_s)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
