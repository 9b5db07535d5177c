"""gpudoctor/bench/load/signal_names.py: which engine's Prometheus names a /metrics text
serves, and the sample names a scrape keeps for it."""

from __future__ import annotations

from gpudoctor.bench.load.signal_names import DIALECTS, SIGNALS, dialect_of_text, wanted_names


def test_the_dialect_is_read_from_the_sample_lines():
    vllm = '# HELP vllm:num_requests_running Number\nvllm:num_requests_running{model="m"} 1\n'
    assert dialect_of_text(vllm) == "vllm"
    assert dialect_of_text("sglang:token_usage 0.5") == "sglang"  # the first line counts
    assert dialect_of_text("python_gc_objects_collected_total 3\nsglang:num_queue_reqs 0\n") == (
        "sglang"
    )


def test_a_name_only_in_a_comment_or_inside_a_line_names_no_dialect():
    assert dialect_of_text("# HELP vllm:num_requests_running x\n# TYPE sglang:x gauge\n") is None
    assert dialect_of_text('process_cpu{job="vllm:x"} 1\nxsglang:token_usage 1\n') is None
    assert dialect_of_text("") is None


def test_vllm_wins_when_a_server_serves_both():
    assert dialect_of_text("sglang:token_usage 1\nvllm:num_requests_running 2\n") == "vllm"


def test_a_scrape_keeps_each_signals_sample_and_its_denominator():
    assert wanted_names("vllm") == {
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prefix_cache_queries_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    }
    assert wanted_names("sglang") == {
        "sglang:token_usage",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:num_retracted_requests_total",
        "sglang:cache_hit_rate",
        "sglang:spec_accept_length",
    }
    assert "" not in wanted_names("sglang")


def test_every_dialects_signal_is_a_known_signal():
    for sources in DIALECTS.values():
        assert set(sources) <= set(SIGNALS)
