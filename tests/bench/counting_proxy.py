"""A real TCP proxy on loopback that counts HTTP requests in flight between client and server.

Not a fake server: it forwards bytes unchanged to the real ``transformers serve`` and
watches them. A connection is busy from the first request byte until the server's
chunked response ends (``0\\r\\n\\r\\n``; SSE streams are chunked) or the connection
closes, so ``peak`` is the most requests the server had in flight at once, as seen on
the wire rather than by the client's own bookkeeping.
"""

from __future__ import annotations

import asyncio

from tests.bench.loopback_server import LoopbackAsyncServer

_END = b"0\r\n\r\n"


class CountingProxy(LoopbackAsyncServer):
    """``with CountingProxy(upstream_port) as proxy:`` then send to ``proxy.base_url``."""

    def __init__(self, upstream_port: int) -> None:
        super().__init__()
        self.upstream_port = upstream_port
        self.in_flight = 0
        self.peak = 0
        self.requests = 0

    def _begin(self) -> None:
        self.in_flight += 1
        self.requests += 1
        self.peak = max(self.peak, self.in_flight)

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        state = {"busy": False, "tail": b""}

        async def upstream() -> None:
            while data := await client_r.read(65536):
                if not state["busy"]:
                    state["busy"] = True
                    self._begin()
                server_w.write(data)
                await server_w.drain()
            server_w.close()

        async def downstream() -> None:
            while data := await server_r.read(65536):
                client_w.write(data)
                await client_w.drain()
                state["tail"] = (state["tail"] + data)[-len(_END) :]
                if state["busy"] and state["tail"] == _END:
                    state["busy"] = False
                    self.in_flight -= 1
            client_w.close()

        try:
            await asyncio.gather(upstream(), downstream())
        except (ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            if state["busy"]:
                self.in_flight -= 1
            for writer in (client_w, server_w):
                writer.close()
