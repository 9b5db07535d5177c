"""gpudoctor/bench/load/client.py against a real OpenAI-compatible server on loopback
(tests/bench/openai_loopback.py, in-process: fast): what each request sends, what its
record says, how each failure is recorded (never raised), and how ``run_requests`` paces
a cell: at most ``concurrency`` in flight on the wire, a conversation's turns in order,
seeded open-loop arrivals, the cell's deadline, both transports."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from gpudoctor.bench.load.arrivals import arrival_offsets
from gpudoctor.bench.load.client import (
    ClientOptions,
    make_client,
    not_sent,
    run_requests,
    send_request,
)
from gpudoctor.bench.load.sse_transport import StreamCaps
from gpudoctor.bench.load.workload import Prompt
from gpudoctor.bench.request_record import RequestRecord
from tests.bench.load.test_sse_transport_lifecycle import RecordingLoop
from tests.bench.openai_loopback import OpenAIServer
from tests.bench.scripted_http import ScriptedHttpServer

PROMPT = Prompt("hello there", prompt_len=2, output_len=3)
TRANSPORTS = ["fast", "httpx"]


def send(options: ClientOptions, prompt: Prompt = PROMPT, index: int = 0, t0: float = 0.0,
         cell_deadline: float | None = None) -> RequestRecord:  # fmt: skip
    async def go() -> RequestRecord:
        async with httpx.AsyncClient(timeout=30.0) as client:
            return await send_request(client, options, prompt, index, t0, cell_deadline)

    return asyncio.run(go())


def run(options: ClientOptions, prompts: list[Prompt], concurrency: int, client_size: int = 8,
        **kw) -> tuple[list[RequestRecord], float]:  # fmt: skip
    async def go() -> tuple[list[RequestRecord], float]:
        async with make_client(client_size, options.timeout_s) as client:
            return await run_requests(client, options, prompts, concurrency, **kw)

    return asyncio.run(go())


# ---------------------------------------------------------------------------- one request


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_completion_request_sends_its_body_and_records_the_stream(transport):
    with OpenAIServer() as srv:
        options = ClientOptions(srv.url + "/", "the-model", transport=transport, keep_text=True,
                                extra_body=(("top_k", 5), ("temperature", 0.5)))  # fmt: skip
        t0 = time.perf_counter()
        record = send(options, index=7, t0=t0)
        after = time.perf_counter() - t0
    [seen] = srv.requests
    assert seen.path == "/v1/completions"
    assert seen.body == {"model": "the-model", "max_tokens": 3, "prompt": "hello there",
                         "stream": True, "temperature": 0.5, "top_k": 5,
                         "stream_options": {"include_usage": True}}  # fmt: skip
    assert record.ok and record.error_kind is None and record.error is None
    assert (record.index, record.prompt_len, record.max_tokens) == (7, 2, 3)
    assert record.status_code == 200 and record.request_id == "cmpl-0"
    assert record.text_chunks == (" tok",) * 3 and record.chunk_tokens == (1, 1, 1)
    assert record.output_tokens == record.usage_completion_tokens == 3
    assert record.usage_prompt_tokens == 2 and record.finish_reason == "length"
    assert 0 < record.send_s < after and record.ttft_s == record.chunk_times_s[0]
    assert list(record.chunk_times_s) == sorted(record.chunk_times_s)
    assert record.chunk_times_s[-1] <= record.e2e_s <= record.wall_s  # [DONE] came last


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_chat_request_with_ignore_eos(transport):
    with OpenAIServer(spec_verify_ct=2) as srv:
        options = ClientOptions(srv.url, "m", api="chat", ignore_eos=True, transport=transport)
        record = send(options, Prompt("hi", 4, 2, chat=True))
    [seen] = srv.requests
    assert seen.path == "/v1/chat/completions"
    assert seen.body["messages"] == [{"role": "user", "content": "hi"}]
    assert seen.body["ignore_eos"] is True and seen.body["temperature"] == 0.0
    assert record.ok and len(record.chunk_times_s) == 2 and record.spec_verify_ct == 2
    assert record.text_chunks == ()  # keep_text off: times and counts only


def test_without_ignore_eos_the_field_is_not_sent():
    with OpenAIServer() as srv:
        send(ClientOptions(srv.url, "m"))
    assert "ignore_eos" not in srv.requests[0].body


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_error_status_is_recorded_with_its_body_on_one_line(transport):
    body = b'{"error":\n  {"message": "injected failure"}}'
    with OpenAIServer(status={0: (500, body)}) as srv:
        record = send(ClientOptions(srv.url, "m", transport=transport))
    assert not record.ok and record.status_code == 500 and record.error_kind == "http_5xx"
    assert record.error == 'HTTP 500: {"error": {"message": "injected failure"}}'
    assert record.ttft_s is None and record.e2e_s is None and record.chunk_times_s == ()
    assert record.output_tokens == 0 and record.wall_s > 0


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_error_body_that_is_not_utf8_is_kept_readable(transport):
    with OpenAIServer(status={0: (502, b"bad \xff gateway")}) as srv:
        record = send(ClientOptions(srv.url, "m", transport=transport))
    assert record.error == "HTTP 502: bad \ufffd gateway"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_error_body_is_kept_only_up_to_its_cap(transport):
    with OpenAIServer(status={0: (400, b"0123456789" * 10)}) as srv:
        caps = StreamCaps(error_body_bytes=25)
        record = send(ClientOptions(srv.url, "m", transport=transport, caps=caps))
    assert record.error == "HTTP 400: " + ("0123456789" * 3)[:25]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_error_body_sent_in_pieces_is_kept_whole_up_to_its_cap(transport):
    head = b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 40\r\n\r\n"
    pieces = [head, b"0123456789", b"abcdefghij", b"ABCDEFGHIJ", b"klmnopqrst"]
    with ScriptedHttpServer(pieces) as srv:
        whole = send(ClientOptions(srv.url, "m", transport=transport))
        capped = send(ClientOptions(srv.url, "m", transport=transport,
                                    caps=StreamCaps(error_body_bytes=25)))  # fmt: skip
    assert whole.error == "HTTP 500: 0123456789abcdefghijABCDEFGHIJklmnopqrst"
    assert capped.error == "HTTP 500: 0123456789abcdefghijABCDE"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_endless_error_body_is_read_only_up_to_its_cap(transport):
    head = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 100000\r\n\r\n"
    with ScriptedHttpServer([head + b"e" * 25], hang=True) as srv:  # the rest never comes
        caps = StreamCaps(error_body_bytes=25)
        record = send(ClientOptions(srv.url, "m", transport=transport, caps=caps, timeout_s=30))
    assert record.error_kind == "http_4xx" and record.error == "HTTP 400: " + "e" * 25


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_sse_line_over_its_cap_is_oversize(transport):
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
    line = b'data: {"choices": [{"text": "' + b"x" * 60 + b'", "finish_reason": "stop"}]}\n'
    with ScriptedHttpServer([head + line]) as srv:
        at_cap = ClientOptions(srv.url, "m", transport=transport,
                               caps=StreamCaps(line_bytes=len(line) - 1))  # fmt: skip
        over = ClientOptions(srv.url, "m", transport=transport,
                             caps=StreamCaps(line_bytes=len(line) - 2))  # fmt: skip
        kept, refused = send(at_cap), send(over)
    assert kept.ok and len(kept.chunk_times_s) == 1
    assert refused.error_kind == "oversize"
    assert refused.error == f"an SSE line over {len(line) - 2} bytes"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_last_line_without_newline_is_still_an_event(transport):
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
    events = b'data:{"choices": [{"text": "a"}]}\n\ndata:{"choices": [{"text": "b", "finish_reason": "stop"}]}'
    with ScriptedHttpServer([head + events]) as srv:  # no space after "data:" either
        record = send(ClientOptions(srv.url, "m", transport=transport))
    assert record.ok and len(record.chunk_times_s) == 2


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_malformed_event_is_other_and_says_so(transport):
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
    with ScriptedHttpServer([head + b"data: {broken\n\n"]) as srv:
        record = send(ClientOptions(srv.url, "m", transport=transport))
    assert record.error_kind == "other" and record.status_code is None
    assert record.error.startswith("bad stream event: JSONDecodeError: ")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_an_in_stream_error_about_the_context_is_context_overflow(transport):
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
    events = (b'data: {"error": {"message": "first:\\n the context length is 8"}}\n\n'
              b'data: {"error": "second"}\n\n')  # fmt: skip
    with ScriptedHttpServer([head + events]) as srv:
        record = send(ClientOptions(srv.url, "m", transport=transport))
    assert record.error_kind == "context_overflow" and record.status_code == 200
    assert record.error == "first: the context length is 8"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stream_without_tokens_is_empty(transport):
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
    with ScriptedHttpServer([head + b"data: [DONE]\n\n"]) as srv:
        record = send(ClientOptions(srv.url, "m", transport=transport))
    assert record.error_kind == "empty" and record.status_code == 200
    assert record.error == "the stream ended without any content token"
    assert record.e2e_s is not None and record.ttft_s is None


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_request_over_its_time_limit_is_a_timeout_saying_so(transport):
    with ScriptedHttpServer([], hang=True) as srv:
        record = send(ClientOptions(srv.url, "m", transport=transport, timeout_s=0.2))
    assert (record.error_kind, record.error) == ("timeout", "the request took over 0.2 s")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_cells_deadline_ends_a_request_before_its_own_limit(transport):
    with ScriptedHttpServer([], hang=True) as srv:
        options = ClientOptions(srv.url, "m", transport=transport, timeout_s=60.0)
        record = send(options, cell_deadline=time.perf_counter() + 0.2)
    assert (record.error_kind, record.error) == ("deadline", "the cell's deadline passed")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_cell_deadline_already_passed_sends_nothing(transport):
    with OpenAIServer() as srv:
        options = ClientOptions(srv.url, "m", transport=transport)
        record = send(options, cell_deadline=time.perf_counter() - 1.0)
    assert (record.error_kind, record.error) == ("deadline", "the cell's deadline passed")
    assert srv.requests == []


def test_the_httpx_transport_needs_a_client():
    options = ClientOptions("http://127.0.0.1:1", "m", transport="httpx")
    with pytest.raises(AssertionError, match=r"^the httpx transport needs an AsyncClient$"):
        asyncio.run(send_request(None, options, PROMPT, 0, 0.0))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_cell_deadline_later_than_the_request_limit_leaves_the_limit(transport):
    with ScriptedHttpServer([], hang=True) as srv:
        options = ClientOptions(srv.url, "m", transport=transport, timeout_s=0.2)
        record = send(options, cell_deadline=time.perf_counter() + 60.0)
    assert record.error_kind == "timeout"


def test_a_connection_refused_is_connect_on_one_line():
    from tests.bench.llm_server import free_port

    record = send(ClientOptions(f"http://127.0.0.1:{free_port()}", "m", transport="httpx"))
    assert record.error_kind == "connect" and record.error.startswith("ConnectError: ")
    assert "\n" not in record.error


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_servers_usage_is_compared_never_taken(transport):
    """Issue 45.1: output tokens were the server's ``usage``; they are what arrived (the
    content chunks here; the text's tokens when it is kept), and usage is kept beside."""
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
    events = (b'data: {"choices": [{"text": "ab"}]}\n\n'
              b'data: {"choices": [{"text": "cd", "finish_reason": "length"}], "usage": {"completion_tokens": 4}}\n\n')  # fmt: skip
    with ScriptedHttpServer([head + events]) as srv:
        record = send(ClientOptions(srv.url, "m", transport=transport))
    assert record.ok and record.output_tokens == 2 and record.usage_completion_tokens == 4
    assert len(record.chunk_times_s) == 2
    if transport == "fast":  # its bytes were written after the send began (issue 45.9)
        assert record.written_s is not None and record.send_s <= record.written_s
        assert record.written_s - record.send_s <= record.chunk_times_s[0]
    else:  # httpx does not say when it wrote
        assert record.written_s is None


def test_output_tokens_without_usage():
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
    two = b'data: {"choices": [{"text": "a"}]}\n\ndata: {"choices": [{"text": "b", "finish_reason": "stop"}]}\n\n'
    with ScriptedHttpServer([head + two]) as srv:
        forced = send(ClientOptions(srv.url, "m", ignore_eos=True))
        counted = send(ClientOptions(srv.url, "m"))
    assert forced.output_tokens == 2 and PROMPT.output_len == 3  # what arrived, not max_tokens
    assert counted.output_tokens == 2
    with ScriptedHttpServer([head + b"data: [DONE]\n\n"]) as srv:
        nothing = send(ClientOptions(srv.url, "m", ignore_eos=True))
    assert nothing.output_tokens == 0  # no token came: none is claimed


def test_a_request_not_sent_is_a_deadline_failure():
    t0 = time.perf_counter()
    record = not_sent(PROMPT, 4, t0)
    after = time.perf_counter() - t0
    assert (record.index, record.prompt_len, record.max_tokens) == (4, 2, 3)
    assert 0 <= record.send_s <= after and record.wall_s == 0.0 and not record.ok
    assert (record.error_kind, record.error) == ("deadline", "not sent: the cell's deadline passed")


# ---------------------------------------------------------------------------- a cell


def test_concurrency_below_one_is_refused():
    with pytest.raises(ValueError, match=r"^concurrency must be >= 1, got 0$"):
        run(ClientOptions("http://127.0.0.1:1", "m"), [PROMPT], 0)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_at_most_concurrency_requests_are_in_flight(transport):
    prompts = [Prompt(f"p{i}", 1, 2) for i in range(6)]
    with OpenAIServer(hold_until=2) as srv:  # holds every stream until 2 are in flight
        records, wall = run(ClientOptions(srv.url, "m", transport=transport), prompts, 2)
    assert srv.peak == 2 and len(srv.requests) == 6
    assert [r.index for r in records] == list(range(6)) and all(r.ok for r in records)
    assert all(r.intended_s is None for r in records)  # closed loop: no schedule
    assert all(r.queued_s is not None and 0 <= r.queued_s <= wall for r in records)
    assert wall >= max(r.send_s + r.wall_s for r in records)


def test_the_httpx_pool_holds_at_most_its_size_in_flight():
    prompts = [Prompt(f"p{i}", 1, 2) for i in range(4)]
    with OpenAIServer(hold_until=3, hold_s=0.5) as srv:  # a third in flight would show
        records, _ = run(ClientOptions(srv.url, "m", transport="httpx"), prompts, 4, client_size=2)
    assert srv.peak == 2 and all(r.ok for r in records)


def test_the_client_pool_follows_its_options():
    client = make_client(3, 45.0)
    assert client.timeout == httpx.Timeout(45.0, connect=30.0)
    assert make_client(3, 5.0).timeout == httpx.Timeout(5.0, connect=5.0)
    assert client.trust_env is False  # no proxy from the environment between us and the server


def test_a_later_turn_is_sent_only_once_the_previous_one_is_over():
    prompts = [Prompt("turn 1", 1, 3), Prompt("other", 1, 3), Prompt("turn 2", 1, 3, after=0)]
    with OpenAIServer() as srv:
        records, _ = run(ClientOptions(srv.url, "m"), prompts, 3)
    turn1 = next(i for i, s in enumerate(srv.requests) if s.body["prompt"] == "turn 1")
    turn2 = next(i for i, s in enumerate(srv.requests) if s.body["prompt"] == "turn 2")
    assert srv.log.index(f"end {turn1}") < srv.log.index(f"start {turn2}")
    assert all(r.ok for r in records) and records[2].queued_s > 0


def test_open_loop_arrivals_follow_the_seeded_schedule():
    prompts = [Prompt(f"p{i}", 1, 1) for i in range(5)]
    with OpenAIServer() as srv:
        records, _ = run(ClientOptions(srv.url, "m"), prompts, 5, request_rate=500.0, seed=3)
        bursty, _ = run(ClientOptions(srv.url, "m"), prompts, 5, request_rate=500.0, seed=3,
                        burstiness=4.0)  # fmt: skip
        unseeded, _ = run(ClientOptions(srv.url, "m"), prompts, 5, request_rate=500.0)
    assert [r.intended_s for r in unseeded] == arrival_offsets(5, 500.0, 1.0, 0)  # seed 0
    expected = arrival_offsets(5, 500.0, 1.0, 3)
    assert [r.intended_s for r in records] == expected
    assert [r.intended_s for r in bursty] == arrival_offsets(5, 500.0, 4.0, 3) != expected
    # never sent before its time (asyncio may wake a timer up to its clock's resolution,
    # 1 ns, early: a microsecond covers that and float rounding, and nothing else)
    assert all(r.send_s >= r.intended_s - 1e-6 for r in records)


def test_given_offsets_replay_a_trace_and_every_record_passes_on_record():
    prompts = [Prompt(f"p{i}", 1, 1) for i in range(3)]
    seen: list[tuple[int, float | None]] = []

    def on_record(record: RequestRecord) -> RequestRecord:
        seen.append((record.index, record.intended_s))
        return RequestRecord(record.index, 0, 0, 0.0, False, error_kind="other")

    with OpenAIServer() as srv:
        records, _ = run(ClientOptions(srv.url, "m"), prompts, 1, offsets=[0.0, 0.01, 0.02],
                         request_rate=1.0, on_record=on_record)  # fmt: skip
    assert sorted(seen) == [(0, 0.0), (1, 0.01), (2, 0.02)] and len(srv.requests) == 3
    assert [r.error_kind for r in records] == ["other"] * 3  # what on_record returned is kept


def test_requests_due_after_the_deadline_are_not_sent():
    prompts = [Prompt(f"p{i}", 1, 1) for i in range(3)]
    with OpenAIServer() as srv:
        began = time.perf_counter()
        records, wall = run(ClientOptions(srv.url, "m"), prompts, 3, offsets=[0.0, 0.0, 3600.0],
                            deadline=began + 0.5)  # fmt: skip
    assert [r.ok for r in records] == [True, True, False] and len(srv.requests) == 2
    assert records[2].error == "not sent: the cell's deadline passed" and records[2].index == 2
    assert records[2].intended_s == 3600.0 and wall < 3600.0


def test_a_request_in_flight_at_the_cells_deadline_ends_there():
    with ScriptedHttpServer([], hang=True) as srv:
        options = ClientOptions(srv.url, "m", timeout_s=30.0)
        records, _ = run(options, [PROMPT], 1, deadline=time.perf_counter() + 0.3)
    assert [r.error_kind for r in records] == ["deadline"]


def test_the_pacer_waits_for_a_request_due_after_the_deadline_only_until_the_deadline():
    prompts = [Prompt(f"p{i}", 1, 1) for i in range(2)]
    with OpenAIServer() as srv:

        async def go() -> list[RequestRecord]:
            async with make_client(2, 30.0) as client:
                deadline = time.perf_counter() + 0.3
                records, _ = await run_requests(client, ClientOptions(srv.url, "m"), prompts, 2,
                                                offsets=[0.0, 3600.0], deadline=deadline)  # fmt: skip
                return records

        with asyncio.Runner(loop_factory=RecordingLoop) as runner:
            records = runner.run(go())
            timers = runner.get_loop().timers
    assert [r.ok for r in records] == [True, False]
    assert 0 < timers[0] <= 0.3  # the pacer's sleep: to the deadline, not to 3600 s


def test_a_deadline_already_passed_sends_nothing():
    prompts = [Prompt(f"p{i}", 1, 1) for i in range(2)]
    with OpenAIServer() as srv:
        records, _ = run(ClientOptions(srv.url, "m"), prompts, 1, deadline=time.perf_counter())
    assert srv.requests == [] and [r.error_kind for r in records] == ["deadline", "deadline"]
