"""The server signals (scraped from the engine's /metrics during each cell) as a user
reads them: the closing table's columns, report.md's section, report.html's panels and
compare's lines. A signal the server did not export reads "not available" with why,
never 0; a run that scraped nothing shows nothing."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from gpudoctor.bench.results.reader import CellResult
from gpudoctor.bench.results.signals_view import (
    NOT_AVAILABLE,
    compare_lines,
    entry,
    histogram_text,
    html_panels,
    markdown_section,
    plain,
    table_columns,
    text,
    unavailable_reasons,
    value,
)

URL = "http://127.0.0.1:1/metrics"
ALL = {"kv_cache_usage": {"available": True, "value": 0.2, "max": 0.634},
       "running": {"available": True, "value": 3.0, "max": 8},
       "waiting": {"available": True, "value": 0.5, "max": 4},
       "preemptions": {"available": True, "value": 2},
       "prefix_cache_hit_rate": {"available": True, "value": 0.5, "max": 0.9},
       "spec_accept_length": {"available": True, "value": 2.414, "max": 3.0},
       "spec_accept_histogram": {"available": True, "value": {"1": 0.9, "2": 0.7, "3": 0.4}}}  # fmt: skip
NONE = {s: {"available": False, "why": f"the server exports no {s}"} for s in ALL}


def _cell(signals: dict | None, key: str = "k", config: str = "cfg", c: int = 4,
          url: str | None = URL, status: str = "ok") -> CellResult:  # fmt: skip
    m: dict = {"metrics": {}}
    if signals is not None:
        m["server_signals"] = {"url": url, "signals": signals}
    return CellResult(key=key, config=config, tp=1, concurrency=c, status=status,
                      measurement=m)  # fmt: skip


def test_a_signal_reads_its_peak_or_its_mean_in_its_unit() -> None:
    cell = _cell(ALL)
    assert [text(cell, s) for s in ALL if s != "spec_accept_histogram"] == [
        "63%", "8", "4", "2", "50%", "2.41"]  # fmt: skip
    assert value(cell, "kv_cache_usage") == 0.634 and value(cell, "prefix_cache_hit_rate") == 0.5
    assert value(cell, "spec_accept_length") == 2.414
    assert histogram_text(cell) == "0.90 0.70 0.40"
    assert entry(cell, "running") == ALL["running"]


def test_a_gauge_without_a_peak_reads_its_mean() -> None:
    assert value(_cell({"running": {"available": True, "value": 5}}), "running") == 5.0


def test_a_signal_not_exported_reads_not_available_and_no_scraper_reads_a_dash() -> None:
    cell = _cell(NONE)
    assert text(cell, "running") == NOT_AVAILABLE and value(cell, "running") is None
    assert histogram_text(cell) == NOT_AVAILABLE
    old = _cell(None)
    assert (text(old, "running"), histogram_text(old), entry(old, "running")) == ("-", "-", None)
    odd = _cell({"running": {"available": True, "value": "many"}, "waiting": 3,
                 "spec_accept_histogram": {"available": True, "value": [0.9]}})  # fmt: skip
    assert text(odd, "running") == NOT_AVAILABLE and text(odd, "waiting") == "-"
    assert histogram_text(odd) == NOT_AVAILABLE


def test_the_first_reason_per_signal_is_kept() -> None:
    cells = [_cell({"running": {"available": False, "why": "first"}, "waiting": {"available":
             False}}), _cell({"running": {"available": False, "why": "second"}}), _cell(ALL)]  # fmt: skip
    assert unavailable_reasons(cells) == {"running": "first", "waiting": "no reason given"}


def test_the_closing_table_shows_four_signal_columns_with_na_and_why() -> None:
    cells = [_cell(ALL), _cell({**ALL, "waiting": NONE["waiting"]}), _cell(None)]
    header, rows, notes = table_columns(cells)
    assert header == ("KV max", "waiting max", "preempt", "accept len")
    assert rows == [("63%", "4", "2", "2.41"), ("63%", "n/a", "2", "2.41"),
                    ("-", "-", "-", "-")]  # fmt: skip
    assert notes == ["n/a: waiting max not available (the server exports no waiting)"]


def test_the_closing_table_has_no_signal_columns_when_none_was_available() -> None:
    cells = [_cell(NONE), _cell(NONE)]
    assert table_columns(cells) == ((), [(), ()], [
        "server signals: not available (the server exports no kv_cache_usage)"])  # fmt: skip
    assert table_columns([_cell(NONE, url=None)]) == ((), [()], [])
    assert table_columns([_cell(None)]) == ((), [()], [])
    only_running = _cell({"running": ALL["running"]})
    assert table_columns([only_running]) == ((), [()], [])


def test_report_md_section_lists_each_measured_cell_and_why_a_signal_is_missing() -> None:
    cells = [_cell(ALL, config="a|b", c=8), _cell({**ALL, "preemptions": NONE["preemptions"]}),
             _cell(None, key="old")]  # fmt: skip
    assert markdown_section(cells) == (
        "## Server signals (scraped from /metrics during each cell)\n\n"
        "| config | TP | load | KV max | running max | waiting max | preempt | prefix hit |"
        " accept len | accept per position |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
        "| a\\|b | 1 | c=8 | 63% | 8 | 4 | 2 | 50% | 2.41 | 0.90 0.70 0.40 |\n"
        "| cfg | 1 | c=4 | 63% | 8 | 4 | not available | 50% | 2.41 | 0.90 0.70 0.40 |\n"
        "\n- preemptions: not available (the server exports no preemptions)\n"
    )


def test_report_md_says_none_available_in_one_line() -> None:
    assert markdown_section([_cell(NONE)]) == (
        "## Server signals\n\nNone available (the server exports no kv\\_cache\\_usage).\n"
    )


def test_report_md_section_makes_no_html_of_what_a_server_or_a_run_chose() -> None:
    """Issue 46.7: a reason quoting a hostile /metrics line and a config name that hold
    HTML (``<img src=x onerror=...>``): escaped as every other report.md text is."""
    evil = "<img src=x onerror=alert(1)>"
    cells = [_cell({**ALL, "preemptions": {"available": False, "why": f"bad line {evil}"}},
                   config=f"c{evil}")]  # fmt: skip
    md = markdown_section(cells)
    assert re.search(r"(?<!\\)<", md) is None  # every < escaped
    assert "| c\\<img src=x onerror=alert(1)\\> | 1 |" in md
    assert md.endswith("- preemptions: not available (bad line \\<img src=x onerror=alert(1)\\>)\n")
    none = markdown_section([_cell({s: {"available": False, "why": evil} for s in ALL})])
    assert none == "## Server signals\n\nNone available (\\<img src=x onerror=alert(1)\\>).\n"
    assert markdown_section([_cell({})]) == (
        "## Server signals\n\nNone available (no cell exported one).\n"
    )


def test_a_run_that_scraped_nothing_shows_no_signals() -> None:
    assert markdown_section([_cell(ALL, url=None)]) == ""
    assert markdown_section([_cell(None)]) == ""
    assert markdown_section([]) == ""
    assert html_panels([_cell(ALL, url="")], lambda c: c.concurrency, "c") == []


def test_report_html_has_one_chart_per_signal_with_a_line_per_configuration() -> None:
    cells = [_cell(ALL, "a", "x", 8), _cell({**ALL, "running": {"available": True, "max": 2}},
             "b", "x", 2), _cell(ALL, "c", "y", 4), _cell(ALL, "d", "y", 16)]  # fmt: skip
    cells.append(_cell({**ALL, "preemptions": NONE["preemptions"]}, "e", "z", 1))
    panels = html_panels(cells, lambda c: None if c.key == "d" else float(c.concurrency), "c")
    assert len(panels) == 6
    running = ET.fromstring(panels[1])
    ns = "{http://www.w3.org/2000/svg}"
    assert running.get("aria-label") == "Server: running max"
    groups = [g for g in running.iter(f"{ns}g") if g.get("class") == "series"]
    assert [g.get("data-label") for g in groups] == ["x (TP1)", "y (TP1)", "z (TP1)"]
    hovers = [t.text for t in groups[0].iter(f"{ns}title")]
    assert hovers == ["x (TP1): c=2: running max 2", "x (TP1): c=8: running max 8"]
    assert [t.text for t in groups[1].iter(f"{ns}title")] == ["y (TP1): c=4: running max 8"]
    preempt = ET.fromstring(panels[3])
    labels = [g.get("data-label") for g in preempt.iter(f"{ns}g") if g.get("class") == "series"]
    assert labels == ["x (TP1)", "y (TP1)"]
    assert [p.get("stroke") for p in running.iter(f"{ns}polyline")][:3] == [
        "#1f77b4", "#ff7f0e", "#2ca02c"]  # fmt: skip


def test_report_html_says_why_a_signal_has_no_chart() -> None:
    signals = {**ALL, "waiting": {"available": False, "why": "<b>not</b> exported"}}
    del signals["preemptions"]
    panels = html_panels([_cell(signals)], lambda c: 1.0, "c")
    assert panels[2] == '<p class="na">Server: waiting max: not available (&lt;b&gt;not&lt;/b&gt;' \
        " exported)</p>"  # fmt: skip
    assert panels[3] == '<p class="na">Server: preempt: not available (no cell exported it)</p>'


def test_report_html_says_none_available_in_one_line_escaped() -> None:
    cells = [_cell({"running": {"available": False, "why": "<script>x</script>"}})]
    assert html_panels(cells, lambda c: 1.0, "c") == [
        '<p class="na">Server signals: none collected (&lt;script&gt;x&lt;/script&gt;)</p>']  # fmt: skip
    assert html_panels([_cell({})], lambda c: 1.0, "c") == [
        '<p class="na">Server signals: none collected (no cell exported one)</p>']  # fmt: skip


def test_a_scrape_failure_reads_as_a_sentence_not_an_exception() -> None:
    """Issue 47: the reader was shown "none available (RuntimeError: GET ...: HTTP 404)"."""
    why = "RuntimeError: GET http://127.0.0.1:41234/metrics: HTTP 404"
    cells = [_cell({"running": {"available": False, "why": why}})]
    assert html_panels(cells, lambda c: 1.0, "c") == [
        '<p class="na">Server signals: none collected (the server answered HTTP 404 to GET'
        " /metrics: it exports no metrics there)</p>"]  # fmt: skip
    assert plain("ValueError: bad reply") == "bad reply"
    assert plain("GET http://h:1: HTTP 500") == (
        "the server answered HTTP 500 to GET /: it exports no metrics there")  # fmt: skip
    assert plain("GET http://h:1/m: reply over 8 bytes") == "GET http://h:1/m: reply over 8 bytes"
    assert plain("Timeout: GET x: HTTP 404 later") == "Timeout: GET x: HTTP 404 later"


def test_compare_shows_each_signal_a_to_b() -> None:
    a = _cell(ALL)
    b = _cell({**ALL, "running": {"available": True, "max": 16}, "waiting": NONE["waiting"]})
    assert compare_lines(a, b) == [
        "    KV max: 63% -> 63%",
        "    running max: 8 -> 16",
        "    waiting max: 4 -> not available",
        "    preempt: 2 -> 2",
        "    prefix hit: 50% -> 50%",
        "    accept len: 2.41 -> 2.41",
    ]


def test_compare_skips_signals_neither_side_has() -> None:
    both_na = compare_lines(_cell(NONE), _cell(NONE))
    assert both_na == []
    one_side = compare_lines(_cell(None), _cell({"running": ALL["running"]}))
    assert one_side == ["    KV max: - -> -", "    running max: - -> 8", "    waiting max: - -> -",
                        "    preempt: - -> -", "    prefix hit: - -> -", "    accept len: - -> -"]  # fmt: skip
    assert compare_lines(_cell(None), _cell(None)) == []


def test_a_histogram_marked_unavailable_is_not_shown() -> None:
    cell = _cell({"spec_accept_histogram": {"available": False, "value": {"1": 0.9}}})
    assert histogram_text(cell) == NOT_AVAILABLE


def test_compare_shows_a_side_without_signals_as_a_dash() -> None:
    assert compare_lines(_cell(ALL), _cell(None)) == [
        "    KV max: 63% -> -", "    running max: 8 -> -", "    waiting max: 4 -> -",
        "    preempt: 2 -> -", "    prefix hit: 50% -> -", "    accept len: 2.41 -> -"]  # fmt: skip


def test_why_the_acceptance_histogram_is_missing_is_said() -> None:
    signals = {
        **ALL,
        "spec_accept_histogram": {"available": False, "why": "no speculative decoding"},
    }
    section = markdown_section([_cell(signals)])
    assert section.endswith("\n- spec_accept_histogram: not available (no speculative decoding)\n")


def test_signal_charts_draw_solid_lines_with_a_legend() -> None:
    panels = html_panels(
        [_cell(ALL, "a", "x", 2), _cell(ALL, "b", "x", 8)], lambda c: c.concurrency, "c"
    )
    root = ET.fromstring(panels[0])
    ns = "{http://www.w3.org/2000/svg}"
    assert [p.get("stroke-dasharray") for p in root.iter(f"{ns}polyline")] == [None]
    assert "x (TP1)" in [t.text for t in root.iter(f"{ns}text")]
