"""report.html shows a crashed server's log lines as text: a line that looks like HTML
(a server echoes a prompt, a path, an error with markup) never runs as script in the
reader's browser. A real campaign whose server crashes printing such a line, the real
report, opened in a real headless Chromium (its DOM dumped after scripts ran)."""

from __future__ import annotations

from pathlib import Path

from gpudoctor.bench.launch.campaign import LaunchOptions, run_campaign
from gpudoctor.bench.plan import load_plan
from gpudoctor.bench.results.report import write_report
from tests.bench.campaign_support import local_quirks, wait_no_leftovers
from tests.bench.results.test_html_report import _chromium
from tests.bench.results.test_merge_keeps_measurements import wrapped_plan

__all__ = ["local_quirks"]

HOSTILE = (
    "error: <script>document.body.setAttribute('data-pwned','script')</script>"
    "<img src=x onerror=\"document.body.setAttribute('data-pwned','img')\">"
)


def test_a_servers_log_line_is_shown_as_text_and_never_runs(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    plan_path, marker = wrapped_plan(tmp_path, tiny_model_dir, HOSTILE)
    marker.touch()
    out = tmp_path / "run"
    assert run_campaign(load_plan(plan_path), LaunchOptions(out=out)).crashed == 2
    assert wait_no_leftovers(out) == []
    html = write_report(out).html
    assert html is not None
    dom = _chromium(tmp_path, "--dump-dom", html.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "data-pwned=" not in dom.stdout  # neither the script nor the onerror ran
    assert "&lt;script&gt;document.body.setAttribute('data-pwned','script')" in dom.stdout
    assert "<img src=" not in dom.stdout  # no element made from the log line
