"""The /metrics scraper against a real loopback HTTP server serving each engine's
recorded exposition (tests/bench/data/metrics, made from the engines' own metric
definitions): every signal read with the engine's names, and "not available" (never
0) for what a server does not export."""

from __future__ import annotations

import pytest

from gpudoctor.bench.load.scraper import Fetcher, MetricsScraper, parse_samples
from tests.bench.metrics_server import MetricsServer, recorded


def scrape_twice(texts: list[bytes], status: int = 200) -> dict:
    """Scrape the server once per text (start, end) without the thread; return the summary."""
    with MetricsServer(texts, status) as srv, Fetcher(srv.url, 10.0) as fetcher:
        scraper = MetricsScraper(srv.url)
        for t in (0.0, 1.0):
            scraper.scrape_once(fetcher, t)
        return scraper.summary()


def test_vllm_signals_from_its_own_names() -> None:
    summary = scrape_twice(recorded("vllm"))
    assert summary["dialect"] == "vllm" and summary["failed"] == 0
    s = summary["signals"]
    assert s["kv_cache_usage"]["max"] == pytest.approx(0.42)
    assert s["running"]["last"] == 7 and s["waiting"]["last"] == 3
    assert s["preemptions"]["value"] == 3  # 5 - 2 during the cell
    assert s["prefix_cache_hit_rate"]["value"] == pytest.approx(2000 / 8000)
    assert s["spec_accept_length"]["value"] == pytest.approx(1 + 800 / 400)
    assert s["spec_accept_histogram"]["value"] == pytest.approx(
        {"0": 360 / 400, "1": 280 / 400, "2": 160 / 400}
    )
    assert list(s["spec_accept_histogram"]["value"]) == ["0", "1", "2"]


def test_sglang_signals_and_its_missing_histogram() -> None:
    summary = scrape_twice(recorded("sglang"))
    assert summary["dialect"] == "sglang"
    s = summary["signals"]
    assert s["kv_cache_usage"]["last"] == pytest.approx(0.61)
    assert s["running"]["last"] == 12 and s["waiting"]["last"] == 4
    assert s["preemptions"]["value"] == 3
    assert s["prefix_cache_hit_rate"]["last"] == pytest.approx(0.37)
    assert s["spec_accept_length"]["last"] == pytest.approx(3.1)
    assert s["spec_accept_histogram"] == {
        "available": False, "why": "sglang exports no such metric"
    }  # fmt: skip


def test_no_spec_decoding_reads_not_available_not_zero() -> None:
    """A vLLM without a drafter serves no spec_decode counters: not available."""
    text = b"\n".join(
        line for line in recorded("vllm")[1].splitlines() if b"spec_decode" not in line
    )
    s = scrape_twice([text, text])["signals"]
    assert s["spec_accept_length"] == {
        "available": False, "why": "vllm:spec_decode_num_accepted_tokens_total not served"
    }  # fmt: skip
    assert s["prefix_cache_hit_rate"]["available"] is False  # no queries during the cell
    assert "no queries" in s["prefix_cache_hit_rate"]["why"]


def test_a_server_without_metrics_says_why() -> None:
    summary = scrape_twice([b"not found"], status=404)
    assert summary["scrapes"] == 2 and summary["failed"] == 2
    for entry in summary["signals"].values():
        assert entry["available"] is False
        assert "HTTP 404" in entry["why"]


def test_no_url_is_not_available_with_the_reason() -> None:
    with MetricsScraper(None, why_none="the plan sets no [engine] metrics_path") as scraper:
        pass
    entry = scraper.summary()["signals"]["kv_cache_usage"]
    assert entry == {"available": False, "why": "the plan sets no [engine] metrics_path"}


def test_the_thread_scrapes_during_the_cell_and_once_at_its_end() -> None:
    with MetricsServer(recorded("vllm")) as srv:
        with MetricsScraper(srv.url, interval_s=0.05) as scraper:
            assert srv.scraped(3)
        summary = scraper.summary()
    assert summary["scrapes"] >= 4  # the ones seen, plus the closing scrape
    assert summary["signals"]["preemptions"]["value"] == 3
    assert summary["cpu_s"] > 0


def test_parser_is_prometheus_clients_own() -> None:
    parsed = parse_samples(recorded("vllm")[1].decode())
    assert parsed["vllm:num_preemptions_total"] == [
        ({"engine": "0", "model_name": "Qwen/Qwen3-8B"}, 5.0)
    ]
    with pytest.raises(ValueError):
        parse_samples("this is { not prometheus")
