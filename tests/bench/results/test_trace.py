"""The request timeline: a valid Chrome/Perfetto trace (Trace Event Format), bounded in
size, lanes that never overlap, failures marked; and report.html's view of it rendered
in a real headless Chromium (a screenshot kept in docs/ when asked)."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

from gpudoctor.bench.request_record import RequestRecord
from gpudoctor.bench.results.timeline_html import section
from gpudoctor.bench.results.trace import MAX_REQUESTS, lanes, trace_path, write_trace
from tests.bench.results.test_html_report import _chromium, _png_size

PHASES = {"M", "X", "i", "C"}


def records(
    n: int, concurrency: int = 8, fail_every: int = 0, seed: int = 1
) -> list[RequestRecord]:
    """A closed-loop cell of ``n`` requests on ``concurrency`` workers (real records)."""
    rnd = random.Random(seed)
    free_at = [0.0] * concurrency
    out = []
    for i in range(n):
        w = min(range(concurrency), key=lambda k: free_at[k])
        send = free_at[w] + 0.001
        ttft, e2e = rnd.uniform(0.02, 0.2), rnd.uniform(0.3, 1.2)
        failed = fail_every and i % fail_every == fail_every - 1
        out.append(RequestRecord(
            index=i, prompt_len=64, max_tokens=32, send_s=send, ok=not failed,
            ttft_s=None if failed else ttft, e2e_s=None if failed else e2e,
            wall_s=0.05 if failed else e2e, output_tokens=0 if failed else 32,
            status_code=500 if failed else 200, error_kind="http_5xx" if failed else None,
            error="HTTP 500: <engine died>" if failed else None,
        ))  # fmt: skip
        free_at[w] = send + (0.05 if failed else e2e)
    return out


def check_trace_format(doc: dict) -> None:
    """Assert the Trace Event Format's JSON object form: what Perfetto/Chrome load."""
    json.loads(json.dumps(doc))  # plain JSON, no NaN/inf
    assert isinstance(doc["traceEvents"], list) and doc["displayTimeUnit"] in ("ms", "ns")
    for e in doc["traceEvents"]:
        assert e["ph"] in PHASES and isinstance(e["name"], str) and isinstance(e["pid"], int)
        if e["ph"] in ("X", "i", "C"):
            assert isinstance(e["ts"], int) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], int) and e["dur"] >= 0 and isinstance(e["tid"], int)
        if e["ph"] == "i":
            assert e["s"] in ("g", "p", "t")
        if e["ph"] == "C":
            assert all(isinstance(v, (int, float)) for v in e["args"].values())


def test_trace_is_valid_and_marks_failures(tmp_path: Path) -> None:
    recs = records(60, fail_every=10)
    signals = {"signals": {"running": {"available": True, "series": [[0.0, 0], [1.5, 7]]}}}
    path = write_trace(trace_path(tmp_path, "fast tp1/c8"), "fast tp1/c8", recs, signals)
    assert path == tmp_path / "trace" / "fast_tp1_c8.json"
    doc = json.loads(path.read_text())
    check_trace_format(doc)
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] in ("request", "failed")]
    assert len(slices) == 60
    failed = [e for e in slices if e["cat"] == "failed"]
    assert len(failed) == 6 and all(e["name"].startswith("FAILED") for e in failed)
    assert sum(e["ph"] == "i" for e in doc["traceEvents"]) == 6
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert [(e["ts"], e["args"]["value"]) for e in counters] == [(0, 0), (1_500_000, 7)]
    assert doc["metadata"] == {"cell": "fast tp1/c8", "requests": 60, "requests_kept": 60,
                               "failed": 6, "source": "gpudoctor"}  # fmt: skip


def test_lanes_never_hold_two_requests_at_once() -> None:
    recs = sorted(records(300, concurrency=16), key=lambda r: r.send_s)
    rows = lanes(recs)
    assert max(rows) + 1 <= 16  # never more rows than requests in flight
    by_lane: dict[int, float] = {}
    for r, lane in zip(recs, rows, strict=True):
        assert r.send_s >= by_lane.get(lane, 0.0)
        by_lane[lane] = r.end_s


def test_a_long_cell_is_bounded_and_keeps_every_failure(tmp_path: Path) -> None:
    recs = records(50_000, concurrency=64, fail_every=100)
    path = write_trace(trace_path(tmp_path, "long"), "long", recs, None)
    doc = json.loads(path.read_text())
    check_trace_format(doc)
    meta = doc["metadata"]
    assert meta["requests"] == 50_000 and meta["requests_kept"] == MAX_REQUESTS
    kept_failed = sum(1 for e in doc["traceEvents"] if e.get("cat") == "failed")
    assert kept_failed == 500  # all of them
    assert path.stat().st_size < 2_000_000  # a few hundred bytes per drawn request


def test_timeline_renders_in_chromium(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_trace(trace_path(run, "tp1-c8"), "tp1-c8", records(120, fail_every=25), None)
    write_trace(
        trace_path(run, "tp1-c<script>alert(1)</script>"),
        "tp1-c<script>alert(1)</script>",
        records(10),
        None,
    )  # a hostile name
    body = section(run)
    assert "<script>alert(1)" not in body
    page = tmp_path / "timeline.html"
    page.write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'><script>window.onerror=function(m)"
        "{document.body.setAttribute('data-errors',m)};</script></head><body>"
        f"{body}<script>document.body.setAttribute('data-shown', String(Array.from("
        "document.querySelectorAll('div.timeline')).filter(function(d){return "
        "d.style.display!=='none'}).length));gpudoctorPickCell({value:'tp1-c8'});"
        "document.body.setAttribute('data-picked', document.querySelector("
        "'div.timeline[style*=block]').getAttribute('data-cell'));</script></body></html>"
    )
    dom = _chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-shown="1"' in dom.stdout and 'data-picked="tp1-c8"' in dom.stdout
    assert 'data-errors="' not in dom.stdout
    assert dom.stdout.count('<g class="failed">') == 4  # 120 requests, every 25th failed
    shot = tmp_path / "timeline.png"
    done = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=960,260",
                     "--hide-scrollbars", page.as_uri())  # fmt: skip
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    assert _png_size(shot) == (960, 260)
    keep = os.environ.get("GPUDOCTOR_TIMELINE_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)
