"""A real loopback TCP server that answers every connection with scripted raw bytes.

It stands for an HTTP server misbehaving at the byte level (responses split at awkward
places, a stream cut mid-body, a server that accepts and never answers), which a real
LLM server only does under faults that are hard to trigger on demand.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence


class ScriptedHttpServer:
    """``with ScriptedHttpServer(pieces, hang=False) as srv:`` then connect to ``srv.url``.

    For each connection: read the request head, then send each piece of ``pieces`` in a
    separate write (drained, with a short pause so each arrives in its own read), then
    close the connection, or keep it open silently when ``hang`` is True.
    """

    def __init__(self, pieces: Sequence[bytes], hang: bool = False) -> None:
        self.pieces = list(pieces)
        self.hang = hang
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ScriptedHttpServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        self._ready.set()
        self._loop.run_forever()
        server.close()
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

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
