"""A real HTTP server on 127.0.0.1 that serves ``/metrics`` as an engine does.

It stands in for the ``/metrics`` endpoint of vLLM or SGLang (a GPU server that cannot
run here): it replies with recorded texts (tests/bench/data/metrics/*.prom, the exact
exposition of each engine's own metric definitions), the first text to the first
scrape, the next to the next, the last one from then on. ``scraped(n)`` waits, by event,
until ``n`` scrapes were answered.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DATA = Path(__file__).parent / "data" / "metrics"


def recorded(engine: str) -> list[bytes]:
    """Return the recorded start and end texts of ``engine`` (``vllm``, ``sglang``)."""
    return [(DATA / f"{engine}-{step}.prom").read_bytes() for step in ("start", "end")]


class MetricsServer:
    """``with MetricsServer(texts) as srv:`` serves them at ``srv.url`` (``.../metrics``);
    ``status`` other than 200 answers every scrape with that status instead."""

    def __init__(self, texts: list[bytes], status: int = 200, path: str = "/metrics") -> None:
        self.texts, self.status, self.path = texts, status, path
        self.count = 0  # replies written
        self.asked = 0  # requests received
        self._cond = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with outer._cond:  # the text by request order, not by replies finished
                    body = outer.texts[min(outer.asked, len(outer.texts) - 1)]
                    outer.asked += 1
                    status = outer.status if self.path == outer.path else 404
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                with outer._cond:
                    outer.count += 1
                    outer._cond.notify_all()

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}{path}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> MetricsServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def scraped(self, n: int, timeout: float = 30.0) -> bool:
        """Wait until ``n`` scrapes were answered; return False at ``timeout`` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: self.count >= n, timeout)
