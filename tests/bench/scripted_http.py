"""A real loopback TCP server that answers every connection with scripted raw bytes.

It stands for an HTTP server misbehaving at the byte level (responses split at awkward
places, a stream cut mid-body, a server that accepts and never answers), which a real
LLM server only does under faults that are hard to trigger on demand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tests.bench.loopback_server import LoopbackAsyncServer


class ScriptedHttpServer(LoopbackAsyncServer):
    """``with ScriptedHttpServer(pieces, hang=False) as srv:`` then connect to ``srv.url``.

    For each connection: read the request head, then send each piece of ``pieces`` in a
    separate write (drained, with a short pause so each arrives in its own read), then
    close the connection, or keep it open silently when ``hang`` is True.
    """

    def __init__(self, pieces: Sequence[bytes], hang: bool = False) -> None:
        super().__init__()
        self.pieces = list(pieces)
        self.hang = hang

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            for piece in self.pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.002)
            if self.hang:
                await asyncio.sleep(3600)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
