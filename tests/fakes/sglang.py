"""A small stand-in for an SGLang server with speculative decoding (which needs a GPU).

It mimics only the HTTP surface the load generator touches, with SGLang's field names
(read from sglang 0.5.5's ``http_server.py`` / ``scheduler.py``): ``POST /flush_cache``
resets the speculative counters, ``GET /get_server_info`` returns
``internal_states[0].avg_spec_accept_length`` (``GET /server_info`` in newer SGLang:
``info_path``) = accepted tokens / verify steps since
the last flush, and ``POST /v1/completions`` streams TWO tokens per SSE chunk (as a
speculative server does), each token being one word of the tiny tokenizer, with
``usage`` on the last chunk and, when ``meta_info`` is on, SGLang's per-request
``meta_info.spec_verify_ct``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKENS_PER_CHUNK = 2
LIFETIME_ACCEPT = 9.0  # what the gauge would say without a flush (the server's whole life)


class FakeSglang:
    """``with FakeSglang(meta_info=False) as srv:`` then use ``srv.url``."""

    def __init__(self, meta_info: bool = False, info_path: str = "/get_server_info") -> None:
        self.meta_info = meta_info
        self.info_path = info_path  # "/server_info" in newer SGLang
        self.info_requests: list[str] = []
        self.flushes = 0
        self.accepted = 900  # a long history before the cell: avg LIFETIME_ACCEPT
        self.steps = 100
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _json(self, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                fake.info_requests.append(self.path)
                if self.path != fake.info_path:
                    self.send_error(404)
                    return
                with fake.lock:
                    avg = fake.accepted / fake.steps if fake.steps else None
                self._json({"internal_states": [{"avg_spec_accept_length": avg}], "tp_size": 1})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])) or b"{}")
                if self.path == "/flush_cache":
                    with fake.lock:
                        fake.flushes += 1
                        fake.accepted = fake.steps = 0
                    self._json({"success": True})
                    return
                tokens = int(body["max_tokens"])
                steps = (tokens + TOKENS_PER_CHUNK - 1) // TOKENS_PER_CHUNK
                with fake.lock:
                    fake.accepted += tokens
                    fake.steps += steps
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                words = ["the", "model", "server", "latency"]
                sent = 0
                while sent < tokens:
                    n = min(TOKENS_PER_CHUNK, tokens - sent)
                    text = "".join(f" {words[(sent + k) % 4]}" for k in range(n))
                    sent += n
                    self._event({"choices": [{"index": 0, "text": text, "finish_reason": None}]})
                final = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                         "usage": {"prompt_tokens": 5, "completion_tokens": tokens}}  # fmt: skip
                if fake.meta_info:
                    final["meta_info"] = {"spec_verify_ct": steps, "completion_tokens": tokens}
                self._event(final)
                self._write(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def _event(self, event: dict) -> None:
                self._write(b"data: " + json.dumps(event).encode() + b"\n\n")

            def _write(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeSglang:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)
