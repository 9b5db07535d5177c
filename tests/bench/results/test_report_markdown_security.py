"""report.md rendered by a real CommonMark renderer (markdown-it-py, GFM tables on, raw HTML
allowed as CommonMark allows it: GitHub, GitLab and most wikis render it so) and the
result loaded in a real headless Chromium (issue 33.8): the run's strings (the run
directory's name, config names, statuses, GPU ids, all chosen by whoever wrote the run)
must show as text, never run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from markdown_it import MarkdownIt

from tests.bench.results.test_html_report import _chromium

RUN_NAME = "r<img src=x onerror=document.body.dataset.run=1>"
CONFIG = "<script>document.body.dataset.config = 1</script>"
GPU = "GPU-<img src=x onerror=document.body.dataset.gpu=1>"
STATUS = "<img src=x onerror=document.body.dataset.status=1>"


def test_report_md_runs_no_script_in_a_commonmark_renderer(tmp_path: Path) -> None:
    """Attack: a run whose directory name, config name, GPU id and status are HTML; the
    report.md that `bench report` wrote carried them raw, and the rendered page ran them
    (``data-config``, ``data-run``... appear on ``<body>`` on the code before this fix)."""
    run = tmp_path / RUN_NAME
    run.mkdir()
    rows = [{"key": "k1", "config": CONFIG, "tp": 1, "concurrency": 1, "status": "crashed",
             "gpus": [GPU], "slot": 0, "measurement": None},
            {"key": "k2", "config": "x|y", "tp": 1, "concurrency": 2, "status": STATUS,
             "measurement": None}]  # fmt: skip
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = subprocess.run([sys.executable, "-m", "gpudoctor", "bench", "report", str(run)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    markdown = (run / "report.md").read_text()
    body = MarkdownIt("commonmark").enable("table").render(markdown)
    page = tmp_path / "report-md.html"
    page.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'></head><body>{body}</body></html>"
    )
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    body_tag = dom.stdout[
        dom.stdout.index("<body") : dom.stdout.index(">", dom.stdout.index("<body")) + 1
    ]
    assert body_tag == "<body>", body_tag  # no data-run/config/gpu/status: nothing ran
    for shown in ("&lt;script&gt;document.body.dataset.config = 1&lt;/script&gt;",
                  "GPU-&lt;img src=x onerror=document.body.dataset.gpu=1&gt;",
                  "&lt;img src=x onerror=document.body.dataset.status=1&gt;", "x|y"):  # fmt: skip
        assert shown in dom.stdout, (shown, dom.stdout[-3000:])
    assert "<script" not in body and "<img src=x" not in body
