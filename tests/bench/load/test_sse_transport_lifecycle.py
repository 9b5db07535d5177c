"""gpudoctor/bench/load/sse_transport.py: what a request leaves behind on the client's event
loop, against real loopback asyncio servers. A cell sends thousands of requests on one
loop: each must give back its connection and its watchdog timer when it ends, however it
ends (answered, failed, cancelled by the cell)."""

from __future__ import annotations

import asyncio

import pytest

from gpudoctor.bench.load import sse_transport
from gpudoctor.bench.load.sse_transport import HttpResult, TransportFailure, stream_post

OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"


class RecordingLoop(asyncio.SelectorEventLoop):
    """A real event loop that also keeps each request watchdog timer it schedules."""

    def __init__(self) -> None:
        super().__init__()
        self.watchdogs: list[asyncio.TimerHandle] = []

    def call_later(self, delay, callback, *args, context=None):  # type: ignore[no-untyped-def]
        handle = super().call_later(delay, callback, *args, context=context)
        if callback is sse_transport._watch:
            self.watchdogs.append(handle)
        return handle


class Server:
    """A loopback server that reads the request, writes ``answer``, then either closes or
    holds the connection; ``closed_by_client`` is set when the client closes its side."""

    def __init__(self, answer: bytes, hold: bool) -> None:
        self.answer, self.hold = answer, hold
        self.closed_by_client = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(self.answer)
        await writer.drain()
        if self.hold:
            while await reader.read(65536):
                pass  # the request body, then nothing until the client closes
            self.closed_by_client.set()
        writer.close()

    async def start(self) -> tuple[asyncio.Server, str]:
        server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions"


def run(main):  # type: ignore[no-untyped-def]
    """Run ``main(loop)`` on a fresh RecordingLoop; return its result and the loop."""
    with asyncio.Runner(loop_factory=RecordingLoop) as runner:
        loop = runner.get_loop()
        return runner.run(main(loop)), loop


@pytest.mark.parametrize(
    "answer",
    [
        OK_HEAD + b"data: 1\n\ndata: [DONE]\n\n",
        b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy",
        b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\ndata: cut",
    ],
    ids=["answered", "error-status", "disconnect"],
)
def test_a_finished_request_leaves_no_watchdog_timer(answer: bytes) -> None:
    async def main(loop: RecordingLoop):
        server, url = await Server(answer, hold=False).start()
        async with server:
            try:
                return await stream_post(url, {}, lambda p, t: None, 30.0)
            except TransportFailure as exc:
                return exc.kind

    outcome, loop = run(main)
    assert outcome in (HttpResult(200, ""), HttpResult(503, "busy"), "disconnect")
    assert loop.watchdogs and all(h.cancelled() for h in loop.watchdogs)


def test_a_request_cancelled_mid_stream_closes_its_connection_and_its_timer() -> None:
    async def main(loop: RecordingLoop):
        served = Server(OK_HEAD + b"data: 1\n\n", hold=True)
        server, url = await served.start()
        first = asyncio.Event()
        async with server:
            task = asyncio.create_task(stream_post(url, {}, lambda p, t: first.set(), 30.0))
            await first.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            closed = await asyncio.wait_for(served.closed_by_client.wait(), 10.0)
        return closed

    closed, loop = run(main)
    assert closed is True  # the server saw the client go: it stops generating
    assert loop.watchdogs and all(h.cancelled() for h in loop.watchdogs)
