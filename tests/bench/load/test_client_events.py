"""gpudoctor/bench/load/client.py: how one streamed request's SSE payloads become what its
record says (token times, usage, finish reason, the server's id, SGLang's verify steps),
the bounds a hostile server meets (chunks beyond max_tokens, kept text), and how an error
status, an in-stream error or a transport exception is classified. Pure functions fed the
payloads servers really send (SGLang, vLLM, transformers serve)."""

from __future__ import annotations

import json

import httpx
import pytest

from gpudoctor.bench.load.client import (
    CHUNK_SLACK,
    REQUEST_ID_MAX,
    TEXT_BYTES_PER_TOKEN,
    ClientOptions,
    TransportFailure,
    _one_line,
    _Stream,
    classify_exception,
    classify_status,
    stream_ending,
    stream_error,
)
from gpudoctor.bench.load.sse_transport import DEFAULT_CAPS


def event(text: str | None = None, chat: bool = False, **extra: object) -> bytes:
    choice: dict[str, object] = {"index": 0}
    if text is not None:
        choice.update({"delta": {"content": text}} if chat else {"text": text})
    if "finish" in extra:
        choice["finish_reason"] = extra.pop("finish")
    return json.dumps({"choices": [choice], **extra}).encode()


def fed(payloads: list[bytes], chat: bool = False, **kw: object) -> tuple[_Stream, list]:
    stream = _Stream(**kw)  # type: ignore[arg-type]
    errors = [stream.feed(p, float(i + 1), chat) for i, p in enumerate(payloads)]
    return stream, errors


# ---------------------------------------------------------------------------- options


def test_the_endpoint_follows_the_api_and_ignores_a_trailing_slash():
    assert ClientOptions("http://h:1", "m").url == "http://h:1/v1/completions"
    assert ClientOptions("http://h:1/", "m", api="chat").url == "http://h:1/v1/chat/completions"
    options = ClientOptions("http://h:1", "m")
    assert (options.api, options.ignore_eos, options.timeout_s, options.extra_body) == (
        "completions", False, 600.0, ())  # fmt: skip
    assert (options.transport, options.keep_text, options.caps) == ("fast", False, DEFAULT_CAPS)


# ---------------------------------------------------------------------------- events


def test_content_events_give_token_times_and_the_last_event_time():
    stream, errors = fed([event("a"), event(""), event("b"), b"[DONE]"])
    assert errors == [None] * 4
    assert stream.chunk_times == [1.0, 3.0]  # the empty event is not a token
    assert stream.last_event == 4.0  # [DONE] is the last event seen
    assert stream.texts == []  # without keep_text no text is kept


def test_chat_events_carry_their_text_in_the_delta():
    stream, _ = fed([event("a", chat=True), event(None, chat=True), event("b")], chat=True)
    assert stream.chunk_times == [1.0]  # a completions-style "text" is not a chat token
    role_only = json.dumps({"choices": [{"index": 0, "delta": None}]}).encode()
    assert fed([role_only], chat=True)[0].chunk_times == []


def test_the_final_event_gives_finish_reason_usage_and_verify_steps():
    usage = {"completion_tokens": 2, "prompt_tokens": 5}
    stream, _ = fed([
        event("a", id="cmpl-1"),
        event("b", finish="length", usage=usage, meta_info={"spec_verify_ct": 7}),
        event(None, finish=None, usage=None, meta_info={"other": 1}),
        json.dumps({"choices": [], "usage": {}, "meta_info": [1]}).encode(),
    ])  # fmt: skip
    assert stream.finish == "length" and stream.usage == usage and stream.spec_verify_ct == 7


def test_the_servers_request_id_is_the_first_one_sent_and_cut_to_its_cap():
    stream, _ = fed([event("a", id=12), event("b", id="x" * 500), event("c", id="later")])
    assert stream.request_id == "x" * REQUEST_ID_MAX
    assert fed([event("a")])[0].request_id is None


@pytest.mark.parametrize(
    ("error", "message"),
    [
        ({"message": "Input too long", "code": 400}, "Input too long"),
        ({"code": 500}, "{'code': 500}"),
        ("No requests can be scheduled", "No requests can be scheduled"),
        (["scheduler", "dead"], "['scheduler', 'dead']"),
    ],
)
def test_an_error_event_gives_its_message(error, message):
    stream, errors = fed([json.dumps({"error": error, "choices": [{"text": "x"}]}).encode()])
    assert errors == [message] and stream.chunk_times == []


@pytest.mark.parametrize("error", [None, "", {}])
def test_an_empty_error_field_is_no_error(error):
    stream, errors = fed([json.dumps({"error": error, "choices": [{"text": "x"}]}).encode()])
    assert errors == [None] and stream.chunk_times == [1.0]


def test_more_content_chunks_than_max_tokens_allows_is_oversize():
    payloads = [event("t")] * (3 + CHUNK_SLACK)
    stream, _ = fed(payloads, max_tokens=3)  # exactly the slack beyond max_tokens: kept
    assert len(stream.chunk_times) == 3 + CHUNK_SLACK
    with pytest.raises(TransportFailure) as info:
        stream.feed(event("t"), 99.0, False)
    assert info.value.kind == "oversize"
    assert str(info.value) == f"more than {3 + CHUNK_SLACK} content chunks for max_tokens 3"
    stream.feed(event(""), 100.0, False)  # events without content still pass
    assert stream.last_event == 100.0


def test_kept_text_is_bounded_by_the_requested_tokens():
    limit = 2 * TEXT_BYTES_PER_TOKEN
    stream, _ = fed([event("a" * (limit - 1)), event("b")], max_tokens=2, keep_text=True)
    assert stream.texts == ["a" * (limit - 1), "b"]  # exactly the cap: kept
    with pytest.raises(TransportFailure) as info:
        stream.feed(event("c"), 9.0, False)
    assert (info.value.kind, str(info.value)) == ("oversize", "streamed text over the cap")
    wide = _Stream(max_tokens=1, keep_text=True)  # counted in UTF-8 bytes, not characters
    wide.feed(event("é" * (TEXT_BYTES_PER_TOKEN // 2)), 1.0, False)
    with pytest.raises(TransportFailure):
        wide.feed(event("é"), 2.0, False)
    zero = _Stream(max_tokens=0, keep_text=True)  # max_tokens 0 still keeps one token's worth
    zero.feed(event("z" * TEXT_BYTES_PER_TOKEN), 1.0, False)
    assert zero.texts == ["z" * TEXT_BYTES_PER_TOKEN]
    with pytest.raises(TransportFailure):
        zero.feed(event("z"), 2.0, False)


def test_the_documented_bounds():
    """A server may send 16 content chunks beyond max_tokens (a chunk holds >= 1 token),
    256 bytes of kept text per requested token, a request id of 128 characters."""
    assert (CHUNK_SLACK, TEXT_BYTES_PER_TOKEN, REQUEST_ID_MAX) == (16, 256, 128)


def test_a_stream_without_limits_takes_many_chunks():
    stream = _Stream()
    for i in range(100):
        stream.feed(event("t"), float(i), False)
    assert len(stream.chunk_times) == 100 and stream.usage is None and stream.finish is None
    assert stream.texts == [] and stream.spec_verify_ct is None and stream.request_id is None


def test_a_payload_that_is_not_json_raises():
    with pytest.raises(ValueError):
        _Stream().feed(b"{not json", 1.0, False)


# ---------------------------------------------------------------------------- classification


@pytest.mark.parametrize(
    "message",
    [
        "The input (40000 tokens) is longer than the model's context length (32768 tokens).",
        "This model's maximum context length is 4096 tokens.",
        "Requested tokens exceed context window of 2048",
        "max_model_len is 2048",
        "prompt is too long",
        "input is longer than allowed",
        "Input exceeds the model's max length",
        "Input exceeds max length",
        "maximum sequence length reached",
        "Maximum Length exceeded",
        "IndexError: index out of range in self",
    ],
)
@pytest.mark.parametrize("status", [400, 413, 422])
def test_a_rejected_prompt_too_long_for_the_context_is_context_overflow(status, message):
    assert classify_status(status, message) == "context_overflow"


def test_other_statuses_are_client_or_server_errors():
    assert classify_status(400, "Unexpected fields in the request: {'ignore_eos'}") == "http_4xx"
    assert classify_status(404, "context length") == "http_4xx"  # not a rejected prompt
    assert classify_status(499, "") == "http_4xx"
    assert classify_status(500, "maximum context length") == "http_5xx"
    assert classify_status(503, "busy") == "http_5xx"


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (httpx.ReadTimeout("t"), "timeout"),
        (httpx.ConnectTimeout("t"), "timeout"),
        (httpx.ConnectError("c"), "connect"),
        (httpx.RemoteProtocolError("r"), "disconnect"),
        (httpx.ReadError("r"), "disconnect"),
        (httpx.WriteError("w"), "disconnect"),
        (httpx.CloseError("c"), "disconnect"),
        (ConnectionResetError("reset"), "disconnect"),
        (httpx.UnsupportedProtocol("u"), "other"),
        (OSError("disk"), "other"),
    ],
)
def test_transport_exceptions_are_classified(exc, kind):
    assert classify_exception(exc) == kind


def test_a_message_is_one_line_of_at_most_its_limit():
    assert _one_line("a\n  b\tc\r\n") == "a b c"
    assert _one_line("x" * 400) == "x" * 300
    assert _one_line("abcdef", 3) == "abc"


# --- how a stream ends, and the error events of each engine (issue 45.1) ---------------------

ERROR_EVENTS = [
    # vLLM 0.32.0 and SGLang 0.5.23 streaming, OpenAI, TGI: the ``error`` wrapper
    ({"error": {"object": "error", "message": "CUDA out of memory", "type": "InternalServerError",
                "param": None, "code": 500}}, "CUDA out of memory"),
    ({"error": {"message": "", "type": "x", "code": 500}}, "{'message': '', 'type': 'x', 'code': 500}"),
    # transformers 5.24.0 serve: a bare string
    ({"error": "CB worker died"}, "CB worker died"),
    # SGLang's ErrorResponse and vLLM's before the wrapper: unwrapped
    ({"object": "error", "message": "CUDA out of memory...", "code": 500}, "CUDA out of memory..."),
    ({"object": "error", "code": 500}, "{'object': 'error', 'code': 500}"),
]  # fmt: skip


@pytest.mark.parametrize(("event_", "message"), ERROR_EVENTS)
def test_every_engines_error_event_is_an_error(event_: dict, message: str) -> None:
    assert stream_error(event_) == message
    stream, errors = fed([json.dumps(event_).encode()])
    assert errors == [message] and stream.chunk_times == []


@pytest.mark.parametrize(
    "event_",
    [
        {"choices": []},
        {"object": "text_completion"},
        {"error": None},
        {"error": ""},
        [1],
        "x",
        None,
    ],
)
def test_a_plain_event_is_no_error(event_: object) -> None:
    assert stream_error(event_) is None


@pytest.mark.parametrize("finish", ["stop", "length", "tool_calls", "function_call"])
def test_a_stream_that_finished_well_is_no_failure(finish: str) -> None:
    stream, _ = fed([event("a"), event("b", finish=finish), b"[DONE]"])
    assert stream.finish == finish and stream.done and stream_ending(stream) is None
    without_done, _ = fed([event("a", finish=finish)])  # transformers serve sends no [DONE]
    assert stream_ending(without_done) is None


@pytest.mark.parametrize(
    ("payloads", "ending"),
    [
        ([event("a", finish="abort"), b"[DONE]"], ("aborted", "the stream ended with finish_reason 'abort'")),
        ([event("a", finish="error")], ("aborted", "the stream ended with finish_reason 'error'")),
        ([event("a", finish="content_filter")], ("aborted", "the stream ended with finish_reason 'content_filter'")),
        ([event("a"), b"[DONE]"], ("unfinished", "the stream ended without a finish_reason")),
        ([event("a")], ("unfinished", "the stream ended without a finish_reason and without [DONE]")),
        ([event("a", finish=7)], ("aborted", "the stream ended with finish_reason '7'")),
    ],
)  # fmt: skip
def test_a_stream_that_did_not_finish_well_fails_with_its_kind(
    payloads: list[bytes], ending: tuple[str, str]
) -> None:
    stream, _ = fed(payloads)
    assert stream_ending(stream) == ending


def test_the_last_finish_reason_counts_and_a_null_one_does_not_clear_it() -> None:
    stream, _ = fed(
        [event("a", finish="abort"), event("b", finish="length"), event(None, finish=None)]
    )
    assert stream.finish == "length" and stream_ending(stream) is None
    long_reason, _ = fed([event("a", finish="x" * 100)])
    assert stream_ending(long_reason) == (
        "aborted",
        f"the stream ended with finish_reason {'x' * 40!r}",
    )
