"""gpudoctor/bench/load/sse_transport.py: the streaming POST's response parser fed the
bytes a server sends, split at every place a TCP read may split them (the same events
whatever the split), each cap and malformed response failing that request with its kind,
and stream_post against a real loopback asyncio server."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import pytest

from gpudoctor.bench.load.sse_transport import (
    DEFAULT_CAPS,
    Deadline,
    HttpResult,
    StreamCaps,
    TransportFailure,
    _SseProtocol,
    stream_post,
)

# a guard: a framing loop that never ends (a mutant, a bug) fails in a minute, not at the
# whole run's timeout; each test here takes milliseconds
pytestmark = pytest.mark.timeout(60)

SSE = b'data: {"t":1}\n\n: keep-alive\nevent: x\ndata:{"t":2}\r\n\ndata: [DONE]\n\n'
EVENTS = [b'{"t":1}', b'{"t":2}', b"[DONE]"]


class Transport(asyncio.Transport):
    """Records what the protocol writes and whether it closed the connection."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True


class Fed:
    """A protocol fed ``pieces`` one data_received each; ``events``, ``result`` or
    ``error``, and the transport."""

    def __init__(self, pieces: list[bytes], caps: StreamCaps = DEFAULT_CAPS, end: str = "",
                 on_event=None) -> None:  # fmt: skip
        self.loop = asyncio.new_event_loop()
        self.events: list[bytes] = []
        self.times: list[float] = []
        done = self.loop.create_future()
        self.protocol = _SseProtocol(b"REQUEST", on_event or self.record, done, caps)
        self.transport = Transport()
        self.protocol.connection_made(self.transport)
        for piece in pieces:
            self.protocol.data_received(piece)
        if end == "eof":
            self.protocol.eof_received()
        elif end == "lost":
            self.protocol.connection_lost(None)
        self.done = done
        self.loop.close()

    def record(self, payload: bytes, at: float) -> None:
        self.events.append(payload)
        self.times.append(at)

    @property
    def result(self) -> HttpResult | None:
        return self.done.result() if self.done.done() and not self.done.exception() else None

    @property
    def error(self) -> BaseException | None:
        return self.done.exception() if self.done.done() else None


def head(status: str = "200 OK", *headers: str) -> bytes:
    return ("HTTP/1.1 " + status + "\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode()


def chunked(body: bytes, size: int = 7) -> bytes:
    out = b""
    for i in range(0, len(body), size):
        piece = body[i : i + size]
        out += f"{len(piece):x};ext=1\r\n".encode() + piece + b"\r\n"
    return out + b"0\r\n\r\n"


def splits(data: bytes) -> list[list[bytes]]:
    """Every way of cutting ``data`` in two, and byte by byte."""
    return [[data[:k], data[k:]] for k in range(1, len(data))] + [[bytes([b]) for b in data]]


# ---------------------------------------------------------------------------- bodies


def test_the_request_is_written_when_the_connection_opens():
    fed = Fed([])
    assert fed.transport.written == b"REQUEST" and not fed.done.done()


def test_a_body_of_a_given_length_gives_every_data_line_whatever_the_reads():
    response = head("200 OK", f"Content-Length: {len(SSE)}") + SSE + b"data: past the length\n"
    for pieces in splits(response):
        fed = Fed(pieces)
        assert fed.events == EVENTS and fed.result == HttpResult(200, "")
    assert fed.transport.closed


def test_chunk_extensions_are_ignored():
    response = (
        head("200 OK", "Transfer-Encoding: chunked") + b"9;a=1;b=2\r\ndata: ok\n\r\n0\r\n\r\n"
    )
    before = time.perf_counter()
    fed = Fed([response])
    assert fed.events == [b"ok"] and fed.result == HttpResult(200, "")
    assert all(before <= t <= time.perf_counter() for t in fed.times)


def test_a_chunked_body_gives_every_data_line_whatever_the_reads():
    response = head("200 OK", "transfer-encoding: Chunked") + chunked(SSE)
    for pieces in splits(response):
        fed = Fed(pieces)
        assert fed.events == EVENTS and fed.result == HttpResult(200, "")


def test_a_chunk_larger_than_a_read_is_decoded_as_it_arrives():
    body = b"data: " + b"x" * 5000 + b"\n\ndata: y\n\n"
    response = head("200 OK", "Transfer-Encoding: chunked") + chunked(body, size=len(body))
    before = time.perf_counter()
    fed = Fed([response[k : k + 100] for k in range(0, len(response), 100)])
    assert fed.events == [b"x" * 5000, b"y"] and fed.result == HttpResult(200, "")
    assert all(before <= t <= time.perf_counter() for t in fed.times)  # when each arrived


def test_a_body_ended_by_the_connection_gives_its_last_unterminated_line():
    before = time.perf_counter()
    fed = Fed([head("200 OK"), b"data: a\n\ndata:b"], end="eof")  # "data:" needs no space
    assert fed.events == [b"a", b"b"] and fed.result == HttpResult(200, "")
    assert all(before <= t <= time.perf_counter() for t in fed.times)
    chunk_end = Fed([head("200 OK", "Transfer-Encoding: chunked"), chunked(b"data: z")])
    assert chunk_end.events == [b"z"]


def test_eof_ends_only_a_body_without_length_or_chunks():
    fed = Fed([head("200 OK", "Content-Length: 100"), b"data: a\n"], end="eof")
    assert not fed.done.done()
    fed = Fed([head("200 OK", "Transfer-Encoding: chunked"), b"5\r\n"], end="eof")
    assert not fed.done.done()
    assert not Fed([], end="eof").done.done()  # nothing received yet


def test_a_body_of_length_zero_ends_with_the_head():
    fed = Fed([head("204 No Content", "Content-Length:  0 ")])
    assert fed.result == HttpResult(204, "") and fed.transport.closed


def test_bytes_after_the_end_are_ignored():
    response = head("200 OK", "Content-Length: 9") + b"data: a\n\n"
    fed = Fed([response, b"data: more\n"])
    assert fed.events == [b"a"]


# ---------------------------------------------------------------------------- errors


def test_an_error_status_gives_its_body():
    fed = Fed([head("500 Internal Server Error", "Content-Length: 4"), b"bo", b"om"])
    assert fed.result == HttpResult(500, "boom") and fed.events == []


def test_an_error_body_that_is_not_utf8_is_kept_readable():
    fed = Fed([head("502 Bad Gateway", "Content-Length: 5"), b"a\xffb\xfe!"])
    assert fed.result == HttpResult(502, "a\ufffdb\ufffd!")
    capped = Fed([head("502 x"), b"a\xffbcdef"], StreamCaps(error_body_bytes=3))
    assert capped.result == HttpResult(502, "a\ufffdb")


def test_an_error_body_is_read_only_up_to_its_cap():
    caps = StreamCaps(error_body_bytes=10)
    fed = Fed([head("429 Too Many"), b"0123456", b"789abc", b"never read"], caps)
    assert fed.result == HttpResult(429, "0123456789")
    exact = Fed([head("503 x"), b"0123456789"], caps)
    assert exact.result == HttpResult(503, "0123456789")  # the cap reached: stop reading
    under = Fed([head("503 x"), b"012345678"], caps)
    assert not under.done.done()


@pytest.mark.parametrize("status_line", [b"HTTP/1.1\r\n\r\n", b"HTTP/1.1 OK fine\r\n\r\n"])
def test_a_bad_status_line_is_a_disconnect(status_line):
    fed = Fed([status_line + b"data: x\n"])
    assert isinstance(fed.error, TransportFailure) and fed.error.kind == "disconnect"
    first_line = status_line.split(b"\r\n")[0]
    assert str(fed.error) == f"bad status line {first_line!r}"
    assert fed.events == []


def test_a_status_line_not_split_by_single_spaces_is_refused():
    fed = Fed([b"HTTP/1.1\t200\tOK\r\n\r\ndata: x\n"])
    assert fed.error.kind == "disconnect" and fed.events == []


def test_only_the_framing_headers_decide_the_framing():
    note = Fed([head("200 OK", "X-Note: chunked", "Content-Length: 9"), b"data: a\n\n"])
    assert note.events == [b"a"] and note.result == HttpResult(200, "")  # not chunked
    identity = Fed([head("200 OK", "Transfer-Encoding: identity"), b"data: a\n"], end="eof")
    assert identity.events == [b"a"] and identity.result == HttpResult(200, "")
    bad = Fed([head("200 OK", "Content-Length: 1:0"), b"data: a\n"])
    assert isinstance(bad.error, ValueError)  # a malformed length fails, never guessed


def test_a_long_bad_status_line_is_quoted_cut_to_80_bytes():
    line = b"<html>" + b"x" * 200
    fed = Fed([line + b"\r\n\r\n"])
    assert fed.error.kind == "disconnect" and str(fed.error) == f"bad status line {line[:80]!r}"


def test_a_response_that_starts_with_a_blank_line_fails_at_once():
    fed = Fed([b"\r\n\r\nHTTP/1.1 200 OK\r\n\r\ndata: x\n"])
    assert fed.error.kind == "disconnect" and str(fed.error) == "bad status line b''"
    assert fed.events == [] and fed.transport.closed


def test_a_head_over_its_cap_is_oversize():
    caps = StreamCaps(head_bytes=40)
    fed = Fed([b"HTTP/1.1 200 OK\r\n" + b"X-A: " + b"a" * 40], caps)
    assert fed.error.kind == "oversize" and str(fed.error) == "response head over 40 bytes"
    whole = Fed([head("200 OK", "X-A: " + "a" * 40)], caps)
    assert whole.error.kind == "oversize" and str(whole.error) == "response head over 40 bytes"
    at_cap = head("200 OK", "X-A: " + "a" * 18)
    assert len(at_cap) - 4 == 40
    assert Fed([at_cap], caps).error is None  # a head of exactly the cap is read
    almost = at_cap[:-4] + b"x"  # 41 bytes without its end yet
    assert Fed([almost[:40]], caps).error is None
    assert Fed([almost], caps).error.kind == "oversize"


def test_an_sse_line_over_its_cap_is_oversize():
    caps = StreamCaps(line_bytes=10)
    pending = Fed([head("200 OK"), b"data: 0123456789"], caps)  # no newline yet
    assert pending.error.kind == "oversize" and str(pending.error) == "an SSE line over 10 bytes"
    whole = Fed([head("200 OK"), b"data: 012345\n"], caps)
    assert whole.error.kind == "oversize" and str(whole.error) == "an SSE line over 10 bytes"
    fits = Fed([head("200 OK"), b"data: 0123\n", b"data: 9"], caps)  # 10 bytes each
    assert fits.error is None and fits.events == [b"0123"]
    at_cap = Fed([head("200 OK"), b"data: 6789", b"\n"], caps)  # 10 bytes pending, then ended
    assert at_cap.error is None and at_cap.events == [b"6789"]


def test_a_chunk_size_line_over_its_cap_is_oversize():
    caps = StreamCaps(chunk_size_line=8)
    fed = Fed([head("200 OK", "Transfer-Encoding: chunked"), b"000000005"], caps)
    assert fed.error.kind == "oversize" and str(fed.error) == "chunk-size line over the cap"
    ok = Fed([head("200 OK", "Transfer-Encoding: chunked"), b"00000005", b"\r\ndata:\r\n"], caps)
    assert ok.error is None
    after_a_chunk = [head("200 OK", "Transfer-Encoding: chunked"), b"8\r\ndata: a\n\r\n0000",
                     b"0003\r\nb\n\n\r\n"]  # fmt: skip
    assert Fed(after_a_chunk, caps).error is None  # the cap counts the size line only


def test_a_chunk_size_that_is_not_hex_fails_the_request():
    fed = Fed([head("200 OK", "Transfer-Encoding: chunked"), b"zz\r\n"])
    assert isinstance(fed.error, ValueError)
    assert fed.transport.closed
    empty = Fed([head("200 OK", "Transfer-Encoding: chunked") + b"\r\n5\r\ndata:\r\n"])
    assert isinstance(empty.error, ValueError)  # an empty size line: at once, not at the cap


def test_an_event_handler_can_end_the_request():
    def stop(payload: bytes, at: float) -> None:
        if payload == b"2":
            raise TransportFailure("oversize", "too many tokens")

    fed = Fed([head("200 OK"), b"data: 1\ndata: 2\ndata: 3\n"], on_event=stop)
    assert fed.error.kind == "oversize" and str(fed.error) == "too many tokens"


def test_a_connection_lost_mid_response_is_a_disconnect_saying_why():
    fed = Fed([head("200 OK"), b"data: 1\n"], end="lost")
    assert fed.error.kind == "disconnect"
    assert str(fed.error) == "server closed the connection before the response ended"
    protocol = Fed([head("200 OK")]).protocol
    protocol.connection_lost(ConnectionResetError("reset by peer"))
    assert str(protocol.done.exception()) == (
        "ConnectionResetError: reset by peer before the response ended"
    )
    finished = Fed([head("200 OK", "Content-Length: 2"), b"ok"])
    finished.protocol.connection_lost(None)  # after the end: the result stands
    assert finished.result == HttpResult(200, "")


# ---------------------------------------------------------------------------- over TCP


async def serve(answer: list[bytes], close: bool = True):
    """Start a loopback server that records the request and writes ``answer``."""
    got: dict[str, bytes] = {}
    sent = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head_bytes = await reader.readuntil(b"\r\n\r\n")
        length = int(head_bytes.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        got["head"], got["body"] = head_bytes, await reader.readexactly(length)
        for piece in answer:
            writer.write(piece)
            await writer.drain()
        sent.set()
        if close:
            writer.close()
        else:
            await reader.read()  # hold the connection until the client closes it

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], got, sent


def test_stream_post_sends_one_post_and_streams_the_events():
    async def main():
        response = head("200 OK", "Transfer-Encoding: chunked") + chunked(SSE)
        server, port, got, _ = await serve([response[:20], response[20:]])
        events: list[bytes] = []
        async with server:
            before = time.perf_counter()
            result = await stream_post(f"http://127.0.0.1:{port}/v1/completions?x=1",
                                       {"model": "m", "stream": True},
                                       lambda p, t: events.append((p, t)), 30.0)  # fmt: skip
        return result, events, got, before

    result, events, got, before = asyncio.run(main())
    assert dataclasses.replace(result, written_at=None) == HttpResult(200, "")
    assert [p for p, _ in events] == EVENTS
    # the request's bytes were written after the call began, before its first event came
    assert result.written_at is not None and before < result.written_at <= events[0][1]
    lines = got["head"].decode().split("\r\n")
    assert lines[0] == "POST /v1/completions?x=1 HTTP/1.1"
    assert set(lines[1:6]) == {
        f"Host: 127.0.0.1:{lines[1].rsplit(':', 1)[1]}",
        "Content-Type: application/json",
        "Accept: text/event-stream",
        f"Content-Length: {len(got['body'])}",
        "Connection: close",
    }
    assert json.loads(got["body"]) == {"model": "m", "stream": True}


def test_a_server_that_is_not_there_is_a_connect_failure():
    async def main():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(TransportFailure) as info:
            await stream_post(f"http://127.0.0.1:{port}/x", {}, lambda p, t: None, 5.0)
        return port, info.value

    port, error = asyncio.run(main())
    assert error.kind == "connect" and str(error).startswith(
        f"cannot connect to 127.0.0.1:{port}: "
    )


def test_a_deadline_already_passed_sends_nothing():
    async def main():
        server, port, got, _ = await serve([])
        async with server:
            with pytest.raises(TransportFailure) as first:
                await stream_post(f"http://127.0.0.1:{port}/x", {}, lambda p, t: None, 5.0,
                                  Deadline(0.0, "deadline", "the cell's deadline passed"))  # fmt: skip
            with pytest.raises(TransportFailure) as second:
                await stream_post(f"http://127.0.0.1:{port}/x", {}, lambda p, t: None, 5.0,
                                  Deadline(0.0))  # fmt: skip
        return first.value, second.value, got

    first, second, got = asyncio.run(main())
    assert (first.kind, str(first)) == ("deadline", "the cell's deadline passed")
    assert (second.kind, str(second)) == ("timeout", "deadline passed before sending")
    assert got == {}


def test_a_server_that_goes_silent_times_out_and_a_deadline_ends_a_slow_stream():
    async def main():
        server, port, _, sent = await serve([head("200 OK"), b"data: 1\n"], close=False)
        events: list[bytes] = []
        async with server:
            with pytest.raises(TransportFailure) as idle:
                await stream_post(
                    f"http://127.0.0.1:{port}/x", {}, lambda p, t: events.append(p), 0.2
                )
            assert sent.is_set()
            deadline = Deadline(time.perf_counter() + 0.2, "deadline")
            with pytest.raises(TransportFailure) as cell:
                await stream_post(f"http://127.0.0.1:{port}/x", {}, lambda p, t: None, 30.0,
                                  deadline)  # fmt: skip
        return idle.value, cell.value, events

    idle, cell, events = asyncio.run(main())
    assert (idle.kind, str(idle)) == ("timeout", "no data for 0.2 s") and events == [b"1"]
    assert (cell.kind, str(cell)) == ("deadline", "deadline passed")
