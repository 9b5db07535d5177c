"""A small, real OpenAI-compatible streaming HTTP server (stdlib only, starts in < 1 s).

It stands for an inference server (SGLang / vLLM / ``transformers serve``) in the
launcher's fault-injection tests, where dozens of server starts with the real
``transformers serve`` (~10 s each) would not fit in CI. It speaks the same protocol
the load generator uses: ``GET /health``, ``GET /v1/models`` (with ``max_model_len``),
``POST /v1/completions`` and ``/v1/chat/completions`` with ``stream: true`` (SSE
chunks, one token each, ``usage`` on the final chunk). Prompt tokens are counted with
the real tokenizer of ``--model`` (``tokenizer.json``); a prompt + ``max_tokens`` over
``--max-model-len`` gets HTTP 400 "maximum context length", like vLLM.

    python stream_server.py --model DIR --host 127.0.0.1 --port 8000
        [--max-model-len 2048] [--token-delay-ms 2] [--start-delay-s 0]
        [--exit-after-requests N] [--fail-start] [--max-running N] [--request-log PATH]
        [--hold-gpus TP] [--reject-status CODE] [--stream-nothing] [--fail-every N]
        [--metrics-file PATH ...] [--refuse-max-model-len N]

Faults a benchmark must not call a success (issue 31): ``--reject-status 422`` answers
every completion request with that status and ``transformers serve``'s own message
(``Unexpected fields in the request: {'ignore_eos'}``); ``--stream-nothing`` answers 200
and an SSE stream with no content token (``[DONE]`` only); ``--fail-every N`` answers
every N-th completion request with HTTP 500.

``--metrics-file`` (repeatable) serves ``GET /metrics`` as vLLM or SGLang would: the
first file to the first scrape, the next to the next, the last from then on.

Streams that lie (issue 45.1), each claiming ``usage.completion_tokens = max_tokens``
after ONE content token: ``--lie abort`` ends with ``finish_reason: "abort"`` (what vLLM
and SGLang send for a request they aborted); ``--lie error-event`` sends
``{"object": "error", "message": "CUDA out of memory...", "code": 500}`` (SGLang's
unwrapped ErrorResponse, vLLM's before its ``error`` wrapper) and then a final chunk with
``finish_reason: "length"``; ``--lie overclaim`` ends well (``length``) after one token.

``--refuse-max-model-len N`` dies at start with vLLM's own traceback for a max_model_len
over the model's (``_refuse_max_model_len``).

``--exit-after-requests N`` crashes the server (exit 3) when request N+1 arrives; its
clients see their connections closed only once the process is dead (``_crash``).

``--max-running N`` lets N requests generate at once (the others queue, as in a server
with N sequence slots: latency then grows with the load); ``--request-log`` appends one
JSON line per request (arrival time, the prompt or the chat messages) for tests that
check what the load generator sent.

``--hold-gpus TP`` makes it a stand-in for a GPU server: it refuses to start (exit 4)
unless ``CUDA_VISIBLE_DEVICES`` names exactly TP UUIDs, each one declared in
``GPUDOCTOR_FAKE_GPUS``, and none held by another server: each GPU is held with an
exclusive ``flock`` on ``$GPUDOCTOR_FAKE_GPU_LOCKS/<uuid>`` for the server's lifetime
(the kernel lets go when the process dies, as a real GPU's memory is freed). Every hold is
logged to ``$GPUDOCTOR_FAKE_GPU_LOCKS/holds.log`` (``<uuid> <pid> <start> <end>``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stream_server.py", description=__doc__.splitlines()[0])
    p.add_argument(
        "--model", required=True, help="model directory (its tokenizer.json counts tokens)"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--max-model-len", type=int, default=2048, help="context length in tokens")
    p.add_argument("--token-delay-ms", type=float, default=2.0, help="time per generated token")
    p.add_argument("--start-delay-s", type=float, default=0.0, help="sleep before binding the port")
    p.add_argument(
        "--exit-after-requests", type=int, default=0, help="crash (exit 3) after N requests"
    )
    p.add_argument(
        "--fail-start", action="store_true", help="exit 1 at startup (a fatal start error)"
    )
    p.add_argument(
        "--max-running", type=int, default=0, help="requests generating at once (0 = all)"
    )
    p.add_argument("--request-log", default="", help="append one JSON line per request here")
    p.add_argument("--metrics-file", action="append", default=[],
                   help="serve GET /metrics: the Nth file to the Nth scrape, the last one "
                   "after (recorded engine texts, tests/bench/data/metrics)")  # fmt: skip
    p.add_argument("--hold-gpus", type=int, default=0, help="hold TP stand-in GPUs (see above)")
    p.add_argument("--reject-status", type=int, default=0, help="answer every request with it")
    p.add_argument("--stream-nothing", action="store_true", help="200 with no content token")
    p.add_argument("--fail-every", type=int, default=0, help="HTTP 500 for every N-th request")
    p.add_argument("--lie", choices=("abort", "error-event", "overclaim"), default="",
                   help="stream one token and lie about it (see the module docstring)")  # fmt: skip
    p.add_argument("--refuse-max-model-len", type=int, default=0,
                   help="die at start as vLLM 0.32.0 does for a max_model_len over the model's")  # fmt: skip
    return p


def _refuse_max_model_len(wanted: int, derived: int) -> None:
    """Die as ``vllm serve --max-model-len`` over the model's length does: vLLM 0.32.0's
    ``vllm/config/model.py`` (``_get_and_verify_max_len``) raises this ValueError inside
    ``ModelConfig``, a pydantic dataclass (``vllm/config/utils.py``'s ``@config``), so the
    real pydantic wraps it in its ValidationError and Python prints the traceback (exit 1)."""
    from pydantic.dataclasses import dataclass

    msg = (f"User-specified max_model_len ({wanted}) is greater than the derived max_model_len "
           f"(max_position_embeddings={derived} or model_max_length=None in model's config.json). "
           "To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. "
           "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution.")  # fmt: skip

    @dataclass
    class ModelConfig:
        max_model_len: int

        def __post_init__(self) -> None:
            raise ValueError(msg)

    print(f"(APIServer pid={os.getpid()}) INFO 12-07 05:00:00 [utils.py:253] non-default args: "
          f"{{'max_model_len': {wanted}}}", flush=True)  # fmt: skip
    ModelConfig(max_model_len=wanted)


def _hold_gpus(tp: int) -> list[str]:
    """Check and hold this server's stand-in GPUs; exit 4 with a reason when it cannot."""
    import fcntl

    declared = [u for u in os.environ.get("GPUDOCTOR_FAKE_GPUS", "").split(",") if u]
    visible = [u for u in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if u]
    problem = None
    if len(visible) != tp:
        problem = (
            f"CUDA_VISIBLE_DEVICES={','.join(visible)!r} names {len(visible)} GPUs, tp is {tp}"
        )
    elif any(u not in declared for u in visible):
        problem = f"CUDA_VISIBLE_DEVICES names a GPU not in GPUDOCTOR_FAKE_GPUS: {visible}"
    locks = os.environ.get("GPUDOCTOR_FAKE_GPU_LOCKS", "")
    if problem is None and locks:
        for uuid in visible:
            fd = os.open(os.path.join(locks, uuid), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                problem = f"GPU {uuid} is held by another server"
                break
    if problem:
        print(f"stream_server: fatal: {problem}", flush=True)
        sys.exit(4)
    return visible


def _log_holds(visible: list[str], started: float) -> None:
    locks = os.environ.get("GPUDOCTOR_FAKE_GPU_LOCKS", "")
    if locks and visible:
        with open(os.path.join(locks, "holds.log"), "a", encoding="utf-8") as fh:
            for uuid in visible:
                fh.write(f"{uuid} {os.getpid()} {started:.6f} {time.time():.6f}\n")


def main() -> None:
    args = _parser().parse_args()
    if args.fail_start:
        print("stream_server: fatal: --fail-start given, refusing to start", flush=True)
        sys.exit(1)
    if args.refuse_max_model_len:
        _refuse_max_model_len(args.refuse_max_model_len, args.max_model_len)
    held = _hold_gpus(args.hold_gpus) if args.hold_gpus else []
    held_since = time.time()
    if held:
        import atexit
        import signal as signal_mod

        atexit.register(_log_holds, held, held_since)
        signal_mod.signal(signal_mod.SIGTERM, lambda *_: sys.exit(0))
    count_tokens = _token_counter(args.model)
    time.sleep(args.start_delay_s)
    served = {"n": 0}
    lock = threading.Lock()
    slots = threading.BoundedSemaphore(args.max_running) if args.max_running > 0 else None

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *a: object) -> None:
            print("stream_server: " + fmt % a, flush=True)

        def _json(self, status: int, obj: object) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json(200, {"status": "ok"})
            elif self.path == "/metrics" and args.metrics_file:
                with lock:
                    n = served.setdefault("scrapes", 0)
                    served["scrapes"] = n + 1
                with open(args.metrics_file[min(n, len(args.metrics_file) - 1)], "rb") as fh:
                    data = fh.read()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif self.path == "/v1/models":
                card = {"id": args.model, "object": "model", "max_model_len": args.max_model_len}
                self._json(200, {"object": "list", "data": [card]})
            else:
                self._json(404, {"detail": "not found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            chat = self.path == "/v1/chat/completions"
            if self.path not in ("/v1/completions", "/v1/chat/completions"):
                self._json(404, {"detail": "not found"})
                return
            with lock:
                served["n"] += 1
                if args.exit_after_requests and served["n"] > args.exit_after_requests:
                    print("stream_server: injected crash", flush=True)
                    _crash(3)
                number = served["n"]
            if args.reject_status:
                unexpected = {k for k in body if k in ("ignore_eos", "min_tokens")} or {"x"}
                self._json(args.reject_status,
                           {"detail": f"Unexpected fields in the request: {unexpected}"})  # fmt: skip
                return
            if args.fail_every and number % args.fail_every == 0:
                self._json(500, {"error": {"message": "injected failure", "type": "ServerError"}})
                return
            if args.stream_nothing:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                self.wfile.write(b"data: [DONE]\n\n")
                return
            messages = body.get("messages") or [] if chat else []
            text = body.get("prompt", "")
            if chat:
                prompt_tokens = sum(count_tokens(str(m.get("content", ""))) + 8 for m in messages)
            else:
                prompt_tokens = count_tokens(text)
            if args.request_log:
                line = {"t": time.time(), "prompt": text, "messages": messages,
                        "max_tokens": body.get("max_tokens")}  # fmt: skip
                with lock, open(args.request_log, "a", encoding="utf-8") as log:
                    log.write(json.dumps(line) + "\n")
            max_tokens = int(body.get("max_tokens") or 16)
            if prompt_tokens + max_tokens > args.max_model_len:
                msg = (f"This model's maximum context length is {args.max_model_len} tokens. However, you "
                       f"requested {prompt_tokens + max_tokens} tokens.")  # fmt: skip
                self._json(400, {"error": {"message": msg, "type": "BadRequestError"}})
                return
            if slots is not None:
                slots.acquire()
            try:
                self._stream(chat, prompt_tokens, max_tokens)
            finally:
                if slots is not None:
                    slots.release()

        def _stream(self, chat: bool, prompt_tokens: int, max_tokens: int) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            with lock:
                served["ids"] = served.get("ids", 0) + 1
                request_id = f"cmpl-stub-{served['ids']}"
            base = {"id": request_id, "model": args.model, "created": int(time.time())}
            if args.lie:
                self._lie(chat, base, prompt_tokens, max_tokens)
                return
            for i in range(max_tokens):
                time.sleep(args.token_delay_ms / 1000)
                piece = {"delta": {"content": " tok"}} if chat else {"text": " tok"}
                chunk = {**base, "choices": [{"index": 0, **piece}]}
                if i == max_tokens - 1:
                    chunk["choices"][0]["finish_reason"] = "length"
                    chunk["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
                                      "total_tokens": prompt_tokens + max_tokens}  # fmt: skip
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")

        def _lie(self, chat: bool, base: dict, prompt_tokens: int, max_tokens: int) -> None:
            piece = {"delta": {"content": " tok"}} if chat else {"text": " tok"}
            events: list[dict] = [{**base, "choices": [{"index": 0, **piece}]}]
            if args.lie == "error-event":
                events.append({"object": "error", "message": "CUDA out of memory. Tried to "
                               "allocate 2.00 GiB", "type": "InternalServerError", "code": 500})  # fmt: skip
            empty = {"delta": {}} if chat else {"text": ""}
            finish = "abort" if args.lie == "abort" else "length"
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens,
                     "total_tokens": prompt_tokens + max_tokens}  # fmt: skip
            events.append({**base, "choices": [{"index": 0, **empty, "finish_reason": finish}],
                           "usage": usage})  # fmt: skip
            for event in events:
                time.sleep(args.token_delay_ms / 1000)
                self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"stream_server: Uvicorn running on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()


def _crash(code: int) -> None:
    """Exit with ``code`` now (``os._exit``: no cleanup, as a crash), in an order clients can
    rely on: the process is already dead (a zombie its parent can reap) when its clients
    see their connections closed.

    The kernel closes a dying process's sockets BEFORE it becomes a zombie, so a client
    could see the reset, finish its work and ask whether the server is still alive while
    it still runs: the verdict would depend on the box's load. So a forked keeper holds
    every descriptor (sockets, log pipe) open until this process is a zombie, then exits."""
    pid = os.getpid()
    if os.fork() == 0:  # the keeper: only os calls between fork and _exit
        while True:
            try:
                with open(f"/proc/{pid}/stat", "rb") as fh:
                    state = fh.read().rsplit(b")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):
                break  # reaped already
            if state in (b"Z", b"X"):
                break
            time.sleep(0.002)
        os._exit(0)
    os._exit(code)


def _token_counter(model_dir: str):
    path = os.path.join(model_dir, "tokenizer.json")
    try:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(path)
        return lambda text: len(tok.encode(text, add_special_tokens=False).ids)
    except Exception:  # no tokenizer: count words
        return lambda text: len(text.split())


if __name__ == "__main__":
    main()
