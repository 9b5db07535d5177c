"""report.html's request timeline as a reader gets it: one panel per trace file (the first
shown), a picker naming each cell, each request a bar at its time and lane (light while it
waited for its first token, red with a cross when it failed), its tooltip, and anything
read from a file escaped. Real trace files written by trace.write_trace in tmp_path."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from gpudoctor.bench.request_record import RequestRecord
from gpudoctor.bench.results.timeline_html import MAX_TRACES, WIDTH, section, svg
from gpudoctor.bench.results.trace import trace_document, write_trace

NS = "{http://www.w3.org/2000/svg}"
PLOT_W = WIDTH - 56 - 36


def _ok(i: int, send: float, ttft: float = 0.25, end: float = 1.0) -> RequestRecord:
    return RequestRecord(index=i, prompt_len=4, max_tokens=4, send_s=send, ok=True,
                         ttft_s=ttft, e2e_s=end, wall_s=end, output_tokens=4)  # fmt: skip


def _bad(i: int, send: float, error: str = "HTTP 500: <boom>") -> RequestRecord:
    return RequestRecord(index=i, prompt_len=4, max_tokens=4, send_s=send, ok=False,
                         wall_s=0.5, status_code=500, error_kind="http_5xx", error=error)  # fmt: skip


def test_each_request_is_a_bar_at_its_time_and_lane() -> None:
    doc = trace_document([_ok(0, 0.0), _ok(1, 0.5, ttft=0.1, end=1.5), _bad(2, 1.0)], "c-c2")
    root = ET.fromstring(svg(doc))
    assert root.get("class") == "timeline"
    height = 24 + 2 * 6 + 30
    assert (root.get("width"), root.get("height"), root.get("viewBox")) == (
        str(WIDTH), str(height), f"0 0 {WIDTH} {height}")  # fmt: skip
    texts = [t.text for t in root.iter(f"{NS}text")]
    assert texts[0] == "c-c2: 3 of 3 requests drawn, 1 failed"
    assert texts[1:7] == ["0 s", "0.4 s", "0.8 s", "1.2 s", "1.6 s", "2 s"]
    groups = list(root.iter(f"{NS}g"))
    assert [g.get("class") for g in groups] == ["request", "request", "failed"]
    bars = [g.findall(f"{NS}rect") for g in groups]
    scale = PLOT_W / 2.0  # the last request ends at 2.0 s
    first, waiting = bars[0]
    assert (float(first.get("x", "")), first.get("y"), first.get("height")) == (56.0, "24", "5")
    assert float(first.get("width", "")) == round(1.0 * scale, 1)
    assert first.get("fill") == "#1f77b4"
    assert float(waiting.get("width", "")) == round(0.25 * scale, 1)
    assert waiting.get("fill") == "#aec7e8" and waiting.get("y") == "24"
    second = bars[1][0]
    assert second.get("y") == "30"  # the second lane: the first request is still running
    assert float(second.get("x", "")) == round(56 + 0.5 * scale, 1)
    (red,) = bars[2]
    assert red.get("fill") == "#d62728" and red.get("y") == "24"  # lane 0 is free again at 1.0 s
    cross = groups[2].find(f"{NS}text")
    assert cross is not None and cross.text == "\u2715"
    assert (cross.get("fill"), cross.get("font-size"), cross.get("y")) == ("#d62728", "9", "30")
    assert float(cross.get("x", "")) == round(56 + 1.5 * scale, 1)
    tips = [g.findtext(f"{NS}title") for g in groups]
    assert tips == [
        "req 0: sent 0.000 s, ended 1.000 s, TTFT 250 ms",
        "req 1: sent 0.500 s, ended 2.000 s, TTFT 100 ms",
        "FAILED req 2 (http_5xx): sent 1.000 s, ended 1.500 s, TTFT -, HTTP 500: <boom>",
    ]


def test_a_bar_is_at_least_one_pixel_wide() -> None:
    doc = trace_document([_ok(0, 0.0, ttft=0.0, end=0.0), _ok(1, 0.0, end=100.0)], "c")
    root = ET.fromstring(svg(doc))
    rect = next(root.iter(f"{NS}rect"))
    assert rect.get("width") == "1.0"


def test_a_trace_without_requests_or_metadata_still_reads() -> None:
    assert svg({"traceEvents": []}) == "<p>No requests in this trace.</p>"
    events = [{"ph": "X", "cat": "request", "name": "req 0", "ts": 0, "dur": 10, "tid": 0},
              {"ph": "X", "cat": "phase", "name": "streaming", "ts": 0, "dur": 10, "tid": 0},
              {"ph": "X", "cat": "request", "ts": "0", "dur": 10, "tid": 0},
              {"ph": "X", "cat": "request", "ts": 0, "dur": 10, "tid": 1.0}, "junk"]  # fmt: skip
    root = ET.fromstring(svg({"traceEvents": events, "metadata": "x"}))
    assert next(root.iter(f"{NS}text")).text == ": 1 of 1 requests drawn, 0 failed"
    assert len(list(root.iter(f"{NS}g"))) == 1
    zero = {"traceEvents": [{"ph": "X", "cat": "request", "ts": 0, "dur": 0, "tid": 0}]}
    assert len(list(ET.fromstring(svg(zero)).iter(f"{NS}g"))) == 1  # no division by zero


def _traces(run: Path, *labels: str) -> None:
    for label in labels:
        write_trace(run / "trace" / f"{label}.json", label, [_ok(0, 0.0)], None)


def test_the_section_offers_every_cell_and_shows_the_first(tmp_path: Path) -> None:
    _traces(tmp_path, "b-c2", "a-c1")
    (tmp_path / "trace" / "broken.json").write_text("{not json")
    (tmp_path / "trace" / "notes.txt").write_text("not a trace")
    html = section(tmp_path)
    assert html.startswith("<h2>Request timeline</h2>\n<p>Each bar is one request: light until")
    assert "(RUN/trace/&lt;cell&gt;.json).</p>" in html
    assert re.findall(r'<option value="([^"]*)">', html) == ["a-c1", "b-c2", "broken"]
    assert '<select id="timeline-pick" onchange="gpudoctorPickCell(this)">' in html
    panels = re.findall(r'<div class="timeline" data-cell="([^"]*)" style="display:(\w+)">', html)
    assert panels == [("a-c1", "block"), ("b-c2", "none"), ("broken", "none")]
    assert "<p>broken.json: not a trace file</p>" in html
    assert html.endswith("</script>") and "function gpudoctorPickCell(sel)" in html


def test_no_trace_folder_or_files_is_no_section(tmp_path: Path) -> None:
    assert section(tmp_path) == ""
    (tmp_path / "trace").mkdir()
    assert section(tmp_path) == ""
    (tmp_path / "trace.json").write_text("{}")
    other = tmp_path / "file-run"
    other.mkdir()
    (other / "trace").write_text("a file, not a folder")
    assert section(other) == ""


def test_cell_names_and_messages_from_files_are_escaped(tmp_path: Path) -> None:
    label = 'x"><script>alert(1)</script>'
    folder = tmp_path / "trace"
    folder.mkdir()
    doc = trace_document([_bad(0, 0.0, error="<img src=x onerror=alert(2)>")], label)
    (folder / f"{label.replace('/', '_')}.json").write_text(json.dumps(doc))
    html = section(tmp_path)
    assert "<script>alert" not in html and "<img" not in html
    assert "&lt;img src=x onerror=alert(2)&gt;" in html
    assert '<option value="x&quot;&gt;&lt;script&gt;alert(1)&lt;_script&gt;">' in html


def test_at_most_max_traces_cells_are_offered(tmp_path: Path) -> None:
    folder = tmp_path / "trace"
    folder.mkdir()
    doc = json.dumps(trace_document([_ok(0, 0.0)], "c"))
    for n in range(MAX_TRACES + 2):
        (folder / f"c{n:04d}.json").write_text(doc)
    html = section(tmp_path)
    assert html.count("<option ") == MAX_TRACES == 200
    assert 'value="c0199"' in html and 'value="c0200"' not in html


def test_the_section_s_words_and_picker_read_as_written(tmp_path: Path) -> None:
    _traces(tmp_path, "a", "b")
    html = section(tmp_path)
    assert ("<p>Each bar is one request: light until its first token, dark while it streams,"
            " red with a cross when it failed. The same file opens in ui.perfetto.dev"
            " (RUN/trace/&lt;cell&gt;.json).</p>") in html  # fmt: skip
    assert ('<select id="timeline-pick" onchange="gpudoctorPickCell(this)"><option value="a">a'
            '</option><option value="b">b</option></select></label>') in html  # fmt: skip


def test_the_header_counts_come_from_the_trace_s_metadata() -> None:
    doc = trace_document([_ok(0, 0.0), _ok(1, 0.1), _bad(2, 0.2)], "c")
    doc["metadata"].update(requests=10, requests_kept=3, failed=4)
    root = ET.fromstring(svg(doc))
    assert next(root.iter(f"{NS}text")).text == "c: 3 of 10 requests drawn, 4 failed"


def test_time_ticks_are_six_along_the_bottom_in_seconds() -> None:
    doc = trace_document([_ok(0, 0.0, end=2.5)], "c")
    root = ET.fromstring(svg(doc))
    ticks = [t for t in root.iter(f"{NS}text") if (t.text or "").endswith(" s")]
    assert [t.text for t in ticks] == ["0 s", "0.5 s", "1 s", "1.5 s", "2 s", "2.5 s"]
    height = 24 + 6 + 30
    assert {t.get("y") for t in ticks} == {str(height - 10)}
    bar = next(root.iter(f"{NS}g"))
    assert bar.findtext(f"{NS}title") == "req 0: sent 0.000 s, ended 2.500 s, TTFT 250 ms"
    waiting = bar.findall(f"{NS}rect")[1]
    assert waiting.get("height") == "5"


def test_a_first_token_at_the_send_time_draws_no_waiting_part() -> None:
    doc = trace_document([_ok(0, 0.0, ttft=0.0, end=1.0)], "c")
    waiting = ET.fromstring(svg(doc)).findall(f".//{NS}rect")[1]
    assert waiting.get("width") == "0.0"


def test_a_cell_of_instant_requests_still_draws() -> None:
    doc = {"traceEvents": [{"ph": "X", "cat": "request", "name": "r", "ts": 0, "dur": 0, "tid": 0}]}
    rect = next(ET.fromstring(svg(doc)).iter(f"{NS}rect"))
    assert rect.get("x") == "56.0" and rect.get("width") == "1.0"
    ticks = [t.text for t in ET.fromstring(svg(doc)).iter(f"{NS}text")][1:]
    assert ticks == ["0 s", "2e-07 s", "4e-07 s", "6e-07 s", "8e-07 s", "1e-06 s"]


def test_a_timeline_holds_nothing_but_elements() -> None:
    root = ET.fromstring(svg(trace_document([_ok(0, 0.0), _bad(1, 0.5)], "c")))
    assert not (root.text or "").strip()
    assert all(not (el.tail or "").strip() for el in root.iter())


def test_the_timeline_opens_on_the_reports_first_cell(tmp_path: Path) -> None:
    """Issue 47: the timeline opened on another cell than the first (file names sort c16
    before c2, and "broken" before "fast"): the traces follow the report's cells."""
    from gpudoctor.bench.results.reader import CellResult
    from gpudoctor.bench.results.trace import cell_label, trace_path

    def cell(config: str, c: int, rate: float | None = None, repeat: int = 0) -> CellResult:
        return CellResult(key=f"{config}{c}", config=config, tp=1, concurrency=c, status="ok",
                          measurement=None, request_rate=rate, repeat=repeat)  # fmt: skip

    cells = [cell("fast", 2), cell("fast", 16), cell("fast", 2, 30.0), cell("fast", 2, None, 1)]
    for c in [*cells, cell("broken", 1)]:
        label = cell_label(f"{c.config}@tp1", c.concurrency, c.request_rate, c.repeat)
        write_trace(trace_path(tmp_path, label), label, [_ok(0, 0.0)], None)
    text = section(tmp_path, cells)
    picked = re.findall(r'<option value="([^"]+)">', text)
    assert picked == ["fast_tp1-c2", "fast_tp1-c16", "fast_tp1-c2-r30", "fast_tp1-c2-rep1",
                      "broken_tp1-c1"]  # fmt: skip
    assert re.findall(r'data-cell="([^"]+)" style="display:block"', text) == ["fast_tp1-c2"]
    assert re.findall(r'<option value="([^"]+)">', section(tmp_path))[0] == "broken_tp1-c1"
