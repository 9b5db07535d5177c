"""gpudoctor/bench/load/accept_length.py: the cell's accept length from the requests' own
counts, or from SGLang's /server_info after a /flush_cache, each read from a real HTTP
server on loopback answering as SGLang does (tests/fakes/sglang.py runs whole cells)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from gpudoctor.bench.load.accept_length import (
    MAX_INFO_BYTES,
    flush_cache,
    from_records,
    from_server_info,
    query_server_info,
)
from gpudoctor.bench.request_record import RequestRecord


class InfoServer(ThreadingHTTPServer):
    """Answers each path from ``routes`` ({path: (status, body bytes)}), 404 otherwise;
    ``asked`` lists the (method, path) of every request in order."""

    def __init__(self, routes: dict[str, tuple[int, bytes]]) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.routes = routes
        self.asked: list[tuple[str, str]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    server: InfoServer

    def answer(self) -> None:
        path = self.requestline.split()[1]  # as sent: http.server folds a leading "//"
        self.server.asked.append((self.command, path))
        status, body = self.server.routes.get(path, (404, b"not found"))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def serve() -> Iterator:
    servers: list[InfoServer] = []

    def start(routes: dict[str, tuple[int, bytes]]) -> InfoServer:
        server = InfoServer(routes)
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def info(value: object) -> bytes:
    return json.dumps({"internal_states": [{"avg_spec_accept_length": value}]}).encode()


def ask(coro_of_client) -> object:
    async def main() -> object:
        async with httpx.AsyncClient() as client:
            return await coro_of_client(client)

    return asyncio.run(main())


# ---------------------------------------------------------------------------- the requests


def record(k: int, ok: bool, tokens: int, steps: int | None) -> RequestRecord:
    return RequestRecord(k, 1, tokens, 0.0, ok=ok, output_tokens=tokens, spec_verify_ct=steps)


def test_the_requests_accept_length_is_their_tokens_over_their_verify_steps():
    rows = [record(0, True, 8, 4), record(1, True, 9, 2), record(2, False, 50, 5)]
    assert from_records(rows) == pytest.approx(17 / 6)  # the failed request is left out


def test_the_servers_own_token_count_goes_with_its_verify_steps():
    """A speculative server's chunks carry several tokens: the tokens that arrived (the
    chunks, unless the text is kept) undercount, while its usage and its verify steps are
    both the server's own: the ratio takes usage where it came (issue 45.1)."""
    chunky = replace(record(0, True, 4, 4), usage_completion_tokens=8)
    assert from_records([chunky, record(1, True, 6, 2)]) == pytest.approx(14 / 6)


def test_requests_without_verify_steps_are_left_out():
    rows = [record(0, True, 8, 4), record(1, True, 100, 0), record(2, True, 100, None)]
    assert from_records(rows) == 2.0
    assert from_records(rows[1:]) is None
    assert from_records([]) is None


# ---------------------------------------------------------------------------- server_info


def test_server_info_gives_the_first_schedulers_average():
    states = {"internal_states": [{"avg_spec_accept_length": 3}, {"avg_spec_accept_length": 9}]}
    value = from_server_info(states)
    assert value == 3.0 and isinstance(value, float)


def test_a_disaggregated_server_gives_its_first_decode_servers_average():
    pd = {
        "internal_states": [{"avg_spec_accept_length": 1.0}],
        "decode": [{"internal_states": [{"avg_spec_accept_length": 2.5}]}, {}],
    }
    assert from_server_info(pd) == 2.5
    no_decode = {"decode": [], "internal_states": [{"avg_spec_accept_length": 1.5}]}
    assert from_server_info(no_decode) == 1.5
    odd = {"decode": {"internal_states": []}, "internal_states": [{"avg_spec_accept_length": 4}]}
    assert from_server_info(odd) == 4.0


@pytest.mark.parametrize(
    "body",
    [
        {"internal_states": []},
        {"internal_states": {"avg_spec_accept_length": 2.0}},
        {"internal_states": ["avg_spec_accept_length"]},
        {"internal_states": [{"avg_spec_accept_length": "2.0"}]},
        {"internal_states": [{"avg_spec_accept_length": None}]},
        {},
    ],
)
def test_server_info_without_a_number_gives_none(body):
    assert from_server_info(body) is None


# ---------------------------------------------------------------------------- over HTTP


def test_a_flush_answered_200_is_a_success(serve):
    server = serve({"/flush_cache": (200, b"")})
    assert ask(lambda c: flush_cache(c, server.url + "/", "/flush_cache")) is None
    assert ask(lambda c: flush_cache(c, server.url + "//", "/flush_cache")) is None
    assert server.asked == [("POST", "/flush_cache")] * 2


def test_a_server_behind_a_path_prefix_is_asked_under_it(serve):
    """A reverse proxy serving SGLang under /sglX: the prefix is kept whole."""
    server = serve({"/sglX/flush_cache": (200, b""), "/sglX/server_info": (200, info(1.5))})
    assert ask(lambda c: flush_cache(c, server.url + "/sglX/", "/flush_cache")) is None
    assert ask(lambda c: query_server_info(c, server.url + "/sglX")) == 1.5


def test_a_refused_flush_says_its_status(serve):
    server = serve({"/flush_cache": (400, b"busy")})
    assert ask(lambda c: flush_cache(c, server.url, "/flush_cache")) == "HTTP 400"


def test_a_flush_that_cannot_connect_names_the_error(serve):
    server = serve({})
    url = server.url
    server.shutdown()
    server.server_close()
    error = ask(lambda c: flush_cache(c, url, "/flush_cache"))
    assert error is not None and error.startswith("ConnectError: ")


def test_the_new_server_info_path_is_asked_first(serve):
    server = serve({"/server_info": (200, info(2.0)), "/get_server_info": (200, info(9.0))})
    assert ask(lambda c: query_server_info(c, server.url + "/")) == 2.0
    assert ask(lambda c: query_server_info(c, server.url + "//")) == 2.0
    assert server.asked == [("GET", "/server_info")] * 2


def test_an_older_server_is_asked_its_get_server_info(serve):
    server = serve({"/get_server_info": (200, info(3.5))})
    assert ask(lambda c: query_server_info(c, server.url)) == 3.5
    assert server.asked == [("GET", "/server_info"), ("GET", "/get_server_info")]


def test_a_server_with_neither_path_gives_none(serve):
    server = serve({})
    assert ask(lambda c: query_server_info(c, server.url)) is None
    assert [p for _, p in server.asked] == ["/server_info", "/get_server_info"]


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", json.dumps({"x": 1}).encode()])
def test_a_body_that_is_no_server_info_gives_none(serve, body):
    server = serve({"/server_info": (200, body), "/get_server_info": (200, info(2.0))})
    assert ask(lambda c: query_server_info(c, server.url)) is None
    assert [p for _, p in server.asked] == ["/server_info"]  # the answer was that body


def test_a_body_of_exactly_the_limit_is_read_and_one_byte_more_is_not(serve):
    head = b'{"internal_states": [{"avg_spec_accept_length": 2.5}], "pad": "'
    exact = head + b"x" * (MAX_INFO_BYTES - len(head) - 2) + b'"}'
    assert len(exact) == MAX_INFO_BYTES == 4 * 1024 * 1024
    over = exact[:-2] + b'x"}'
    server = serve({"/server_info": (200, exact), "/get_server_info": (200, over)})
    assert ask(lambda c: query_server_info(c, server.url)) == 2.5
    server.routes["/server_info"] = (200, over)
    assert ask(lambda c: query_server_info(c, server.url)) is None


def test_a_server_that_cannot_be_reached_gives_none(serve):
    server = serve({})
    url = server.url
    server.shutdown()
    server.server_close()
    assert ask(lambda c: query_server_info(c, url)) is None
