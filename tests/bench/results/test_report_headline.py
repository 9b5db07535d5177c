"""report.html's headline (gpudoctor/bench/results/headline.py, issue 47): per configuration
the peak throughput, where, and the latency it cost; the lightest load's latency; the best
named above the table. In process, from cells as the reader gives them."""

from __future__ import annotations

import re

from gpudoctor.bench.results.headline import headlines, section
from gpudoctor.bench.results.reader import CellResult
from gpudoctor.bench.results.repeats import group_cells


def cell(config: str, c: int, tps: float | None, ttft: float = 10.0, tpot: float = 2.0,
         status: str = "ok", tp: int = 1, rate: float | None = None) -> CellResult:  # fmt: skip
    metrics = {"median_ttft_ms": ttft, "median_tpot_ms": tpot}
    if tps is not None:
        metrics["output_throughput"] = tps
    return CellResult(key=f"{config}{tp}-{c}-{rate}", config=config, tp=tp, concurrency=c,
                      status=status, measurement={"metrics": metrics} if status == "ok" else None,
                      request_rate=rate)  # fmt: skip


def test_each_configuration_gets_its_peak_and_its_lightest_load() -> None:
    cells = [cell("fast", 4, 900.0, 30.0, 1.5), cell("fast", 1, 300.0, 5.0, 1.25),
             cell("fast", 8, 800.0, 90.0, 4.0), cell("slow", 2, 100.0, 8.0, 5.0, tp=2),
             cell("broken", 1, None, status="crashed")]  # fmt: skip
    fast, slow = headlines(group_cells(cells))
    assert (fast.config, fast.peak_tps, fast.peak_load) == ("fast (TP1)", 900.0, "c=4")
    assert (fast.peak_ttft_ms, fast.peak_tpot_ms) == (30.0, 1.5)
    assert (fast.light_load, fast.light_ttft_ms, fast.light_tpot_ms) == ("c=1", 5.0, 1.25)
    assert (fast.measured, fast.cells) == (3, 3)
    assert (slow.config, slow.peak_load, slow.light_load) == ("slow (TP2)", "c=2", "c=2")
    text = section(group_cells(cells))
    assert "<b>Highest throughput: 900 output tok/s</b>, fast (TP1) at c=4" in text
    assert "<b>lowest TTFT p50: 5 ms</b>, fast (TP1) at c=1" in text
    rows = re.findall(r"<tr( class=\"best\")?>(<td>.*?)</tr>", text)
    assert [best for best, _ in rows] == [' class="best"', ""]
    first = re.findall(r"<td>(.*?)</td>", rows[0][1])
    assert first == ["fast (TP1)", '<span class="bar" style="width:100px"></span> 900', "c=4",
                     "30 ms", "1.5 ms", "c=1", "5 ms", "1.25 ms", "800 tok/s", "3 of 3"]  # fmt: skip
    assert 'style="width:11px"></span> 100' in rows[1][1]  # 100 of 900


def test_a_rate_is_a_lighter_load_than_the_same_concurrency_unthrottled() -> None:
    cells = [cell("a", 4, 200.0, rate=None), cell("a", 4, 100.0, 3.0, rate=10.0)]
    (only,) = headlines(group_cells(cells))
    assert (only.peak_load, only.light_load) == ("c=4", "c=4 r=10")


def test_a_configuration_without_a_throughput_counts_but_has_no_row() -> None:
    cells = [cell("a", 1, None), cell("a", 2, 50.0, ttft=0.0, tpot=0.0)]
    (only,) = headlines(group_cells(cells))
    assert (only.measured, only.cells) == (1, 2)
    text = section(group_cells(cells))
    assert "<td>–</td>" in text  # one stream at TPOT 0: not a division by zero
    assert "lowest TTFT p50: 0 ms" in text


def test_no_measured_configuration_says_so_in_one_line() -> None:
    text = section(group_cells([cell("a", 1, None, status="failed")]))
    assert "<b>No configuration has a measured cell</b>" in text and "<table" not in text


def test_names_from_the_run_are_escaped() -> None:
    text = section(group_cells([cell("<b>x</b>", 1, 10.0)]))
    assert "<b>x</b>" not in text and "&lt;b&gt;x&lt;/b&gt; (TP1)" in text


def test_latencies_unknown_read_as_a_dash() -> None:
    c = CellResult(key="k", config="a", tp=1, concurrency=1, status="ok",
                   measurement={"metrics": {"output_throughput": 5.0}})  # fmt: skip
    text = section(group_cells([c]))
    assert text.count("<td>–</td>") == 5 and "lowest TTFT" not in text


def test_the_whole_section_as_the_page_gets_it() -> None:
    """The exact HTML for two configurations (the second the best, its peak not its first
    cell; the first the quickest at 0 ms) after one without any throughput."""
    cells = [cell("none", 1, None),
             cell("a", 1, 0.0, ttft=0.0, tpot=0.0), cell("a", 2, 0.0, ttft=1.0),
             cell("b", 1, 50.0, ttft=0.5, tpot=4.0), cell("b", 2, 200.0, ttft=7.0, tpot=8.0)]  # fmt: skip
    glance = headlines(group_cells(cells))
    assert [h.config for h in glance] == ["a (TP1)", "b (TP1)"]
    assert (glance[0].peak_tps, glance[1].peak_tps, glance[1].peak_load) == (0.0, 200.0, "c=2")
    assert section(group_cells(cells)) == (
        "<h2>At a glance: each configuration's throughput and the latency it costs</h2>"
        "<p><b>Highest throughput: 200 output tok/s</b>, b (TP1) at c=2; <b>lowest TTFT p50:"
        " 0 ms</b>, a (TP1) at c=1.</p>"
        '<table class="glance"><tr><th>configuration</th><th>peak output tok/s</th><th>at</th>'
        "<th>TTFT p50 there</th><th>TPOT p50 there</th><th>lightest load</th><th>TTFT p50</th>"
        "<th>TPOT p50</th><th>one stream</th><th>cells measured</th></tr>"
        '<tr><td>a (TP1)</td><td><span class="bar" style="width:0px"></span> 0</td><td>c=1</td>'
        "<td>0 ms</td><td>0 ms</td><td>c=1</td><td>0 ms</td><td>0 ms</td><td>–</td>"
        "<td>2 of 2</td></tr>"
        '<tr class="best"><td>b (TP1)</td><td><span class="bar" style="width:100px"></span>'
        " 200</td><td>c=2</td><td>7 ms</td><td>8 ms</td><td>c=1</td><td>0.5 ms</td><td>4 ms</td>"
        "<td>250 tok/s</td><td>2 of 2</td></tr></table>"
    )
    zero = section(group_cells([cell("z", 1, 0.0)]))
    assert '<span class="bar" style="width:0px"></span> 0<' in zero  # no division by zero
