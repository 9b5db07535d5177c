"""gpudoctor/bench/load/scraper.py: from the samples a cell scraped to each signal's figures
(or why it is not available, never a 0), how label sets are combined, and the fetcher's
refusals, against a real loopback server (tests/bench/metrics_server.py) where it speaks
HTTP. test_scraper.py reads the engines' recorded expositions end to end."""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpudoctor.bench.load.scraper import (
    MAX_BODY,
    SERIES_POINTS,
    Fetcher,
    MetricsScraper,
    parse_samples,
    reduce_samples,
    summarize,
)
from gpudoctor.bench.load.signal_names import SIGNALS
from tests.bench.metrics_server import MetricsServer

VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"


# ---------------------------------------------------------------------------- parsing


def test_only_the_kept_names_are_parsed_with_their_labels():
    text = (
        "# HELP vllm:num_requests_running Running.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} 3.0\n'
        'vllm:num_requests_running{engine="1"} 4.0\n'
        "vllm:num_requests_waiting 2.0\n"
        "process_cpu_seconds_total 9.0\n"
    )
    assert parse_samples(text, frozenset({"vllm:num_requests_running"})) == {
        "vllm:num_requests_running": [({"engine": "0"}, 3.0), ({"engine": "1"}, 4.0)]
    }
    everything = parse_samples(text)
    assert set(everything) == {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "process_cpu_seconds_total",
    }


def test_a_kept_prefix_does_not_keep_a_longer_name():
    text = "vllm:num_requests_running_extra 7\nvllm:num_requests_running 1\n"
    assert parse_samples(text, frozenset({"vllm:num_requests_running"})) == {
        "vllm:num_requests_running": [({}, 1.0)]
    }


def test_fractions_are_averaged_over_label_sets_and_counts_summed():
    parsed = {
        "vllm:kv_cache_usage_perc": [({"engine": "0"}, 0.2), ({"engine": "1"}, 0.6)],
        "vllm:num_requests_running": [({"engine": "0"}, 3.0), ({"engine": "1"}, 4.0)],
        VLLM_PER_POS: [
            ({"position": "0", "engine": "0"}, 5.0),
            ({"position": "0", "engine": "1"}, 2.0),
            ({"position": "1", "engine": "0"}, 1.0),
            ({"engine": "1"}, 9.0),
        ],
    }
    assert reduce_samples(parsed, "vllm") == {
        "vllm:kv_cache_usage_perc": pytest.approx(0.4),
        "vllm:num_requests_running": 7.0,
        VLLM_PER_POS: {"0": 7.0, "1": 1.0, "?": 9.0},
    }


def test_sglangs_fractions_are_averaged_and_its_counts_summed():
    parsed = {
        "sglang:cache_hit_rate": [({"dp": "0"}, 0.5), ({"dp": "1"}, 0.25)],
        "sglang:spec_accept_length": [({"dp": "0"}, 2.0), ({"dp": "1"}, 3.0)],
        "sglang:token_usage": [({"dp": "0"}, 0.1), ({"dp": "1"}, 0.3)],
        "sglang:num_queue_reqs": [({"dp": "0"}, 2.0), ({"dp": "1"}, 5.0)],
    }
    assert reduce_samples(parsed, "sglang") == {
        "sglang:cache_hit_rate": 0.375,
        "sglang:spec_accept_length": 2.5,
        "sglang:token_usage": pytest.approx(0.2),
        "sglang:num_queue_reqs": 7.0,
    }


# ---------------------------------------------------------------------------- summarizing


def test_without_samples_every_signal_says_why():
    for why, expected in [("HTTP 404", "HTTP 404"), (None, "no dialect recognised")]:
        out = summarize([], None, why)
        assert out == {s: {"available": False, "why": expected} for s in SIGNALS}
    assert summarize([(0.0, {"sglang:token_usage": 1.0})], "sglang", "broken")["running"] == {
        "available": False, "why": "broken"
    }  # fmt: skip


def test_a_gauge_gives_its_mean_max_last_and_series():
    samples = [(0.0, {"vllm:num_requests_running": 2.0}), (0.51234, {}),
               (1.0004, {"vllm:num_requests_running": 6.0}),
               (2.0, {"vllm:num_requests_running": 1.0})]  # fmt: skip
    running = summarize(samples, "vllm", None)["running"]
    assert running == {
        "available": True,
        "value": 3.0,
        "mean": 3.0,
        "max": 6.0,
        "last": 1.0,
        "series": [[0.0, 2.0], [1.0, 6.0], [2.0, 1.0]],
        "source": "vllm:num_requests_running",
    }


def test_a_long_gauge_series_is_thinned_evenly():
    n = 2 * SERIES_POINTS + 1
    samples = [(k / 10, {"vllm:num_requests_waiting": float(k)}) for k in range(n)]
    waiting = summarize(samples, "vllm", None)["waiting"]
    assert len(waiting["series"]) == SERIES_POINTS + 1 == 121
    assert waiting["series"][:2] == [[0.0, 0.0], [0.2, 2.0]]
    assert waiting["max"] == n - 1 and waiting["last"] == n - 1
    short = summarize(samples[: SERIES_POINTS + 1], "vllm", None)["waiting"]
    assert len(short["series"]) == SERIES_POINTS + 1  # under 2 x 120: every sample kept


def test_a_counter_gives_its_growth_during_the_cell():
    name = "vllm:num_preemptions_total"
    samples = [(0.0, {name: 5.0}), (1.0, {name: 6.0}), (2.0, {name: 9.0})]
    assert summarize(samples, "vllm", None)["preemptions"] == {
        "available": True, "value": 4.0, "source": name
    }  # fmt: skip


def test_a_signal_not_served_says_which_name_is_missing():
    out = summarize([(0.0, {"vllm:num_requests_running": 1.0})], "vllm", None)
    assert out["kv_cache_usage"] == {
        "available": False, "why": "vllm:kv_cache_usage_perc not served"
    }  # fmt: skip
    assert out["running"]["available"] is True


def test_a_signal_the_dialect_lacks_says_so():
    out = summarize([(0.0, {"sglang:token_usage": 0.5})], "sglang", None)
    assert out["spec_accept_histogram"] == {
        "available": False, "why": "sglang exports no such metric"
    }  # fmt: skip


def test_the_prefix_cache_hit_rate_is_hits_over_queries_during_the_cell():
    samples = [(0.0, {HITS: 100.0, QUERIES: 1000.0}), (1.0, {HITS: 400.0, QUERIES: 2000.0})]
    assert summarize(samples, "vllm", None)["prefix_cache_hit_rate"] == {
        "available": True, "value": 0.3, "source": HITS
    }  # fmt: skip


def test_no_queries_during_the_cell_is_not_a_zero_rate():
    samples = [(0.0, {HITS: 1.0, QUERIES: 10.0}), (1.0, {HITS: 1.0, QUERIES: 10.0})]
    assert summarize(samples, "vllm", None)["prefix_cache_hit_rate"] == {
        "available": False, "why": f"no queries during the cell ({QUERIES})"
    }  # fmt: skip
    fewer = [(0.0, {HITS: 1.0, QUERIES: 10.0}), (1.0, {HITS: 1.0, QUERIES: 9.0})]  # a restart
    assert summarize(fewer, "vllm", None)["prefix_cache_hit_rate"]["available"] is False
    no_den = [(0.0, {HITS: 1.0}), (1.0, {HITS: 3.0})]
    assert summarize(no_den, "vllm", None)["prefix_cache_hit_rate"] == {
        "available": False, "why": f"{QUERIES} not served"
    }  # fmt: skip


def test_the_accept_length_is_one_plus_accepted_per_draft():
    samples = [(0.0, {VLLM_ACCEPTED: 100.0, VLLM_DRAFTS: 50.0}),
               (1.0, {VLLM_ACCEPTED: 400.0}),
               (2.0, {VLLM_ACCEPTED: 500.0, VLLM_DRAFTS: 250.0})]  # fmt: skip
    assert summarize(samples, "vllm", None)["spec_accept_length"] == {
        "available": True, "value": 3.0, "source": VLLM_ACCEPTED
    }  # fmt: skip
    idle = [
        (0.0, {VLLM_ACCEPTED: 1.0, VLLM_DRAFTS: 5.0}),
        (1.0, {VLLM_ACCEPTED: 1.0, VLLM_DRAFTS: 5.0}),
    ]
    assert summarize(idle, "vllm", None)["spec_accept_length"] == {
        "available": False, "why": f"no drafts during the cell ({VLLM_DRAFTS})"
    }  # fmt: skip


def test_the_histogram_is_each_positions_acceptance_per_draft_in_position_order():
    first = {VLLM_PER_POS: {"0": 10.0, "2": 1.0}, VLLM_DRAFTS: 100.0}
    last = {VLLM_PER_POS: {"10": 5.0, "2": 21.0, "0": 90.0, "x": 4.0, "1": 60.0},
            VLLM_DRAFTS: 200.0}  # fmt: skip
    hist = summarize([(0.0, first), (1.0, last)], "vllm", None)["spec_accept_histogram"]
    assert hist == {
        "available": True,
        "value": {"0": 0.8, "1": 0.6, "2": 0.2, "10": 0.05, "x": 0.04},
        "source": VLLM_PER_POS,
    }
    assert list(hist["value"]) == ["0", "1", "2", "10", "x"]


def test_a_value_the_signal_cannot_read_is_dropped_never_a_crash():
    """Issue 46.5: ``vllm:num_preemptions_total{position="0"} 3`` made the counter a
    ``{position: value}`` and the summary raised TypeError, stopping the campaign. Each
    sample's value is type-checked: a dict where a number is read, a number where a
    per-position dict is read, a bool, NaN or Inf is dropped; the rest still counts."""
    name = "vllm:num_preemptions_total"
    parsed = parse_samples(f'{name}{{position="0"}} 3\n', frozenset({name}))
    late = reduce_samples(parse_samples(f'{name}{{position="0"}} 5\n', frozenset({name})), "vllm")
    samples = [(0.0, reduce_samples(parsed, "vllm")), (1.0, late)]
    assert samples[0][1] == {name: {"0": 3.0}}
    assert summarize(samples, "vllm", None)["preemptions"] == {
        "available": False, "why": f"{name} served with no finite value of its kind"
    }  # fmt: skip
    kv = "vllm:kv_cache_usage_perc"
    gauge = [(0.0, {kv: float("nan")}), (1.0, {kv: 0.5}), (2.0, {kv: float("inf")}),
             (3.0, {kv: True}), (4.0, {kv: {"0": 1.0}}), (5.0, {kv: 1})]  # fmt: skip
    assert summarize(gauge, "vllm", None)["kv_cache_usage"] == {
        "available": True, "value": 0.75, "mean": 0.75, "max": 1, "last": 1,
        "series": [[1.0, 0.5], [5.0, 1]], "source": kv,
    }  # fmt: skip
    counted = [(0.0, {name: 2.0}), (1.0, {name: float("-inf")}), (2.0, {name: 7})]
    assert summarize(counted, "vllm", None)["preemptions"]["value"] == 5
    hist = [(0.0, {VLLM_PER_POS: {"0": 1.0}, VLLM_DRAFTS: 10.0}),
            (1.0, {VLLM_PER_POS: 4.0, VLLM_DRAFTS: float("nan")}),
            (2.0, {VLLM_PER_POS: {"0": float("nan")}, VLLM_DRAFTS: 20.0}),
            (3.0, {VLLM_PER_POS: {"0": 6.0}, VLLM_DRAFTS: 30.0})]  # fmt: skip
    assert summarize(hist, "vllm", None)["spec_accept_histogram"]["value"] == {"0": 0.25}
    nan_den = [(0.0, {HITS: 1.0, QUERIES: float("nan")}), (1.0, {HITS: 2.0, QUERIES: float("nan")})]
    assert summarize(nan_den, "vllm", None)["prefix_cache_hit_rate"] == {
        "available": False, "why": f"{QUERIES} not served"
    }  # fmt: skip


# ---------------------------------------------------------------------------- fetching


def test_the_fetcher_keeps_the_path_and_query_of_the_url():
    f = Fetcher("https://gpu1:8443/prom/metrics?name=x", 5.0)
    assert (f.https, f.host, f.port, f.path) == (True, "gpu1", 8443, "/prom/metrics?name=x")
    g = Fetcher("http://127.0.0.1:9000", 5.0)
    assert (g.https, g.path, g.timeout_s, g.url) == (False, "/", 5.0, "http://127.0.0.1:9000")
    assert Fetcher("http:///metrics", 1.0).host == "127.0.0.1"


def test_a_server_that_closes_after_each_reply_is_scraped_on_a_new_connection():
    """http.server answers HTTP/1.0 (Connection: close), as a minimal exporter does."""
    with MetricsServer([b"a 1\n", b"a 2\n"]) as srv, Fetcher(srv.url, 10.0) as fetcher:
        assert fetcher.get() == b"a 1\n"
        assert fetcher._conn is None
        assert fetcher.get() == b"a 2\n"
        assert srv.scraped(2)


def test_a_status_other_than_200_is_an_error_naming_the_url():
    with (
        MetricsServer([b"gone"], status=503) as srv,
        Fetcher(srv.url, 10.0) as fetcher,
        pytest.raises(RuntimeError) as error,
    ):
        fetcher.get()
    assert str(error.value) == f"GET {srv.url}: HTTP 503"


def test_a_reply_over_the_cap_is_refused_and_one_at_the_cap_read():
    at_cap = b"#" * MAX_BODY
    with MetricsServer([at_cap, at_cap + b"#"]) as srv, Fetcher(srv.url, 10.0) as fetcher:
        assert fetcher.get() == at_cap
        with pytest.raises(RuntimeError, match=rf"^GET {srv.url}: reply over {MAX_BODY} bytes$"):
            fetcher.get()
        assert fetcher._conn is None  # the rest of that reply is never read: a new connection
        with pytest.raises(RuntimeError, match="reply over"):
            fetcher.get()  # a new connection, the same refusal
        assert srv.scraped(3)


def test_a_closed_server_is_an_oserror_and_the_next_scrape_reconnects():
    with MetricsServer([b"a 1\n"]) as srv:
        url = srv.url
    with Fetcher(url, 5.0) as fetcher:
        with pytest.raises((OSError, http.client.HTTPException)):
            fetcher.get()
        assert fetcher._conn is None
    with MetricsServer([b"a 1\n"]) as srv, Fetcher(srv.url, 5.0) as fetcher:
        assert fetcher.get() == b"a 1\n"


# ---------------------------------------------------------------------------- the scraper


def test_a_server_serving_neither_dialect_is_a_failure_that_names_it():
    with MetricsServer([b"process_cpu_seconds_total 1\n"]) as srv:
        scraper = MetricsScraper(srv.url)
        with Fetcher(srv.url, 10.0) as fetcher:
            scraper.scrape_once(fetcher, 0.0)
    assert scraper.failures == [f"RuntimeError: {srv.url} serves neither vllm: nor sglang: metrics"]
    summary = scraper.summary()
    assert (summary["scrapes"], summary["failed"], summary["dialect"]) == (1, 1, None)
    assert summary["first_error"] == scraper.failures[0]
    assert summary["signals"]["running"]["why"] == scraper.failures[0]


def test_a_long_failure_is_cut_to_200_characters():
    with MetricsServer([b"a 1\n"], status=500, path="/" + "m" * 300) as srv:
        scraper = MetricsScraper(srv.url)
        with Fetcher(srv.url, 10.0) as fetcher:
            scraper.scrape_once(fetcher, 0.0)
    assert scraper.failures == [f"RuntimeError: GET {srv.url}: HTTP 500"[:200]]
    assert len(scraper.failures[0]) == 200


def test_a_scraper_that_never_scraped_says_so():
    scraper = MetricsScraper("http://127.0.0.1:9/metrics")
    summary = scraper.summary()
    assert summary["signals"]["running"] == {
        "available": False, "why": "no scrape finished during the cell"
    }  # fmt: skip
    assert (summary["url"], summary["interval_s"], summary["first_error"]) == (
        "http://127.0.0.1:9/metrics", 1.0, None)  # fmt: skip
    assert MetricsScraper(None).summary()["signals"]["running"]["why"] == (
        "the engine serves no /metrics"
    )


def test_the_dialect_is_read_once_and_later_scrapes_keep_only_its_names():
    vllm = b"vllm:num_requests_running 2\nsglang:num_queue_reqs 9\n"
    with MetricsServer([vllm, b"vllm:num_requests_running 4\nextra_total 1\n"]) as srv:
        scraper = MetricsScraper(srv.url)
        with Fetcher(srv.url, 10.0) as fetcher:
            scraper.scrape_once(fetcher, 0.0)
            scraper.scrape_once(fetcher, 1.5)
    assert scraper.dialect == "vllm"
    assert scraper.samples == [
        (0.0, {"vllm:num_requests_running": 2.0}),
        (1.5, {"vllm:num_requests_running": 4.0}),
    ]


# ---------------------------------------------------------------------------- connections


class KeepAliveHandler(BaseHTTPRequestHandler):
    """Answers HTTP/1.1 with a Content-Length and keeps the connection open, as vLLM's
    and SGLang's servers do; ``/drop`` closes it without an answer; ``/huge`` sends a
    body over the fetcher's cap; ``/hang`` answers nothing until the test ends."""

    protocol_version = "HTTP/1.1"
    release = threading.Event()

    def do_GET(self) -> None:
        if self.path == "/hang":
            self.release.wait(30)
            self.close_connection = True
            return
        if self.path == "/endless":  # announces 1 GiB, sends past the cap, then waits
            self.send_response(200)
            self.send_header("Content-Length", str(1 << 30))
            self.end_headers()
            self.wfile.write(b"#" * (MAX_BODY + 10))
            self.wfile.flush()
            self.release.wait(30)
            self.close_connection = True
            return
        if self.path == "/drop":
            self.close_connection = True
            return
        body = b"#" * (MAX_BODY + 1) if self.path == "/huge" else b"vllm:num_requests_running 1\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def keep_alive():
    server = ThreadingHTTPServer(("127.0.0.1", 0), KeepAliveHandler)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    KeepAliveHandler.release.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    KeepAliveHandler.release.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def opened(monkeypatch):
    """Record every HTTPConnection the fetcher opens (``sock`` is None once closed)."""
    made: list[http.client.HTTPConnection] = []

    class Recorded(http.client.HTTPConnection):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(http.client, "HTTPConnection", Recorded)
    return made


def test_a_kept_alive_connection_serves_every_scrape_and_is_closed_at_the_end(keep_alive, opened):
    with Fetcher(keep_alive + "/metrics", 10.0) as fetcher:
        assert fetcher.get() == fetcher.get() == b"vllm:num_requests_running 1\n"
        assert len(opened) == 1 and opened[0].sock is not None
    assert opened[0].sock is None  # no socket left open after the cell


def test_a_broken_connection_is_closed_and_the_next_scrape_opens_another(keep_alive, opened):
    with Fetcher(keep_alive + "/drop", 10.0) as fetcher:
        with pytest.raises((OSError, http.client.HTTPException)):
            fetcher.get()
        assert opened[0].sock is None and fetcher._conn is None


def test_a_scrape_that_times_out_closes_its_connection(keep_alive, opened):
    """http.client closes a connection the server reset, not one that timed out."""
    with Fetcher(keep_alive + "/hang", 0.2) as fetcher:
        with pytest.raises(TimeoutError):
            fetcher.get()
        assert opened[0].sock is None and fetcher._conn is None


def test_a_reply_over_the_cap_closes_its_connection(keep_alive, opened):
    with Fetcher(keep_alive + "/huge", 10.0) as fetcher:
        with pytest.raises(RuntimeError, match="reply over"):
            fetcher.get()
        assert opened[0].sock is None and fetcher._conn is None


def test_the_thread_scrapes_in_seconds_into_the_cell_and_its_last_scrape_succeeds():
    began = time.perf_counter()
    with MetricsServer([b"vllm:num_requests_running 1\n"]) as srv:
        with MetricsScraper(srv.url, interval_s=0.01) as scraper:
            assert srv.scraped(3)
            thread = scraper._thread
            assert thread.name == "metrics-scraper" and thread.daemon  # never holds the exit
        took = time.perf_counter() - began
    assert scraper.failures == [] and scraper.scrapes == len(scraper.samples) >= 4
    times = [t for t, _ in scraper.samples]
    assert times == sorted(times) and all(0 <= t <= took for t in times)


def test_a_scraper_that_never_ran_cost_no_cpu():
    assert MetricsScraper(None).summary()["cpu_s"] == 0.0


def test_the_fetcher_asks_for_the_text_format(keep_alive, opened, monkeypatch):
    sent: list[dict] = []
    original = http.client.HTTPConnection.request

    def request(self, method, url, body=None, headers=None, **kw):
        sent.append(dict(headers or {}))
        return original(self, method, url, body, headers or {}, **kw)

    monkeypatch.setattr(http.client.HTTPConnection, "request", request)
    with Fetcher(keep_alive + "/metrics", 10.0) as fetcher:
        fetcher.get()
    assert sent == [{"Accept": "text/plain"}]  # not OpenMetrics, which the parser does not read


def test_an_https_url_is_fetched_over_tls(keep_alive):
    """A plain HTTP server answers no TLS handshake: the fetcher spoke TLS to it."""
    url = keep_alive.replace("http://", "https://") + "/metrics"
    with Fetcher(url, 10.0) as fetcher, pytest.raises(ssl.SSLError):
        fetcher.get()


def test_a_huge_announced_reply_is_not_read_whole(keep_alive):
    """A hostile server announcing 1 GiB and sending a little more than the cap: the reply
    is refused after the cap, never read to its announced end."""
    with Fetcher(keep_alive + "/endless", 5.0) as fetcher, pytest.raises(RuntimeError):
        fetcher.get()


def test_the_denominator_is_its_growth_from_the_first_to_the_last_sample():
    samples = [(0.0, {HITS: 0.0, QUERIES: 100.0}), (1.0, {HITS: 5.0, QUERIES: 150.0}),
               (2.0, {HITS: 40.0, QUERIES: 200.0})]  # fmt: skip
    assert summarize(samples, "vllm", None)["prefix_cache_hit_rate"]["value"] == 0.4
    one = [(0.0, {HITS: 0.0, QUERIES: 100.0}), (1.0, {HITS: 1.0, QUERIES: 101.0})]
    assert summarize(one, "vllm", None)["prefix_cache_hit_rate"]["value"] == 1.0  # one query


# ---------------------------------------------------------------------------- short cells

RUNNING = "vllm:num_requests_running"


def test_a_gauge_counts_only_the_scrapes_taken_under_load():
    samples = [
        (0.0, {RUNNING: 0.0}),
        (0.5, {RUNNING: 4.0}),
        (1.0, {RUNNING: 2.0}),
        (2.0, {RUNNING: 0.0}),
    ]
    running = summarize(samples, "vllm", None, loaded=[False, True, True, False])["running"]
    assert (running["value"], running["max"], running["last"], running["loaded_scrapes"]) == (
        3.0,
        4.0,
        2.0,
        2,
    )
    assert [v for _, v in running["series"]] == [0.0, 4.0, 2.0, 0.0]  # the series keeps them all


def test_a_cell_shorter_than_the_interval_states_no_gauge_but_its_counters():
    samples = [
        (0.0, {RUNNING: 0.0, "vllm:num_preemptions_total": 2.0}),
        (1.0, {RUNNING: 0.0, "vllm:num_preemptions_total": 5.0}),
    ]
    out = summarize(samples, "vllm", None, loaded=[False, False])
    assert out["running"]["available"] is False
    assert "shorter than the scrape interval" in out["running"]["why"]
    assert "2 scrapes" in out["running"]["why"]
    assert out["running"]["series"] == [[0.0, 0.0], [1.0, 0.0]]  # what the server said, kept
    assert out["preemptions"] == {
        "available": True,
        "value": 3.0,
        "source": "vllm:num_preemptions_total",
    }


def _scraped(starts_ends: list[tuple[float, float]]) -> MetricsScraper:
    """A scraper holding samples asked at each start and answered at each end."""
    scraper = MetricsScraper("http://127.0.0.1:1/metrics", 1.0)
    scraper.dialect = "vllm"
    scraper.samples = [(a, {RUNNING: float(i)}) for i, (a, _) in enumerate(starts_ends)]
    scraper.answered = [b for _, b in starts_ends]
    return scraper


def test_a_scrape_counts_only_when_asked_and_answered_inside_one_busy_span():
    scraper = _scraped([(0.0, 0.05), (0.2, 0.25), (0.45, 0.55), (1.0, 1.01)])
    t0 = scraper.t0
    busy = [(t0 + 0.1, t0 + 0.3), (t0 + 0.25, t0 + 0.5), (t0 + 0.9, t0 + 0.95)]
    running = scraper.summary(busy=busy)["signals"]["running"]
    # 0.0-0.05 before the load, 0.45-0.55 answered after the union 0.1-0.5 ended,
    # 1.0-1.01 after the last span: only the 0.2-0.25 scrape saw the load
    assert (running["value"], running["loaded_scrapes"]) == (1.0, 1)


def test_spans_that_touch_are_one_span_and_a_scrape_may_end_where_the_load_ends():
    """The edges: a request sent the instant another ends keeps the load continuous (one
    span), and a scrape answered at the very end of a span was still under load."""
    from gpudoctor.bench.load.scraper import _union, _within

    assert _union([(0.2, 0.4), (0.0, 0.2)]) == ([0.0], [0.4])
    assert _union([(0.0, 0.2), (0.3, 0.4)]) == ([0.0, 0.3], [0.2, 0.4])
    spans = _union([(0.0, 0.2), (0.2, 0.4)])
    assert _within(0.1, 0.4, spans) and _within(0.0, 0.4, spans)
    assert not _within(0.1, 0.41, spans) and not _within(-0.01, 0.1, spans)


def test_a_short_cell_between_two_scrapes_states_no_gauge():
    scraper = _scraped([(0.0, 0.004), (0.04, 0.045)])
    busy = [(scraper.t0 + 0.002, scraper.t0 + 0.03)]
    signals = scraper.summary(busy=busy)["signals"]
    assert signals["running"]["available"] is False
    assert signals["waiting"]["available"] is False
    assert scraper.summary()["signals"]["running"]["available"] is True  # without spans: all count


def test_busy_spans_place_each_sent_request_on_the_perf_counter():
    from gpudoctor.bench.load.scraper import busy_spans
    from gpudoctor.bench.request_record import RequestRecord

    records = [
        RequestRecord(index=0, prompt_len=1, max_tokens=1, send_s=0.5, ok=True, wall_s=1.0),
        RequestRecord(index=1, prompt_len=1, max_tokens=1, send_s=2.0, ok=False),  # never sent
    ]
    assert busy_spans(records, duration_s=3.0, end=10.0) == [(7.5, 8.5)]


def test_the_first_scrapes_come_quicker_than_the_interval():
    assert MetricsScraper("http://127.0.0.1:1/metrics", 1.0).waits() == [0.1, 0.2, 0.4, 1.0]
    assert MetricsScraper("http://127.0.0.1:1/metrics", 0.2).waits() == [0.1, 0.2]
