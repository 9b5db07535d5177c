"""`gpudoctor bench report` as its user meets it: report.md line by line, the warnings on
both pages (a corrupt results line, matplotlib not installed), the folder the pages go
to (made when missing, refused when others can write it, named by the option the user
gave), the pages' mode, and which existing page counts as gpudoctor's. Real run
directories in tmp_path; matplotlib made unimportable in-process where the test is about
a machine without it (as ``pip install gpudoctor`` without ``[plots]`` leaves it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpudoctor.bench.results.reader import ResultsError
from gpudoctor.bench.results.report import (
    PLOT_FILES,
    PLOTS_HINT,
    REPORT_MARKER,
    render_markdown,
    write_report,
)
from tests.bench.results.test_report_markdown import _cell

ROW = {"key": "k", "config": "cfg", "tp": 1, "concurrency": 2, "status": "ok",
       "measurement": {"metrics": {"output_throughput": 10.0}}}  # fmt: skip
CORRUPT = "skipped 1 corrupt line(s)"


def _run(path: Path, corrupt: bool = False) -> Path:
    path.mkdir()
    tail = "{torn\n" if corrupt else ""
    (path / "results.jsonl").write_text(json.dumps(ROW) + "\n" + tail)
    return path


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """matplotlib not installed: ``import matplotlib`` raises ImportError."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)


def test_report_md_reads_top_to_bottom(tmp_path: Path) -> None:
    run = tmp_path / "run1"
    run.mkdir()
    cell = _cell(gpus=("GPU-1",), slot=0)
    text = render_markdown(run, [cell], [run / PLOT_FILES["throughput"]], ["1 corrupt line"])
    assert text.split("\n") == [
        "# Benchmark report: run1",
        "",
        "1 cells: 1 ok, 0 failed, 0 crashed, 0 skipped.",
        "",
        "> **Warning:** 1 corrupt line",
        "",
        "## Workload and SLO",
        "",
        "- plan.toml is missing or unreadable: the workload is unknown",
        "- **SLO**: no SLO set (\\[slo\\] in the plan): goodput is not computed",
        "",
        "Each cell: **output tok/s · TTFT p50/p99 ms · TPOT p50 ms · accept length** (– = not"
        " available). Definitions: docs/bench-metrics.md.",
        "",
        "## TP 1",
        "",
        "| config | c=4 |",
        "|---|---|",
        "| cfg | 1234 · 11/20 · 1.3 · 2.50 |",
        "",
        "## Plots",
        "",
        "![throughput_vs_concurrency](throughput_vs_concurrency.png)",
        "",
        "## Where each cell ran",
        "",
        "| config | TP | c | slot | GPUs (UUID) |",
        "|---|---|---|---|---|",
        "| cfg | 1 | 4 | 0 | GPU-1 |",
        "",
    ]


@pytest.mark.usefixtures("no_matplotlib")
def test_without_matplotlib_both_pages_are_written_and_say_how_to_get_plots(
    tmp_path: Path,
) -> None:
    run = _run(tmp_path / "run")
    done = write_report(run)
    assert (done.plots, done.warnings) == ((), (PLOTS_HINT,))
    md = (run / "report.md").read_text()
    assert f"No plots: {PLOTS_HINT}." in md.split("\n")
    assert "> **Warning:**" not in md  # a missing extra is said once, not as a data warning
    assert not list(run.glob("*.png"))
    assert (run / "report.html").read_text().startswith(f"<!DOCTYPE html>\n{REPORT_MARKER}\n")


@pytest.mark.usefixtures("no_matplotlib")
def test_a_corrupt_line_is_the_warning_on_both_pages(tmp_path: Path) -> None:
    run = _run(tmp_path / "run", corrupt=True)
    done = write_report(run)
    assert len(done.warnings) == 2 and CORRUPT in done.warnings[0]
    assert done.warnings[1] == PLOTS_HINT
    md = (run / "report.md").read_text().split("\n")
    shown = [line for line in md if line.startswith("> **Warning:**")]
    assert len(shown) == 1 and CORRUPT in shown[0]  # the data's warning, not the extra's
    assert CORRUPT in (run / "report.html").read_text()


@pytest.mark.usefixtures("no_matplotlib")
def test_a_missing_out_folder_is_made(tmp_path: Path) -> None:
    run = _run(tmp_path / "run")
    out = tmp_path / "reports" / "today"
    done = write_report(run, out)
    assert (done.markdown, done.html) == (out / "report.md", out / "report.html")
    assert out.is_dir() and (out / "report.md").is_file()
    assert not (run / "report.md").exists()


@pytest.mark.usefixtures("no_matplotlib")
def test_a_run_folder_others_can_write_is_refused_naming_run_dir(tmp_path: Path) -> None:
    run = _run(tmp_path / "run")
    run.chmod(0o777)
    with pytest.raises(ResultsError) as err:
        write_report(run)
    assert "choose another RUN_DIR" in str(err.value)
    assert not (run / "report.md").exists()


@pytest.mark.usefixtures("no_matplotlib")
def test_the_pages_are_readable_by_all_whatever_they_were(tmp_path: Path) -> None:
    run = _run(tmp_path / "run")
    for name in ("report.md", "report.html"):
        (run / name).write_text(f"{REPORT_MARKER}\nold\n")
        (run / name).chmod(0o600)
    write_report(run)
    assert [(run / n).stat().st_mode & 0o777 for n in ("report.md", "report.html")] == [0o644] * 2


@pytest.mark.usefixtures("no_matplotlib")
def test_only_the_head_of_a_page_says_gpudoctor_wrote_it(tmp_path: Path) -> None:
    """The marker counts in the first 4096 bytes; a user's page that quotes it further
    down (ending at byte 4097) is still the user's."""
    run = _run(tmp_path / "run")
    notes = "x" * (4097 - len(REPORT_MARKER)) + REPORT_MARKER + "\nmy notes\n"
    (run / "report.md").write_text(notes)
    with pytest.raises(ResultsError, match="gpudoctor did not write it"):
        write_report(run)
    assert (run / "report.md").read_text() == notes


@pytest.mark.usefixtures("no_matplotlib")
def test_a_page_that_is_a_link_is_refused_saying_so(tmp_path: Path) -> None:
    run = _run(tmp_path / "run")
    (tmp_path / "elsewhere.md").write_text(f"{REPORT_MARKER}\n")
    (run / "report.md").symlink_to(tmp_path / "elsewhere.md")
    with pytest.raises(ResultsError) as err:
        write_report(run)
    message = str(err.value)
    assert message.startswith(f"{run / 'report.md'}") and "link" in message
    assert message.endswith(": never replaced; choose another RUN_DIR or move it away")
