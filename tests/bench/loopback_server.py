"""LoopbackAsyncServer: an asyncio TCP server on 127.0.0.1 running in its own thread.

The shared plumbing of the bench tests' real loopback servers (the counting proxy, the
scripted byte-level HTTP server): a subclass only writes ``_handle(reader, writer)``.
"""

from __future__ import annotations

import asyncio
import threading


class LoopbackAsyncServer:
    """``with Subclass(...) as srv:`` serves on a free port; ``srv.url`` is its address."""

    def __init__(self) -> None:
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def base_url(self) -> str:
        """Return the server's URL (``http://127.0.0.1:PORT``)."""
        return self.url

    def __enter__(self):  # type: ignore[no-untyped-def]
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

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
