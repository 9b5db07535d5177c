"""One measured request: the raw record the client produces and the metrics consume.

Times are seconds from ``time.perf_counter()``; ``send_s`` is relative to the cell's
start, every other time is relative to the request's own send time, so a record is
self-contained and JSON-ready (``to_json`` / ``from_json`` round-trip exactly).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Error kinds, the keys of a cell's ``errors`` dict (see docs/bench-metrics.md).
ERROR_KINDS = (
    "context_overflow",  # the server refused or failed the prompt for its length
    "http_4xx",  # any other 4xx status (e.g. 422 for an unknown field)
    "http_5xx",  # 5xx status (server error, dead worker)
    "timeout",  # no byte within the request timeout
    "disconnect",  # the connection broke mid-request (server killed, reset)
    "connect",  # the connection could not be opened (server down)
    "stream_error",  # HTTP 200, then an in-stream ``{"error": ...}`` event
    "empty",  # HTTP 200 but no content token arrived
    "aborted",  # the stream's final finish_reason is not a success (vLLM/SGLang "abort", "error")
    "unfinished",  # the stream ended without a final finish_reason (cut, or never finished)
    "oversize",  # a header, SSE line or chunk count over its cap (a broken/hostile server)
    "deadline",  # the cell's deadline passed before the request ended (or was sent)
    "other",  # anything else (bad JSON, client bug): see the raw record's message
)


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one request.

    Attributes:
        index: position in the cell's prompt list (0-based).
        prompt_len: prompt tokens as counted by the client's tokenizer.
        max_tokens: the ``max_tokens`` sent.
        send_s: send time, seconds after the cell's start.
        ok: True when the request streamed at least one token and ended cleanly.
        ttft_s: send -> first chunk with content (None when none arrived).
        e2e_s: send -> last streamed event (any event, as SGLang's bench_serving).
        wall_s: send -> the request was over (success or failure, response closed).
        chunk_times_s: arrival time of every content chunk, seconds after send.
        chunk_tokens: tokens in each content chunk (1 each unless re-tokenized).
        output_tokens: completion tokens the client received: the content chunks, or (text
            kept) the model's tokenizer count of the streamed text, as bench_serving's
            retokenized count; the server's ``usage`` is only compared with it.
        usage_completion_tokens: ``usage.completion_tokens`` as sent by the server.
        usage_prompt_tokens: ``usage.prompt_tokens`` as sent by the server.
        finish_reason: the server's ``finish_reason`` ("length", "stop"), if any.
        spec_verify_ct: SGLang ``meta_info.spec_verify_ct`` when the server sent it.
        request_id: the server's id of the request (the stream's OpenAI ``id`` field,
            at most 128 characters), None when it sent none.
        status_code: HTTP status (None when no response arrived).
        error_kind: one of ``ERROR_KINDS`` when ``ok`` is False.
        error: a one-line error message.
        text_chunks: the streamed text of each content chunk, only with ``keep_text``
            (for re-tokenizing a speculative server's multi-token chunks).
        intended_s: when the arrival schedule meant to send it, seconds after the cell's
            start (None in a closed loop).
        queued_s: seconds it waited for a concurrency slot (or its conversation's
            previous turn) between its dispatch and its send.
        written_s: when its bytes were written to the connection (after the slot wait
            and the connect), seconds after the cell's start: where a server sees it
            arrive (None: not written, or the httpx transport, which does not say).
    """

    index: int
    prompt_len: int
    max_tokens: int
    send_s: float
    ok: bool
    ttft_s: float | None = None
    e2e_s: float | None = None
    wall_s: float | None = None
    chunk_times_s: tuple[float, ...] = ()
    chunk_tokens: tuple[int, ...] = ()
    output_tokens: int = 0
    usage_completion_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    finish_reason: str | None = None
    spec_verify_ct: int | None = None
    request_id: str | None = None
    status_code: int | None = None
    error_kind: str | None = None
    error: str | None = None
    text_chunks: tuple[str, ...] = field(default=(), repr=False)
    intended_s: float | None = None
    queued_s: float | None = None
    written_s: float | None = None

    @property
    def end_s(self) -> float:
        """Return when the request was over, seconds after the cell's start."""
        return self.send_s + (self.wall_s if self.wall_s is not None else self.e2e_s or 0.0)

    def to_json(self) -> dict[str, Any]:
        """Return the record as a JSON-ready dict (tuples become lists)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        """Build a record from ``to_json``'s output (unknown keys are ignored)."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for name in ("chunk_times_s", "chunk_tokens", "text_chunks"):
            if name in known:
                known[name] = tuple(known[name])
        return cls(**known)
