"""The load generator's HTTP side: streaming OpenAI requests, closed or open loop.

At most ``concurrency`` requests in flight (a semaphore, as SGLang's
``--max-concurrency``), optionally released at a Poisson ``request_rate`` (open loop).
Every request becomes a ``RequestRecord``; errors are classified by kind, never raised.
SSE is parsed by hand (``data:`` lines; ``[DONE]`` or the end of the body ends the
stream) because the per-chunk cost decides whether the client keeps up with a fast
server (benchmarks/client_overhead.py). Requests ask for ``stream_options.include_usage``
so SGLang/vLLM send the token count; servers that ignore it (transformers) send it anyway.

Bounded whatever the server does: a request keeps chunk times and counts, not the
streamed text (unless ``keep_text``; then at most ``TEXT_BYTES_PER_TOKEN`` per
requested token); more content chunks than ``max_tokens`` + ``CHUNK_SLACK`` is a
malformed answer (kind ``oversize``); each request ends by ``timeout_s`` after its send
and by the cell's deadline (kind ``deadline``; requests not yet sent then are recorded
as ``deadline`` without being sent).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import httpx

from gpudoctor.bench.load.arrivals import arrival_offsets
from gpudoctor.bench.load.sse_transport import (
    DEFAULT_CAPS,
    Deadline,
    StreamCaps,
    TransportFailure,
    stream_post,
)
from gpudoctor.bench.load.workload import Prompt
from gpudoctor.bench.request_record import RequestRecord

_CONTEXT_OVERFLOW = re.compile(
    r"context length|context window|maximum context|max_model_len|too long|longer than"
    r"|exceeds? (the )?(model'?s? )?max|maximum (sequence )?length|index out of range",
    re.IGNORECASE,
)
CHUNK_SLACK = 16  # content chunks allowed beyond max_tokens (a chunk holds >= 1 token)
TEXT_BYTES_PER_TOKEN = 256  # with keep_text: streamed text kept per requested token, at most


@dataclass(frozen=True)
class ClientOptions:
    """How the client talks to the server.

    Attributes:
        base_url: server root, e.g. ``http://127.0.0.1:30000`` (no ``/v1``).
        model: the ``model`` field.
        api: ``completions`` or ``chat``.
        ignore_eos: send ``"ignore_eos": true`` (SGLang/vLLM extension; strict OpenAI
            servers such as ``transformers serve`` answer 422 to it).
        timeout_s: per-read timeout (no byte for this long -> ``timeout``).
        extra_body: more fields merged into every request body.
        transport: ``fast`` (``sse_transport``, one connection per request, as SGLang) or
            ``httpx`` (pooled keep-alive connections; ~3x the CPU per chunk).
        keep_text: keep each chunk's text in the record (needed to split a speculative
            server's multi-token chunks by re-tokenizing; off: counts and times only).
        caps: byte limits on the response (``sse_transport.StreamCaps``).
    """

    base_url: str
    model: str
    api: str = "completions"
    ignore_eos: bool = False
    timeout_s: float = 600.0
    extra_body: tuple[tuple[str, Any], ...] = ()
    transport: str = "fast"
    keep_text: bool = False
    caps: StreamCaps = DEFAULT_CAPS

    @property
    def url(self) -> str:
        """Return the endpoint URL for ``api``."""
        path = "/v1/chat/completions" if self.api == "chat" else "/v1/completions"
        return self.base_url.rstrip("/") + path


REQUEST_ID_MAX = 128  # characters of the server's request id kept (a hostile one is cut)


class _Stream:
    """Mutable per-request state while it streams (becomes a frozen RequestRecord)."""

    __slots__ = ("chunk_times", "done", "finish", "keep_text", "last_event", "max_chunks",
                 "request_id", "spec_verify_ct", "text_left", "texts", "usage")  # fmt: skip

    def __init__(self, max_tokens: int = 1 << 30, keep_text: bool = False) -> None:
        self.chunk_times: list[float] = []
        self.texts: list[str] = []
        self.keep_text = keep_text
        self.max_chunks = max_tokens + CHUNK_SLACK
        self.text_left = max(max_tokens, 1) * TEXT_BYTES_PER_TOKEN
        self.last_event: float | None = None
        self.usage: dict[str, Any] | None = None
        self.finish: str | None = None
        self.done = False  # ``[DONE]`` arrived
        self.spec_verify_ct: int | None = None
        self.request_id: str | None = None

    def feed(self, payload: bytes, now: float, chat: bool) -> str | None:
        """Consume one ``data:`` payload; return an in-stream error message, else None."""
        self.last_event = now
        if payload == b"[DONE]":
            self.done = True
            return None
        event = json.loads(payload)
        error = stream_error(event)
        if error is not None:
            return error
        if self.request_id is None and isinstance(event.get("id"), str):
            self.request_id = event["id"][:REQUEST_ID_MAX]  # the server's id (OpenAI "id")
        choices = event.get("choices")
        if choices:
            choice = choices[0]
            text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            if text:
                if len(self.chunk_times) >= self.max_chunks:
                    raise TransportFailure(
                        "oversize", f"more than {self.max_chunks} content chunks for "
                        f"max_tokens {self.max_chunks - CHUNK_SLACK}")  # fmt: skip
                self.chunk_times.append(now)
                if self.keep_text:
                    self.text_left -= len(text.encode())  # UTF-8 bytes, as the cap says
                    if self.text_left < 0:
                        raise TransportFailure("oversize", "streamed text over the cap")
                    self.texts.append(text)
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])
        if event.get("usage"):
            self.usage = event["usage"]
        meta = event.get("meta_info")
        if isinstance(meta, dict) and "spec_verify_ct" in meta:
            self.spec_verify_ct = meta["spec_verify_ct"]
        return None


# A request ends well only with one of these final finish reasons (OpenAI's API: "stop",
# "length", "tool_calls", the older "function_call"; vLLM and SGLang send "abort" for a
# request they aborted, vLLM "error" for one that failed inside the engine).
GOOD_FINISH = frozenset({"stop", "length", "tool_calls", "function_call"})


def stream_error(event: object) -> str | None:
    """Return the message of an in-stream error event, in each shape the engines send, or
    None when ``event`` is no error:

    - ``{"error": {"message": ..., "type": ..., "code": ...}}``: OpenAI and TGI; vLLM
      0.32.0 (``vllm/entrypoints/serve/engine/protocol.py``: ``ErrorResponse(error=
      ErrorInfo(...))``, streamed by ``create_streaming_error_response``); SGLang 0.5.23
      (``sglang/srt/entrypoints/openai/serving_base.py``: ``{"error": ErrorResponse}``);
    - ``{"error": "message"}``: transformers 5.24.0 ``transformers serve``
      (``transformers/cli/serving/completion.py``, ``chat_completion.py``);
    - ``{"object": "error", "message": ..., "code": ...}``: the unwrapped ``ErrorResponse``
      of SGLang 0.5.23 (``protocol.py``) and of vLLM before the ``error`` wrapper."""
    if not isinstance(event, dict):
        return None
    error = event.get("error")
    if error:
        if isinstance(error, dict):
            return str(error.get("message") or error)
        return str(error)
    if event.get("object") == "error":
        return str(event.get("message") or event)
    return None


def stream_ending(stream: _Stream) -> tuple[str, str] | None:
    """Return (kind, message) when a stream that sent content did not end as the API defines
    success (a final ``finish_reason`` in :data:`GOOD_FINISH`), else None."""
    if stream.finish is None:
        cut = "" if stream.done else " and without [DONE]"
        return "unfinished", f"the stream ended without a finish_reason{cut}"
    if stream.finish not in GOOD_FINISH:
        return "aborted", f"the stream ended with finish_reason {_one_line(stream.finish, 40)!r}"
    return None


def classify_status(status: int, body: str) -> str:
    """Return the error kind of a non-200 response (``context_overflow`` by message)."""
    if status in (400, 413, 422) and _CONTEXT_OVERFLOW.search(body):
        return "context_overflow"
    return "http_5xx" if status >= 500 else "http_4xx"


def classify_exception(exc: BaseException) -> str:
    """Return the error kind of a transport exception."""
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect"
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        return "disconnect"
    if isinstance(exc, (ConnectionError, httpx.NetworkError)):
        return "disconnect"
    return "other"


def _one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]


async def send_request(
    client: httpx.AsyncClient | None,
    options: ClientOptions,
    prompt: Prompt,
    index: int,
    cell_t0: float,
    cell_deadline: float | None = None,
) -> RequestRecord:
    """Stream one request; return its record (errors are recorded, never raised).

    ``options.transport`` picks the HTTP stack: ``fast`` (``sse_transport``, the default;
    ``client`` unused) or ``httpx`` (through ``client``, which must then be given).
    The request is over by ``options.timeout_s`` after its send (kind ``timeout``) and
    by ``cell_deadline`` (``time.perf_counter()`` seconds; kind ``deadline``).
    """
    body = prompt.body(options.model)
    body.update({"stream": True, "temperature": 0.0, "stream_options": {"include_usage": True}})
    if options.ignore_eos:
        body["ignore_eos"] = True
    body.update(dict(options.extra_body))
    chat = options.api == "chat"
    stream = _Stream(prompt.output_len, options.keep_text)
    status: int | None = None
    written: float | None = None
    kind: str | None = None
    message: str | None = None
    stream_errors: list[str] = []

    def on_event(payload: bytes, now: float) -> None:
        error = stream.feed(payload, now, chat)
        if error is not None:
            stream_errors.append(error)

    start = time.perf_counter()
    deadline = Deadline(start + options.timeout_s, "timeout",
                        f"the request took over {options.timeout_s:g} s")  # fmt: skip
    if cell_deadline is not None and cell_deadline < deadline.at:
        deadline = Deadline(cell_deadline, "deadline", "the cell's deadline passed")
    try:
        if options.transport == "httpx":
            assert client is not None, "the httpx transport needs an AsyncClient"
            try:
                status, error_body = await asyncio.wait_for(
                    _httpx_post(client, options.url, body, on_event, options.caps),
                    max(deadline.at - time.perf_counter(), 0.0),
                )
            except asyncio.TimeoutError as exc:
                raise TransportFailure(deadline.kind, deadline.message) from exc
        else:
            result = await stream_post(options.url, body, on_event, options.timeout_s,
                                       deadline, options.caps)  # fmt: skip
            status, error_body, written = result.status, result.error_body, result.written_at
        if status != 200:
            kind = classify_status(status, error_body)
            message = f"HTTP {status}: {_one_line(error_body)}"
    except TransportFailure as exc:
        kind, message = exc.kind, _one_line(str(exc))
    except (httpx.HTTPError, OSError) as exc:
        kind, message = classify_exception(exc), _one_line(f"{type(exc).__name__}: {exc}")
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        kind, message = "other", _one_line(f"bad stream event: {type(exc).__name__}: {exc}")
    if kind is None and stream_errors:
        message = _one_line(stream_errors[0])
        kind = "context_overflow" if _CONTEXT_OVERFLOW.search(message) else "stream_error"
    if kind is None and not stream.chunk_times:
        kind, message = "empty", "the stream ended without any content token"
    if kind is None:
        kind, message = stream_ending(stream) or (None, None)
    wall = time.perf_counter() - start
    usage = stream.usage or {}
    completion = usage.get("completion_tokens")
    return RequestRecord(
        index=index,
        prompt_len=prompt.prompt_len,
        max_tokens=prompt.output_len,
        send_s=start - cell_t0,
        ok=kind is None,
        ttft_s=(stream.chunk_times[0] - start) if stream.chunk_times else None,
        e2e_s=(stream.last_event - start) if stream.last_event is not None else None,
        wall_s=wall,
        chunk_times_s=tuple(t - start for t in stream.chunk_times),
        chunk_tokens=(1,) * len(stream.chunk_times),
        output_tokens=len(stream.chunk_times),  # what arrived; ``usage`` is only compared
        usage_completion_tokens=completion,
        usage_prompt_tokens=usage.get("prompt_tokens"),
        finish_reason=stream.finish,
        spec_verify_ct=stream.spec_verify_ct,
        request_id=stream.request_id,
        status_code=status,
        error_kind=kind,
        error=message,
        text_chunks=tuple(stream.texts),
        written_s=None if written is None else written - cell_t0,
    )


def not_sent(prompt: Prompt, index: int, cell_t0: float) -> RequestRecord:
    """Return the record of a request the cell's deadline left unsent (kind ``deadline``)."""
    return RequestRecord(index=index, prompt_len=prompt.prompt_len, max_tokens=prompt.output_len,
                         send_s=time.perf_counter() - cell_t0, ok=False, wall_s=0.0,
                         error_kind="deadline", error="not sent: the cell's deadline passed")  # fmt: skip


async def _httpx_post(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    on_event: Callable[[bytes, float], None],
    caps: StreamCaps = DEFAULT_CAPS,
) -> tuple[int, str]:
    """Stream with httpx; return (status, error body when not 200, at most
    ``caps.error_body_bytes``). Raises TransportFailure ``oversize`` for an SSE line over
    ``caps.line_bytes`` (h11 itself caps the head)."""
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            kept = b""
            async for data in response.aiter_raw():
                kept += data[: caps.error_body_bytes - len(kept)]
                if len(kept) >= caps.error_body_bytes:
                    break
            return response.status_code, kept.decode("utf-8", "replace")
        buffer = b""
        async for data in response.aiter_raw():
            now = time.perf_counter()
            lines = (buffer + data).split(b"\n")
            buffer = lines.pop()
            if max([len(buffer), *(len(x) for x in lines)]) > caps.line_bytes:
                raise TransportFailure("oversize", f"an SSE line over {caps.line_bytes} bytes")
            for line in lines:
                if line.startswith(b"data:"):
                    on_event(line[5:].strip(), now)
        if buffer.startswith(b"data:"):
            on_event(buffer[5:].strip(), time.perf_counter())
        return 200, ""


def make_client(concurrency: int, timeout_s: float) -> httpx.AsyncClient:
    """Return an AsyncClient whose pool holds at most ``concurrency`` connections."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 30.0))
    return httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False)


async def run_requests(
    client: httpx.AsyncClient,
    options: ClientOptions,
    prompts: Sequence[Prompt],
    concurrency: int,
    *,
    request_rate: float | None = None,
    seed: int = 0,
    on_record: Callable[[RequestRecord], RequestRecord] | None = None,
    deadline: float | None = None,
    burstiness: float | None = None,
    offsets: Sequence[float] | None = None,
) -> tuple[list[RequestRecord], float]:
    """Send ``prompts`` with at most ``concurrency`` in flight; return (records, wall seconds).

    Closed loop when ``request_rate`` is None (a new request as soon as one finishes),
    else open loop: arrivals at gamma-distributed intervals of mean 1/rate (shape
    ``burstiness``, 1 = Poisson; seeded; :mod:`gpudoctor.bench.load.arrivals`), still
    capped at ``concurrency``. ``offsets``: each request's send time in seconds after
    the first (a trace replay), instead of drawn ones. A prompt with ``after`` set is
    sent once the prompt at that index is over (the previous turn of a conversation). ``on_record`` is called as each request completes and
    returns the record to keep (it may add detail, e.g. re-tokenized chunk counts).
    ``deadline`` (``time.perf_counter()`` seconds): every request is over by then; those
    not yet sent are recorded as ``deadline`` failures without being sent.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    semaphore = asyncio.Semaphore(concurrency)
    t0 = time.perf_counter()

    over = [asyncio.Event() for _ in prompts]

    async def limited(index: int, prompt: Prompt) -> RequestRecord:
        entered = time.perf_counter()
        try:
            if prompt.after is not None:  # the previous turn of its conversation first
                await over[prompt.after].wait()
            async with semaphore:
                queued = time.perf_counter() - entered
                if deadline is not None and time.perf_counter() >= deadline:
                    record = not_sent(prompt, index, t0)
                else:
                    record = await send_request(client, options, prompt, index, t0, deadline)
        finally:
            over[index].set()
        intended = offsets[index] if offsets is not None else None
        record = replace(record, intended_s=intended, queued_s=queued)
        return on_record(record) if on_record is not None else record

    if offsets is None and request_rate is not None:
        offsets = arrival_offsets(len(prompts), request_rate, burstiness or 1.0, seed)
    tasks = []
    for index, prompt in enumerate(prompts):
        if offsets is not None:
            pause = t0 + offsets[index] - time.perf_counter()
            if deadline is not None:
                pause = min(pause, max(deadline - time.perf_counter(), 0.0))
            if pause > 0:
                await asyncio.sleep(pause)
        tasks.append(asyncio.create_task(limited(index, prompt)))
    records = await asyncio.gather(*tasks)
    return list(records), time.perf_counter() - t0
