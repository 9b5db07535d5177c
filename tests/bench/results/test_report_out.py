"""`bench report RUN --out DIR` never replaces a report.md (or report.html) it did not
write (issue 34.6): the same marker-line rule as `list --markdown`. The real CLI in a
subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.bench.launch.test_out_security import _tiny_run


def _report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpudoctor", "bench", "report", *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})  # fmt: skip


def test_report_out_never_replaces_a_page_it_did_not_write(tmp_path: Path) -> None:
    run = _tiny_run(tmp_path / "run")
    docs = tmp_path / "docs"
    docs.mkdir()
    mine = "# My notes on the cluster\n\nweeks of work\n"
    (docs / "report.md").write_text(mine)
    refused = _report(str(run), "--out", str(docs))
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    assert "Traceback" not in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    assert (
        f"{docs}/report.md exists and gpudoctor did not write it (no marker line)" in refused.stderr
    )
    assert "choose another --out or move it away" in refused.stderr
    assert (docs / "report.md").read_text() == mine
    assert sorted(p.name for p in docs.iterdir()) == ["report.md"]  # nothing else written
    (docs / "report.md").unlink()
    (docs / "report.html").write_text("<html>my page</html>\n")
    assert (
        "report.html exists and gpudoctor did not write it"
        in _report(str(run), "--out", str(docs)).stderr
    )
    (docs / "report.html").unlink()
    for _ in range(2):  # its own report, written again: replaced
        done = _report(str(run), "--out", str(docs))
        assert done.returncode == 0, done.stderr
    marker = "<!-- written by `gpudoctor bench report`: regenerate, do not edit -->"
    assert (docs / "report.md").read_text().splitlines()[0] == marker
    assert marker in (docs / "report.html").read_text()


def test_a_report_of_an_earlier_version_is_still_replaced(tmp_path: Path) -> None:
    """A run dir's report.md from before the marker (it starts "# Benchmark report: ")
    is gpudoctor's: `bench report RUN` writes it anew without a word."""
    run = _tiny_run(tmp_path / "run")
    (run / "report.md").write_text("# Benchmark report: run\n\nold\n")
    (run / "report.html").write_text("<!DOCTYPE html>\n<html>old</html>\n")
    done = _report(str(run))
    assert done.returncode == 0, done.stderr
    assert "old" not in (run / "report.md").read_text()


def test_an_emoji_config_name_prints_no_matplotlib_warning(tmp_path: Path) -> None:
    """34.8: an emoji in a configuration's name made matplotlib print a glyph UserWarning
    with a source path on every `bench report`."""
    import json

    run = tmp_path / "run"
    run.mkdir()
    record = {"config": "🚀fast", "tp": 1, "status": "ok",
              "measurement": {"output_throughput": 1.0, "duration_s": 1.0}}  # fmt: skip
    (run / "results.jsonl").write_text("".join(
        json.dumps({**record, "key": f"k{c}", "concurrency": c}) + "\n" for c in (1, 2)))  # fmt: skip
    done = _report(str(run))
    assert done.returncode == 0, done.stderr
    assert "3 plots" in done.stdout, done.stdout
    assert "Warning" not in done.stderr and "Glyph" not in done.stderr, done.stderr
