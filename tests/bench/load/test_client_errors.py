"""The client's HTTP parsing and error classification, byte by byte, on loopback servers."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpudoctor.bench.load.client import ClientOptions, classify_status, send_request
from gpudoctor.bench.load.workload import Prompt
from gpudoctor.bench.request_record import RequestRecord
from tests.bench.scripted_http import ScriptedHttpServer

PROMPT = Prompt("hello", prompt_len=2, output_len=3)
HEAD_CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _event(text: str, **extra: object) -> bytes:
    choice = {
        "index": 0,
        "text": text,
        **({"finish_reason": extra.pop("finish")} if "finish" in extra else {}),
    }
    return b"data: " + json.dumps({"choices": [choice], **extra}).encode() + b"\n\n"


def _send(url: str, transport: str = "fast", timeout_s: float = 10.0) -> RequestRecord:
    async def go() -> RequestRecord:
        import httpx

        options = ClientOptions(url, "m", transport=transport, timeout_s=timeout_s, keep_text=True)
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            return await send_request(client, options, PROMPT, 0, 0.0)

    return asyncio.run(go())


@pytest.mark.parametrize("transport", ["fast", "httpx"])
def test_stream_split_at_every_byte_is_parsed_whole(transport: str) -> None:
    body = (_chunk(_event("a")) + _chunk(_event("b") + _event("c"))
            + _chunk(_event("", finish="length", usage={"completion_tokens": 3, "prompt_tokens": 2}))
            + b"0\r\n\r\n")  # fmt: skip
    raw = HEAD_CHUNKED + body
    with ScriptedHttpServer([raw[i : i + 7] for i in range(0, len(raw), 7)]) as srv:
        record = _send(srv.url, transport)
    assert record.ok, record.error
    assert record.text_chunks == ("a", "b", "c")
    assert record.output_tokens == 3 and record.usage_prompt_tokens == 2
    assert record.finish_reason == "length"
    assert record.ttft_s == record.chunk_times_s[0] <= record.e2e_s <= record.wall_s


@pytest.mark.parametrize("transport", ["fast", "httpx"])
def test_cut_mid_stream_is_a_disconnect(transport: str) -> None:
    with ScriptedHttpServer([HEAD_CHUNKED, _chunk(_event("a")), b"40\r\ndata: {"]) as srv:
        record = _send(srv.url, transport)
    assert not record.ok and record.error_kind == "disconnect"
    assert record.text_chunks == ("a",)  # what arrived before the cut is kept


@pytest.mark.parametrize("transport", ["fast", "httpx"])
def test_silent_server_is_a_timeout(transport: str) -> None:
    with ScriptedHttpServer([], hang=True) as srv:
        record = _send(srv.url, transport, timeout_s=0.3)
    assert not record.ok and record.error_kind == "timeout"


@pytest.mark.parametrize("transport", ["fast", "httpx"])
def test_refused_connection_is_connect(transport: str) -> None:
    from tests.bench.llm_server import free_port as port

    record = _send(f"http://127.0.0.1:{port()}", transport)
    assert not record.ok and record.error_kind == "connect" and record.status_code is None


@pytest.mark.parametrize("transport", ["fast", "httpx"])
def test_context_overflow_response(transport: str) -> None:
    # SGLang's message (tokenizer_manager.py), sent as a plain 400 with content-length
    msg = b'{"object":"error","message":"The input (40000 tokens) is longer than the model\'s context length (32768 tokens).","code":400}'
    raw = b"HTTP/1.1 400 Bad Request\r\ncontent-length: %d\r\n\r\n" % len(msg) + msg
    with ScriptedHttpServer([raw]) as srv:
        record = _send(srv.url, transport)
    assert record.error_kind == "context_overflow" and record.status_code == 400
    assert "context length" in record.error


@pytest.mark.parametrize("transport", ["fast", "httpx"])
def test_in_stream_error_and_empty_stream(transport: str) -> None:
    error = b'data: {"error": "No requests can be scheduled"}\n\n'
    with ScriptedHttpServer([HEAD_CHUNKED + _chunk(error) + b"0\r\n\r\n"]) as srv:
        record = _send(srv.url, transport)
    assert record.error_kind == "stream_error" and "scheduled" in record.error
    with ScriptedHttpServer([HEAD_CHUNKED + _chunk(_event("")) + b"0\r\n\r\n"]) as srv:
        record = _send(srv.url, transport)
    assert record.error_kind == "empty" and record.status_code == 200


def test_status_classification() -> None:
    vllm = "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens"
    assert classify_status(400, vllm) == "context_overflow"
    assert classify_status(400, '{"detail":"Server is pinned to \'a\'"}') == "http_4xx"
    assert classify_status(422, "Unexpected fields in the request: {'ignore_eos'}") == "http_4xx"
    assert classify_status(503, '{"error":"CB worker is dead"}') == "http_5xx"


def test_without_usage_output_tokens_are_what_arrived() -> None:
    # a server that sends no usage: the tokens counted are the content chunks that arrived,
    # under ignore_eos too (issue 45.1: max_tokens was assumed there, as bench_serving does)
    body = HEAD_CHUNKED + _chunk(_event("a") + _event("b", finish="length"))
    body += _chunk(b"data: [DONE]\n\n")
    with ScriptedHttpServer([body + b"0\r\n\r\n"]) as srv:

        async def go(ignore_eos: bool) -> RequestRecord:
            options = ClientOptions(srv.url, "m", ignore_eos=ignore_eos)
            return await send_request(None, options, PROMPT, 0, 0.0)

        with_ignore, without = asyncio.run(go(True)), asyncio.run(go(False))
    assert with_ignore.ok and with_ignore.usage_completion_tokens is None
    assert with_ignore.output_tokens == 2 and PROMPT.output_len == 3
    assert without.ok and without.output_tokens == 2
