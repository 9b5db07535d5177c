"""gpudoctor/bench/load/sse_transport.py: what a request leaves behind on the client's event
loop, against real loopback asyncio servers. A cell sends thousands of requests on one
loop: each must give back its connection and its watchdog timer when it ends, however it
ends (answered, failed, cancelled by the cell)."""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import time

import pytest

from gpudoctor.bench.load import sse_transport
from gpudoctor.bench.load.sse_transport import (
    Deadline,
    HttpResult,
    TransportFailure,
    _SseProtocol,
    _watch,
    stream_post,
)

OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"


class RecordingLoop(asyncio.SelectorEventLoop):
    """A real event loop that also keeps each request watchdog timer it schedules."""

    def __init__(self) -> None:
        super().__init__()
        self.watchdogs: list[asyncio.TimerHandle] = []
        self.delays: list[float] = []  # seconds ahead each watchdog was armed for

        self.timers: list[float] = []  # seconds ahead of every timer, in order
        self.callbacks: list[object] = []  # the callback of each of them

    def call_at(self, when, callback, *args, context=None):  # type: ignore[no-untyped-def]
        handle = super().call_at(when, callback, *args, context=context)
        self.timers.append(when - self.time())
        self.callbacks.append(callback)
        if callback is sse_transport._watch:
            self.watchdogs.append(handle)
            self.delays.append(when - self.time())
        return handle


class Server:
    """A loopback server that reads the request, writes ``answer``, then either closes or
    holds the connection; ``closed_by_client`` is set when the client closes its side."""

    def __init__(self, answer: bytes, hold: bool, half_close: bool = False) -> None:
        self.answer, self.hold, self.half_close = answer, hold, half_close
        self.closed_by_client = asyncio.Event()
        self.heads: list[bytes] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(self.answer)
        await writer.drain()
        if self.half_close:
            writer.write_eof()  # done sending, still reading (as a proxy may do)
        if self.hold:
            while await reader.read(65536):
                pass  # the request body, then nothing until the client closes
            self.closed_by_client.set()
        writer.close()

    async def start(self, host: str = "127.0.0.1") -> tuple[asyncio.Server, str]:
        server = await asyncio.start_server(self.handle, host, 0)
        return server, f"http://{host}:{server.sockets[0].getsockname()[1]}/v1/completions"


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
    assert _unstamped(outcome) in (HttpResult(200, ""), HttpResult(503, "busy"), "disconnect")
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


# ---------------------------------------------------------------------------- the watchdog


@pytest.mark.parametrize("deadline_in", [None, 0.2])
def test_the_watchdog_is_armed_for_the_nearer_of_the_read_limit_and_the_deadline(deadline_in):
    async def main(loop: RecordingLoop):
        server, url = await Server(OK_HEAD + b"data: 1\n\n", hold=False).start()
        async with server:
            began = time.perf_counter()
            deadline = Deadline(began + deadline_in, "deadline") if deadline_in else None
            await stream_post(url, {}, lambda p, t: None, 1000.0, deadline)
        return began

    _, loop = run(main)
    first = loop.delays[0]
    if deadline_in is None:
        assert 900 < first <= 1000.0  # the read limit (the request took far less than 100 s)
    else:
        assert 0 < first <= deadline_in  # the deadline, not the read limit


def watched(idle_s: float, timeout_s: float, deadline: Deadline) -> tuple[_SseProtocol, float]:
    """Return a protocol whose last byte came ``idle_s`` ago after one watchdog check,
    and how far ahead the next check was armed (0 when none was)."""

    async def main(loop: RecordingLoop):
        protocol = _SseProtocol(b"", lambda p, t: None, loop.create_future())
        protocol.last_read = time.perf_counter() - idle_s
        _watch(protocol, timeout_s, deadline)
        return protocol, (protocol.watchdog.when() - loop.time() if protocol.watchdog else 0.0)

    return run(main)[0]


def test_a_watchdog_check_fails_a_request_silent_for_its_read_limit():
    protocol, _ = watched(10.0, 5.0, Deadline(time.perf_counter() + 1000.0))
    error = protocol.done.exception()
    assert (error.kind, str(error)) == ("timeout", "no data for 5 s")


def test_a_watchdog_check_of_an_active_request_looks_again_when_it_could_expire():
    protocol, ahead = watched(100.0, 1000.0, Deadline(time.perf_counter() + 5000.0))
    assert not protocol.done.done() and 800 < ahead <= 900.0  # when it would be 1000 s idle
    protocol, ahead = watched(0.0, 1000.0, Deadline(time.perf_counter() + 50.0))
    assert not protocol.done.done() and 0 < ahead <= 50.0  # the deadline comes first


@pytest.mark.parametrize(("message", "said"), [("", "deadline passed"), ("cell over", "cell over")])
def test_a_watchdog_check_past_the_deadline_fails_with_its_kind(message, said):
    protocol, ahead = watched(0.0, 1000.0, Deadline(time.perf_counter() - 1.0, "deadline", message))
    error = protocol.done.exception()
    assert (error.kind, str(error), ahead) == ("deadline", said, 0.0)


def test_a_server_that_never_sends_a_byte_times_out():
    async def main(loop: RecordingLoop):
        served = Server(b"", hold=True)  # reads the request, answers nothing
        server, url = await served.start()
        async with server:
            with pytest.raises(TransportFailure) as info:
                await asyncio.wait_for(stream_post(url, {}, lambda p, t: None, 0.2), 30.0)
        return info.value

    error, _ = run(main)
    assert (error.kind, str(error)) == ("timeout", "no data for 0.2 s")


def test_a_request_that_goes_silent_after_a_byte_fails_at_the_next_check():
    async def main(loop: RecordingLoop):
        protocol = _SseProtocol(b"", lambda p, t: None, loop.create_future())
        protocol.last_read = time.perf_counter()  # a byte just came: the first check re-arms
        _watch(protocol, 0.05, Deadline(time.perf_counter() + 1000.0))
        await asyncio.wait([protocol.done], timeout=10.0)
        return protocol.done.exception() if protocol.done.done() else None

    error, _ = run(main)
    assert (error.kind, str(error)) == ("timeout", "no data for 0.05 s")


# ---------------------------------------------------------------------------- where and how


@pytest.mark.parametrize(
    ("timeout_s", "deadline_in", "low", "high"),
    [(100.0, None, 29.0, 30.0), (0.5, None, 0.0, 0.5), (100.0, 0.3, 0.0, 0.3)],
)
def test_connecting_may_take_the_least_of_the_read_limit_30_s_and_the_deadline(
    timeout_s, deadline_in, low, high
):
    async def main(loop: RecordingLoop):
        server, url = await Server(OK_HEAD + b"data: 1\n\n", hold=False).start()
        async with server:
            deadline = Deadline(time.perf_counter() + deadline_in) if deadline_in else None
            loop.timers.clear()
            await stream_post(url, {}, lambda p, t: None, timeout_s, deadline)

    _, loop = run(main)
    assert low < loop.timers[0] <= high  # the first timer: the connect's limit


def test_the_request_goes_to_the_host_and_path_of_the_url():
    async def main(loop: RecordingLoop):
        served = Server(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\ndata: 1\n\n", hold=False)
        server, url = await served.start("127.0.0.2")  # loopback, but not 127.0.0.1
        async with server:
            result = await stream_post(url, {}, lambda p, t: None, 30.0)
        return result, served.heads

    (result, heads), _ = run(main)
    assert _unstamped(result) == HttpResult(200, "")
    assert heads[0].startswith(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.2:")


def test_a_url_without_a_host_goes_to_loopback():
    async def main(loop: RecordingLoop):
        server, url = await Server(b"HTTP/1.1 204 x\r\nContent-Length: 0\r\n\r\n", False).start()
        async with server:
            return await stream_post(url.replace("127.0.0.1", ""), {}, lambda p, t: None, 30.0)

    result, _ = run(main)
    assert _unstamped(result) == HttpResult(204, "")


@pytest.mark.parametrize(
    ("url", "port"), [("http://127.0.0.2/x", 80), ("https://127.0.0.2/x", 443)]
)
def test_a_url_without_a_port_goes_to_its_schemes_port(url, port):
    async def main(loop: RecordingLoop):
        with pytest.raises(TransportFailure) as info:
            await stream_post(url, {}, lambda p, t: None, 5.0)  # nothing listens there
        return info.value

    error, _ = run(main)
    assert error.kind == "connect" and str(error).startswith(
        f"cannot connect to 127.0.0.2:{port}: "
    )


def test_an_https_url_speaks_tls():
    async def main(loop: RecordingLoop):
        first: list[bytes] = []

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            first.append(await reader.read(1))  # a TLS ClientHello starts with 0x16
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        async with server:
            port = server.sockets[0].getsockname()[1]
            with pytest.raises(TransportFailure) as info:
                await stream_post(f"https://127.0.0.1:{port}/x", {}, lambda p, t: None, 5.0)
        return first, info.value

    (first, error), _ = run(main)
    assert first == [b"\x16"] and error.kind == "connect"  # the handshake found no TLS server
    assert isinstance(error.__cause__, (ssl.SSLError, ConnectionError))


def test_a_response_cut_by_a_half_close_is_a_disconnect_at_once():
    async def main(loop: RecordingLoop):
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\ndata: 1\n"
        served = Server(answer, hold=True, half_close=True)
        server, url = await served.start()
        async with server:
            with pytest.raises(TransportFailure) as info:
                await stream_post(url, {}, lambda p, t: None, 30.0)
        return info.value

    error, _ = run(main)
    assert error.kind == "disconnect"  # not a wait for the read limit on a dead response


def test_the_callers_caps_apply_over_tcp():
    async def main(loop: RecordingLoop):
        answer = b"HTTP/1.1 500 x\r\nContent-Length: 10\r\n\r\n0123456789"
        server, url = await Server(answer, hold=False).start()
        async with server:
            caps = sse_transport.StreamCaps(error_body_bytes=4)
            return await stream_post(url, {}, lambda p, t: None, 30.0, caps=caps)

    result, _ = run(main)
    assert _unstamped(result) == HttpResult(500, "0123")


def _unstamped(result: object) -> object:
    """Return ``result`` without its write stamp (a time: checked in test_sse_transport_parsing)."""
    return (
        dataclasses.replace(result, written_at=None) if isinstance(result, HttpResult) else result
    )
