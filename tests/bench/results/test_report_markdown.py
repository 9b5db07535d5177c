"""report.md as a reader gets it: the table per TP (a cell's numbers, its warnings, its
status), the sections before the numbers (attention, workload, SLO), where each cell ran,
names from the run directory shown as literal text, and a page gpudoctor did not write
never replaced. Real run directories in tmp_path; test_report.py renders the plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudoctor.bench.results.reader import CellResult, ResultsError
from gpudoctor.bench.results.report import (
    PLOTS_HINT,
    REPORT_MARKER,
    attention_markdown,
    cell_text,
    markdown_tables,
    md_text,
    placement_table,
    render_markdown,
    server_signal_lines,
    workload_markdown,
    write_report,
)

METRICS = {"output_throughput": 1234.4, "median_ttft_ms": 10.6, "p99_ttft_ms": 20.2,
           "median_tpot_ms": 1.26}  # fmt: skip


def _cell(config: str = "cfg", tp: int = 1, c: int = 4, status: str = "ok",
          metrics: dict | None = None, rate: float | None = None, repeat: int = 0,
          **extra: object) -> CellResult:  # fmt: skip
    m = {"metrics": dict(METRICS if metrics is None else metrics), "accept_length": 2.5}
    return CellResult(key=f"{config}-{tp}-{c}-{rate}-{repeat}", config=config, tp=tp,
                      concurrency=c, status=status, measurement=m, request_rate=rate,
                      repeat=repeat, **extra)  # type: ignore[arg-type]  # fmt: skip


def test_names_from_the_run_directory_are_literal_markdown() -> None:
    assert md_text("a|b <script> [x](y) *e* _u_ `c` ~s~ #h & \\") == (
        "a\\|b \\<script\\> \\[x\\](y) \\*e\\* \\_u\\_ \\`c\\` \\~s\\~ \\#h \\& \\\\"
    )
    assert md_text("plain-name.1+!") == "plain-name.1+!"
    assert md_text("bell\x07") == "bell\\\\x07"  # printable's \x07, its backslash escaped
    assert md_text(7) == "7"


def test_a_cell_reads_its_numbers_and_each_warning() -> None:
    assert cell_text(_cell()) == "1234 · 11/20 · 1.3 · 2.50"
    m = {**METRICS, "token_count_mismatches": 2}
    flagged = _cell(metrics=m, extra={"suspect": "Xid", "client_bound": "late"})
    assert flagged.measurement is not None
    flagged.measurement["errors"] = {"timeout": 3}
    assert cell_text(flagged) == (
        "1234 · 11/20 · 1.3 · 2.50 ⚠ 3 failed ⚠ 2 usage mismatch ⚠ suspect ⚠ client-bound"
    )
    sparse = _cell(metrics={})
    assert sparse.measurement is not None
    del sparse.measurement["accept_length"]
    assert cell_text(sparse) == "– · –/– · – · –"


def test_a_rated_cell_reads_the_rate_it_actually_sent() -> None:
    """Issue 45.9: report.md's column said only `r=8000`; the client had sent 3502 req/s."""
    rated = _cell(rate=8000.0)
    assert rated.measurement is not None
    rated.measurement["client"] = {"audit": {"achieved_rate": 3502.37}}
    assert cell_text(rated) == "1234 · 11/20 · 1.3 · 2.50 · sent 3502 req/s"
    closed = _cell()  # no rate axis: the rate sent is no column's
    assert closed.measurement is not None
    closed.measurement["client"] = {"audit": {"achieved_rate": 12.0}}
    assert cell_text(closed) == "1234 · 11/20 · 1.3 · 2.50"
    unknown = _cell(rate=8000.0)
    assert unknown.measurement is not None
    unknown.measurement["client"] = {"audit": {"achieved_rate": None}}
    assert cell_text(unknown) == "1234 · 11/20 · 1.3 · 2.50"


def test_a_cell_that_was_not_measured_reads_its_status() -> None:
    assert cell_text(None) == ""
    assert cell_text(_cell(status="failed")) == "FAILED"
    assert cell_text(_cell(status="crashed")) == "crashed"
    assert cell_text(_cell(status="odd_*status*")) == "odd\\_\\*status\\*"


def test_one_table_per_tp_configs_by_load() -> None:
    cells = [_cell("b", 2, 8), _cell("a", 1, 16), _cell("a", 1, 2), _cell("b", 1, 2),
             _cell("a", 1, 2, rate=4.0), _cell("a", 1, 2, repeat=1, status="crashed"),
             _cell("x|y", 2, 1, status="skipped")]  # fmt: skip
    assert markdown_tables(cells) == "\n".join([
        "## TP 1", "",
        "| config | c=2 r=4 | c=2 | c=16 |",
        "|---|---|---|---|",
        "| a | 1234 · 11/20 · 1.3 · 2.50 | 1234 · 11/20 · 1.3 · 2.50 | 1234 · 11/20 · 1.3 · 2.50 |",
        "| b |  | 1234 · 11/20 · 1.3 · 2.50 |  |",
        "",
        "## TP 2", "",
        "| config | c=1 | c=8 |",
        "|---|---|---|",
        "| b |  | 1234 · 11/20 · 1.3 · 2.50 |",
        "| x\\|y | skipped |  |",
    ])  # fmt: skip
    assert markdown_tables([]) == ""


def test_where_each_cell_ran() -> None:
    cells = [_cell("a", gpus=("GPU-1", "GPU-2"), slot=0), _cell("b"),
             _cell("c_d", 2, 8, gpus=("GPU-<3>",))]  # fmt: skip
    assert placement_table(cells) == [
        "## Where each cell ran", "", "| config | TP | c | slot | GPUs (UUID) |",
        "|---|---|---|---|---|", "| a | 1 | 4 | 0 | GPU-1, GPU-2 |",
        "| c\\_d | 2 | 8 | – | GPU-\\<3\\> |", ""]  # fmt: skip
    assert placement_table([_cell()]) == []


def test_attention_comes_as_a_table_of_cell_what_and_why() -> None:
    cells = [_cell("a", status="failed", extra={"reason": "all <4> failed"}), _cell("b")]
    assert attention_markdown(cells) == [
        "## Needs attention", "", "| cell | what | why |", "|---|---|---|",
        "| a (TP1) c=4 | **FAILED** | all \\<4\\> failed |", ""]  # fmt: skip
    assert attention_markdown([_cell()]) == []


def test_the_workload_and_slo_section(tmp_path: Path) -> None:
    assert workload_markdown(tmp_path) == [
        "## Workload and SLO", "",
        "- plan.toml is missing or unreadable: the workload is unknown",
        "- **SLO**: no SLO set (\\[slo\\] in the plan): goodput is not computed", ""]  # fmt: skip
    (tmp_path / "plan.toml").write_text("[workload]\nseed = 3\n[slo]\nttft_ms = 200\n")
    lines = workload_markdown(tmp_path)
    assert lines[2] == "- **prompts**: random"
    assert "- **requests**: 64 per cell, seed 3" in lines
    assert lines[-2].startswith("- **SLO**: TTFT ≤ 200 ms (goodput")


def test_server_signals_lines_start_with_a_blank_line_or_are_none() -> None:
    assert server_signal_lines([_cell()]) == []
    signals = {"url": "http://x/metrics", "signals": {"running": {"available": True, "max": 2}}}
    cell = _cell()
    assert cell.measurement is not None
    cell.measurement["server_signals"] = signals
    lines = server_signal_lines([cell])
    assert lines[:2] == ["", "## Server signals (scraped from /metrics during each cell)"]
    assert lines[-1].startswith("| cfg | 1 | c=4 |")


def test_the_page_states_its_run_counts_and_plots_in_order(tmp_path: Path) -> None:
    run = tmp_path / "my_run"
    run.mkdir()
    text = render_markdown(run, [_cell()], [run / "throughput_vs_concurrency.png"])
    lines = text.split("\n")
    assert lines[:4] == ["# Benchmark report: my\\_run", "",
                         "1 cells: 1 ok, 0 failed, 0 crashed, 0 skipped.", ""]  # fmt: skip
    assert lines.index("## Workload and SLO") < lines.index("## TP 1") < lines.index("## Plots")
    assert "![throughput_vs_concurrency](throughput_vs_concurrency.png)" in lines
    assert ("Each cell: **output tok/s · TTFT p50/p99 ms · TPOT p50 ms · accept length** (– = not"
            " available). Definitions: docs/bench-metrics.md.") in lines  # fmt: skip
    assert f"No plots: {PLOTS_HINT}." not in lines
    bare = render_markdown(run, [_cell()], [], notes=["3 <corrupt> lines"]).split("\n")
    assert bare[2:6] == ["1 cells: 1 ok, 0 failed, 0 crashed, 0 skipped.", "",
                         "> **Warning:** 3 \\<corrupt\\> lines", ""]  # fmt: skip
    assert f"No plots: {PLOTS_HINT}." in bare


def _run_dir(path: Path, rows: list[dict], tail: str = "") -> Path:
    path.mkdir()
    (path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


def _row(key: str = "k") -> dict:
    return {"key": key, "config": "cfg", "tp": 1, "concurrency": 2, "status": "ok",
            "verdict": {"status": "ok"}, "measurement": {"metrics": METRICS}}  # fmt: skip


def test_a_report_is_written_beside_the_run_with_its_marker(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run", [_row()], tail="{torn\n")
    done = write_report(run)
    assert done.markdown == run / "report.md" and done.html == run / "report.html"
    assert done.cells == 1
    assert done.warnings[0].startswith(f"{run / 'results.jsonl'}: skipped 1 corrupt line(s)")
    md = (run / "report.md").read_text()
    assert md.startswith(f"{REPORT_MARKER}\n# Benchmark report: run\n")
    assert "> **Warning:** " in md
    page = (run / "report.html").read_text()
    assert page.startswith(f"<!DOCTYPE html>\n{REPORT_MARKER}\n")
    assert (run / "report.md").stat().st_mode & 0o777 == 0o644
    assert write_report(run).cells == 1  # its own pages are replaced


def test_a_page_gpudoctor_did_not_write_is_never_replaced(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run", [_row()])
    (run / "report.md").write_text("# my own notes\n")
    with pytest.raises(ResultsError) as err:
        write_report(run)
    assert str(err.value) == (
        f"{run / 'report.md'} exists and gpudoctor did not write it (no marker line): never"
        " replaced; choose another RUN_DIR or move it away"
    )
    assert (run / "report.md").read_text() == "# my own notes\n"
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.html").write_text("<html>mine</html>")
    with pytest.raises(ResultsError, match="choose another --out or move it away"):
        write_report(run, out)
    assert not (out / "report.md").exists()


def test_pages_of_earlier_versions_are_replaced(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run", [_row()])
    (run / "report.md").write_text("# Benchmark report: run\nold\n")
    (run / "report.html").write_text("<!DOCTYPE html>\n<html>old</html>")
    write_report(run)
    assert (run / "report.md").read_text().startswith(REPORT_MARKER)


def test_a_linked_or_unreadable_page_is_refused(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run", [_row()])
    (tmp_path / "target.md").write_text(f"{REPORT_MARKER}\n")
    (run / "report.md").symlink_to(tmp_path / "target.md")
    with pytest.raises(ResultsError, match="never replaced"):
        write_report(run)
    assert (tmp_path / "target.md").read_text() == f"{REPORT_MARKER}\n"


def test_an_out_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    run = _run_dir(tmp_path / "run", [_row()])
    out = tmp_path / "open"
    out.mkdir()
    out.chmod(0o777)
    with pytest.raises(ResultsError, match="--out"):
        write_report(run, out)
    assert list(out.iterdir()) == []
