"""report.html's sections as a reader gets them, in process: the charts (which lines over
which load axis, the Pareto front, telemetry in run order), the cells table with its
spread, the searches, the cells needing attention, the log tails of failed cells, the
machine, and every string from the run directory escaped. Real run directories in
tmp_path; test_html_report.py renders the page in Chromium."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from gpudoctor.bench.results.html_report import charts, render_html
from gpudoctor.bench.results.reader import CellResult, RunResults, SearchLine, read_run

NS = "{http://www.w3.org/2000/svg}"


def _cell(config: str = "cfg", c: int = 4, status: str = "ok", rate: float | None = None,
          repeat: int = 0, group: str = "", tp: int = 1, **metrics: float) -> CellResult:  # fmt: skip
    m = {"metrics": metrics} if status == "ok" else None
    key = f"{config}-{c}-{rate}-{repeat}"
    return CellResult(key=key, config=config, tp=tp, concurrency=c, status=status, measurement=m,
                      request_rate=rate, repeat=repeat, group=group or key,
                      extra={"reason": f"why {config}"})  # fmt: skip


def _run(cells: list[CellResult], searches: tuple[SearchLine, ...] = ()) -> RunResults:
    return RunResults(Path("/nonexistent/run"), tuple(cells), (), searches)


def _series(svg: str) -> dict[str, list[str]]:
    root = ET.fromstring(svg)
    return {g.get("data-label", ""): [t.text or "" for t in g.iter(f"{NS}title")]
            for g in root.iter(f"{NS}g") if g.get("class") == "series"}  # fmt: skip


def _title(svg: str) -> str:
    return ET.fromstring(svg).get("aria-label", "")


def test_charts_draw_each_configuration_over_concurrency() -> None:
    cells = [_cell("a", 8, output_throughput=200.0, median_tpot_ms=8.0, p99_tpot_ms=9.0,
                   median_ttft_ms=30.0, p99_ttft_ms=60.0, goodput=3.0),
             _cell("a", 2, output_throughput=100.0, median_tpot_ms=5.0, median_ttft_ms=10.0),
             _cell("b", 4, output_throughput=50.0, median_tpot_ms=20.0),
             _cell("c", 4, status="crashed")]  # fmt: skip
    out = charts(_run(cells), [])
    assert [_title(s) for s in out] == [
        "Output throughput vs median TPOT (Pareto front ringed)",
        "TTFT p50 (solid) / p99 (dashed)", "TPOT p50 (solid) / p99 (dashed)",
        "Goodput (requests/s meeting the SLO)"]  # fmt: skip
    assert _series(out[0]) == {
        "a (TP1)": ["a (TP1): c=2: TPOT p50 5 ms, 100 tok/s", "a (TP1): c=8: TPOT p50 8 ms, 200 tok/s"],
        "b (TP1)": ["b (TP1): c=4: TPOT p50 20 ms, 50 tok/s"]}  # fmt: skip
    pareto = ET.fromstring(out[0])
    assert len([c for c in pareto.iter(f"{NS}circle") if c.get("class") == "marked"]) == 2
    assert [t.text for t in pareto.iter(f"{NS}text")][-2:] == ["a (TP1)", "b (TP1)"]
    assert _series(out[1]) == {
        "a (TP1)": ["a (TP1): c=2: median_ttft_ms 10", "a (TP1): c=8: median_ttft_ms 30"],
        "a (TP1) p99_ttft_ms": ["a (TP1) p99_ttft_ms: c=8: p99_ttft_ms 60"]}  # fmt: skip
    assert list(_series(out[2])) == ["a (TP1)", "a (TP1) p99_tpot_ms", "b (TP1)"]
    assert _series(out[3]) == {"a (TP1)": ["a (TP1): c=8: goodput 3"]}
    xlabels = [t.text for t in ET.fromstring(out[1]).iter(f"{NS}text")
               if t.get("font-size") == "11"]  # fmt: skip
    assert xlabels == ["concurrency", "ms"]
    dashed = [p.get("stroke-dasharray") for p in ET.fromstring(out[1]).iter(f"{NS}polyline")]
    assert dashed == [None, "5,3"]


def _named(charts_out: list[str], title: str) -> str:
    """Return the one chart whose title starts with ``title``."""
    (chart,) = [c for c in charts_out if _title(c).startswith(title)]
    return chart


def test_a_rate_axis_is_the_load_when_rates_vary_or_concurrency_does_not() -> None:
    cells = [_cell("a", 4, rate=1.0, median_ttft_ms=5.0), _cell("a", 4, rate=4.0,
             median_ttft_ms=9.0), _cell("a", 4, rate=float("inf"), median_ttft_ms=20.0)]  # fmt: skip
    ttft = _named(charts(_run(cells), []), "TTFT")
    labels = [t.text for t in ET.fromstring(ttft).iter(f"{NS}text") if t.get("font-size") == "11"]
    assert labels == ["request rate (req/s)", "ms"]
    assert _series(ttft) == {"a (TP1)": ["a (TP1): c=4 r=1: median_ttft_ms 5",
                                         "a (TP1): c=4 r=4: median_ttft_ms 9"]}  # fmt: skip
    one_rate = [_cell("a", 4, rate=2.0, median_ttft_ms=5.0)]
    assert "request rate (req/s)" in _named(charts(_run(one_rate), []), "TTFT")
    one_rate_two_c = [_cell("a", 4, rate=2.0, median_ttft_ms=5.0),
                      _cell("a", 8, rate=2.0, median_ttft_ms=6.0)]  # fmt: skip
    assert ">concurrency<" in _named(charts(_run(one_rate_two_c), []), "TTFT")
    closed = [_cell("a", 4, median_ttft_ms=5.0), _cell("a", 4, rate=float("inf"),
              median_ttft_ms=6.0)]  # fmt: skip
    assert ">concurrency<" in _named(charts(_run(closed), []), "TTFT")


def test_repeats_are_drawn_as_their_mean() -> None:
    cells = [_cell("a", 4, repeat=0, group="g", median_tpot_ms=4.0, output_throughput=10.0),
             _cell("a", 4, repeat=1, group="g", median_tpot_ms=6.0, output_throughput=30.0)]  # fmt: skip
    assert _series(charts(_run(cells), [])[0]) == {
        "a (TP1)": ["a (TP1): c=4: TPOT p50 5 ms, 20 tok/s"]}  # fmt: skip


def test_telemetry_is_one_point_per_cell_in_run_order() -> None:
    rows = [{"label": "a c=1", "util_pct": 50.0, "power_w": 300, "temp_c": 60.5},
            {"label": "a c=2", "util_pct": 90.0, "power_w": "n/a"}]  # fmt: skip
    out = charts(_run([_cell(output_throughput=1.0, median_tpot_ms=1.0)]), rows)
    assert len(out) == 3  # throughput vs TPOT, TPOT, telemetry: no chart without data
    assert _title(out[2]) == "GPU telemetry over the campaign (mean per cell, in run order)"
    assert _series(out[2]) == {
        "GPU util %": ["GPU util %: a c=1: GPU util % 50", "GPU util %: a c=2: GPU util % 90"],
        "power W": ["power W: a c=1: power W 300"], "temp °C": ["temp °C: a c=1: temp °C 60.5"]}  # fmt: skip
    strokes = [p.get("stroke") for p in ET.fromstring(out[2]).iter(f"{NS}polyline")]
    assert strokes == ["#1f77b4", "#ff7f0e", "#2ca02c"]
    assert charts(_run([]), [{"label": "x"}]) == []  # issue 47: no empty "no data" charts


def _write_run(tmp_path: Path, rows: list[dict], run_json: object = None) -> Path:
    run = tmp_path / "run<1>"
    run.mkdir()
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if run_json is not None:
        (run / "run.json").write_text(json.dumps(run_json))
    return run


def _row(key: str, config: str = "cfg", status: str = "ok", **extra: object) -> dict:
    m = {"metrics": {"output_throughput": 100.0, "median_ttft_ms": 10.0, "p99_ttft_ms": 20.0,
                     "median_tpot_ms": 2.0, "p99_tpot_ms": 3.0}}  # fmt: skip
    return {"key": key, "config": config, "tp": 1, "concurrency": 4, "status": status,
            "verdict": {"status": status}, "measurement": m if status == "ok" else None,
            **extra}  # fmt: skip


def test_the_page_has_every_section_in_order_and_escapes_the_run_s_name(tmp_path: Path) -> None:
    run = _write_run(tmp_path, [_row("k")])
    page = render_html(run, read_run(run), notes=["3 <bad> lines"])
    assert page.startswith('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
                           "<title>Benchmark report: run&lt;1&gt;</title><style>")  # fmt: skip
    assert '<h1>Benchmark report: run&lt;1&gt;</h1>\n<pre id="errors"></pre>' in page
    assert "<p><b>Warning:</b> 3 &lt;bad&gt; lines</p>" in page
    assert ("<p>1 cells: 1 ok, 0 failed, 0 crashed, 0 skipped. Definitions: docs/bench-metrics.md."
            " Click a line to fade it.</p>") in page  # fmt: skip
    heads = re.findall(r"<h2>(.*?)</h2>", page)
    assert heads == ["At a glance: each configuration's throughput and the latency it costs",
                     "Failed, suspect and client-bound cells", "Workload and SLO", "Charts",
                     "Cells", "Search: the highest load that met the SLO",
                     "Failed, crashed and skipped cells: server log tails", "Machine"]  # fmt: skip
    assert page.count('<svg class="chart"') == 3 and page.endswith("</body></html>")  # no SLO
    assert page.split("client-bound cells</h2>\n")[1].split("\n")[0] == (
        "<p>None: every cell is ok, its requests succeeded, no flag.</p>"
    )
    assert page.split("<h2>Workload and SLO</h2>\n")[1].startswith(
        "<table><tr><th>workload</th><th>value</th></tr>"
    )
    assert "<p>No search in this run.</p>" in page and "<p>None.</p>" in page
    assert "<p>No readable run.json.</p>" in page
    assert ("<tr><td>workload</td><td>unknown: plan.toml is missing or unreadable</td></tr>"
            "<tr><td>SLO</td><td>no SLO set ([slo] in the plan): goodput is not computed</td>"
            "</tr>") in page  # fmt: skip
    assert render_html(run, read_run(run)).count("<b>Warning:</b>") == 0


def test_the_cells_table_reads_means_runs_and_spread(tmp_path: Path) -> None:
    rows = [_row("a#0", group="a"), _row("a#1", group="a", repeat=1),
            _row("b", config="<b>", request_rate=2.0), _row("c", status="crashed")]  # fmt: skip
    rows[1]["measurement"]["metrics"]["output_throughput"] = 300.0
    rows[2]["measurement"]["metrics"]["goodput"] = 1.25
    run = _write_run(tmp_path, rows)
    page = render_html(run, read_run(run))
    table = page.split("<h2>Cells</h2>\n")[1].split("\n")[0]
    assert table == (
        "<table><tr><th>config</th><th>c</th><th>rate</th><th>status</th><th>out tok/s</th>"
        "<th>TTFT p50</th><th>TTFT p99</th><th>TPOT p50</th><th>TPOT p99</th><th>goodput</th>"
        "<th>runs</th><th>spread</th></tr>"
        "<tr><td>cfg (TP1)</td><td>4</td><td>-</td><td>ok</td><td>200</td><td>10</td><td>20</td>"
        "<td>2</td><td>3</td><td>–</td><td>2</td><td>±70.7%</td></tr>"
        "<tr><td>&lt;b&gt; (TP1)</td><td>4</td><td>2</td><td>ok</td><td>100</td><td>10</td>"
        "<td>20</td><td>2</td><td>3</td><td>1.25</td><td>1</td><td></td></tr>"
        "<tr><td>cfg (TP1)</td><td>4</td><td>-</td><td>crashed</td><td>–</td><td>–</td><td>–</td>"
        "<td>–</td><td>–</td><td>–</td><td>1</td><td></td></tr></table>"
    )


def test_failed_cells_show_their_reason_and_log_tail_escaped(tmp_path: Path) -> None:
    rows = [_row("a", status="crashed", reason="CUDA <oom>",
                 server_log_tail=["<script>alert(1)</script>", "line 2"]),
            _row("b", status="skipped"), _row("c", status="failed", reason="all failed")]  # fmt: skip
    run = _write_run(tmp_path, rows)
    page = render_html(run, read_run(run))
    tails = page.split("server log tails</h2>\n")[1].split("\n<h2>Machine</h2>")[0]
    assert tails == (
        "<h3>cfg (TP1) c=4: crashed</h3><p>CUDA &lt;oom&gt;</p>"
        "<pre>&lt;script&gt;alert(1)&lt;/script&gt;\nline 2</pre>"
        "<h3>cfg (TP1) c=4: skipped</h3><p></p>"
        "<h3>cfg (TP1) c=4: failed</h3><p>all failed</p>"
    )
    assert "<script>alert(1)" not in page
    assert "<h3>cfg (TP1) c=4: failed</h3><p>all failed</p>" in page
    attention = page.split("client-bound cells</h2>\n")[1].split("\n")[0]
    assert attention.startswith("<table><tr><th>cell</th><th>what</th><th>why</th></tr>"
                                "<tr><td>cfg (TP1) c=4</td><td>FAILED</td><td>all failed</td>")  # fmt: skip


def test_a_crashed_servers_token_is_not_shown_in_clear(tmp_path: Path) -> None:
    """Issue 46.11: the log tail of a crashed server printed its API key and an hf_ token;
    report.html showed them in clear where the bundle replaces them: now replaced too
    (secrets only; names and addresses are the run's own and stay)."""
    key, token = "PlantedOpaqueApiKey0123456789", "hf_PlantedHuggingFaceToken0123456789"
    rows = [_row("a", status="crashed", reason="exit 1",
                 server_log_tail=[f"args: --api-key {key} --host 10.0.0.5", f"HF_TOKEN={token}"])]  # fmt: skip
    run = _write_run(tmp_path, rows)
    page = render_html(run, read_run(run))
    assert key not in page and token not in page
    assert (
        "<pre>args: --api-key &lt;secret-2&gt; --host 10.0.0.5\nHF_TOKEN=&lt;secret-1&gt;</pre>"
        in page
    )


def test_the_searches_table(tmp_path: Path) -> None:
    search = {"record": "search", "key": "s", "config": "<cfg>", "tp": 2, "status": "done",
              "search": {"over": "request_rate", "met": 2.5, "failed": None, "goodput": 0.9,
                         "slo": {"ttft_ms": 200.0, "tpot_ms": None, "e2el_ms": 1e3},
                         "probes": [1, 2, 3]}}  # fmt: skip
    bare = {**search, "key": "t", "search": {"over": "concurrency"}}
    run = _write_run(tmp_path, [_row("k"), search, bare])
    page = render_html(run, read_run(run))
    table = page.split("met the SLO</h2>\n")[1].split("\n")[0]
    assert table == (
        "<table><tr><th>config</th><th>over</th><th>highest met</th><th>first failing</th>"
        "<th>probes</th><th>SLO</th><th>goodput ≥</th><th>status</th></tr>"
        "<tr><td>&lt;cfg&gt; (TP2)</td><td>request_rate</td><td>2.5</td><td>none</td><td>3</td>"
        "<td>ttft_ms ≤ 200, e2el_ms ≤ 1000</td><td>0.9</td><td>done</td></tr>"
        "<tr><td>&lt;cfg&gt; (TP2)</td><td>concurrency</td><td>none</td><td>none</td><td>0</td>"
        "<td></td><td>None</td><td>done</td></tr></table>"
    )


def test_the_machine_from_run_json(tmp_path: Path) -> None:
    run = _write_run(tmp_path, [_row("k")], {"driver_version": "570", "gpus": []})
    page = render_html(run, read_run(run))
    assert page.split("<h2>Machine</h2>\n")[1] == (
        "<table><tr><th>fact</th><th>value</th></tr><tr><td>driver version</td><td>570</td>"
        "</tr><tr><td>gpus</td><td>none</td></tr></table>\n</body></html>"
    )
    (run / "run.json").write_text("[1, 2]")
    assert "<p>No readable run.json.</p>" in render_html(run, read_run(run))
    (run / "run.json").write_text("{broken")
    assert "<p>No readable run.json.</p>" in render_html(run, read_run(run))


def test_telemetry_of_measured_cells_feeds_the_campaign_chart(tmp_path: Path) -> None:
    rows = [_row("a"), _row("b", status="crashed"), _row("c")]
    rows[0]["measurement"]["telemetry"] = {"util_pct": {"mean": 75.0}, "power_w": {"mean": "x"},
                                           "temp_c": 55}  # fmt: skip
    rows[2]["measurement"]["telemetry"] = {}
    run = _write_run(tmp_path, rows)
    page = render_html(run, read_run(run))
    assert page.count('<svg class="chart"') == 4  # no goodput chart: no SLO (issue 47)
    assert "GPU util %: cfg c=4: GPU util % 75" in page
    assert "power W:" not in page and "temp °C:" not in page


def test_server_signals_and_the_timeline_appear_only_when_the_run_has_them(tmp_path: Path) -> None:
    rows = [_row("a")]
    rows[0]["measurement"]["server_signals"] = {
        "url": "http://127.0.0.1:1/metrics",
        "signals": {"running": {"available": True, "max": 3}}}  # fmt: skip
    run = _write_run(tmp_path, rows)
    page = render_html(run, read_run(run))
    assert '<h2>Server signals (from /metrics during each cell)</h2>\n<div class="charts">' in page
    assert "Request timeline" not in page
    (run / "trace").mkdir()
    (run / "trace" / "cfg-c4.json").write_text(json.dumps({"traceEvents": []}))
    page = render_html(run, read_run(run))
    heads = re.findall(r"<h2>(.*?)</h2>", page)
    assert heads[6:8] == ["Server signals (from /metrics during each cell)", "Request timeline"]
    del rows[0]["measurement"]["server_signals"]
    (run / "results.jsonl").write_text(json.dumps(rows[0]) + "\n")
    heads = re.findall(r"<h2>(.*?)</h2>", render_html(run, read_run(run)))
    assert heads[6] == "Request timeline"


def test_telemetry_of_failed_cells_or_of_the_wrong_shape_is_left_out(tmp_path: Path) -> None:
    rows = [_row("a"), _row("b"), _row("c"), _row("d", status="failed")]
    rows[0]["measurement"]["telemetry"] = ["not", "a", "table"]
    rows[1]["measurement"]["telemetry"] = {}
    rows[2]["measurement"]["telemetry"] = {"util_pct": {"mean": 10.0}, "power_w": {"mean": 300.0},
                                           "temp_c": {"mean": 61.0}}  # fmt: skip
    rows[3]["measurement"] = {"metrics": {}, "telemetry": {"util_pct": {"mean": 99.0}}}
    run = _write_run(tmp_path, rows)
    page = render_html(run, read_run(run))
    tele = page.split("GPU telemetry over the campaign")[2].split("</svg>")[0]
    assert "GPU util %: cfg c=4: GPU util % 10" in tele and "GPU util % 99" not in tele
    assert "power W: cfg c=4: power W 300" in tele and "temp °C: cfg c=4: temp °C 61" in tele
    circles = re.findall(r'<circle cx="([\d.]+)"', tele)
    assert len(set(circles)) == 1  # one cell with telemetry: one x, the first in run order
    assert float(circles[0]) == 64 + (560 - 64 - 16) / 2


def test_no_search_is_said_and_a_failing_load_is_named(tmp_path: Path) -> None:
    run = _write_run(tmp_path, [_row("k")])
    page = render_html(run, read_run(run))
    assert page.split("met the SLO</h2>\n")[1].split("\n")[0] == "<p>No search in this run.</p>"
    search = {"record": "search", "key": "s", "config": "c", "tp": 1, "status": "done",
              "search": {"over": "concurrency", "met": 2, "failed": 4}}  # fmt: skip
    (run / "results.jsonl").write_text(json.dumps(_row("k")) + "\n" + json.dumps(search) + "\n")
    page = render_html(run, read_run(run))
    assert "<td>c (TP1)</td><td>concurrency</td><td>2</td><td>4</td><td>0</td>" in page


def test_the_page_s_lines_between_sections_are_exact(tmp_path: Path) -> None:
    run = _write_run(tmp_path, [_row("k")])
    page = render_html(run, read_run(run), notes=["one", "two"])
    assert "<p><b>Warning:</b> one</p><p><b>Warning:</b> two</p>" in page
    assert "\n<h2>Workload and SLO</h2>\n<table>" in page
    assert '\n<h2>Charts</h2><div class="charts">\n<svg' in page
    assert "</svg>\n</div>\n<h2>Cells</h2>\n" in page
    assert ("met the SLO</h2>\n<p>No search in this run.</p>\n<h2>Failed, crashed and skipped"
            " cells: server log tails</h2>\n<p>None.</p>\n<h2>Machine</h2>\n"
            "<p>No readable run.json.</p>\n</body></html>") in page  # fmt: skip


def test_the_signals_panels_close_their_box(tmp_path: Path) -> None:
    rows = [_row("a")]
    rows[0]["measurement"]["server_signals"] = {
        "url": "http://127.0.0.1:1/metrics", "signals": {"running": {"available": True, "max": 3}}}  # fmt: skip
    run = _write_run(tmp_path, rows)
    page = render_html(run, read_run(run))
    assert "</p>\n</div>\n<h2>Failed, crashed and skipped cells" in page


def test_a_linked_run_directory_shows_its_machine(tmp_path: Path) -> None:
    run = _write_run(tmp_path, [_row("k")], {"driver_version": "570"})
    alias = tmp_path / "alias"
    alias.symlink_to(run)
    assert "<td>driver version</td><td>570</td>" in render_html(alias, read_run(alias))


def _axis_labels(svg: str) -> list[str]:
    return [
        t.text or "" for t in ET.fromstring(svg).iter(f"{NS}text") if t.get("font-size") == "11"
    ]


def test_each_chart_names_its_axes_and_colours_configurations_apart() -> None:
    cells = [_cell("a", 2, output_throughput=100.0, median_tpot_ms=5.0, p99_tpot_ms=9.0, goodput=1.0, median_ttft_ms=3.0),
             _cell("b", 2, output_throughput=50.0, median_tpot_ms=8.0, p99_tpot_ms=12.0, goodput=2.0),
             _cell("c", 4, output_throughput=80.0)]  # fmt: skip
    out = charts(_run(cells), [{"label": "a c=2", "util_pct": 50.0}])
    assert [_axis_labels(s) for s in out] == [
        ["median TPOT (ms)", "output tokens/s"], ["concurrency", "ms"], ["concurrency", "ms"],
        ["concurrency", "req/s"], ["cell (run order)", "value"]]  # fmt: skip
    pareto = ET.fromstring(out[0])
    assert [p.get("stroke") for p in pareto.iter(f"{NS}polyline") if p.get("class") != "front"] == [
        "#1f77b4", "#ff7f0e"]  # fmt: skip
    assert len([p for p in pareto.iter(f"{NS}polyline") if p.get("class") == "front"]) == 1
    tpot = ET.fromstring(out[2])
    assert [(p.get("stroke"), p.get("stroke-dasharray")) for p in tpot.iter(f"{NS}polyline")] == [
        ("#1f77b4", None), ("#1f77b4", "5,3"), ("#ff7f0e", None), ("#ff7f0e", "5,3")]  # fmt: skip
    assert [p.get("stroke-dasharray") for p in ET.fromstring(out[4]).iter(f"{NS}polyline")] == [
        None
    ]


def test_two_rates_make_the_rate_the_load_axis() -> None:
    cells = [
        _cell("a", 4, rate=1.0, median_ttft_ms=5.0),
        _cell("a", 8, rate=2.0, median_ttft_ms=6.0),
    ]
    assert _axis_labels(_named(charts(_run(cells), []), "TTFT"))[0] == "request rate (req/s)"
