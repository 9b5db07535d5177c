"""Label values in the Prometheus textfile: the exact escaping of ``\\``, newline and ``"``
(the text exposition format's three escapes), and a round trip through a real parser: a
real node_exporter (Debian's prometheus-node-exporter, Go's expfmt) reads the file from its
textfile directory and serves the same samples, re-escaped by its own writer.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from gpudoctor.model import CheckResult, Finding, Report, Status
from gpudoctor.output.prometheus import (
    label_value,
    labels,
    read_previous_success,
    textfile,
)

NASTY = 'ct "200"\\n\nback\\slash'  # a quote pair, a literal backslash-n, a newline, a backslash


def report(target: str, subject: str, status: Status = Status.FAIL) -> Report:
    finding = Finding("device.open", status, subject, "denied")
    return Report(target, (CheckResult("device.open", (finding,), 0.25),))


def test_label_values_escape_exactly_backslash_newline_and_quote() -> None:
    assert label_value("a\\b") == "a\\\\b"
    assert label_value("a\nb") == "a\\nb"
    assert label_value('a"b') == 'a\\"b'
    # the backslash first: an escaped quote or newline is never escaped twice
    assert label_value('\\"\n') == '\\\\\\"\\n'
    assert label_value(NASTY) == 'ct \\"200\\"\\\\n\\nback\\\\slash'
    assert label_value("plain/ct:200 é\t") == "plain/ct:200 é\t"  # nothing else changes
    assert labels([("a", 'x"'), ("b", "y")]) == '{a="x\\"",b="y"}'


def test_written_sample_lines_carry_the_escaped_values() -> None:
    text = textfile([report(NASTY, "/dev/x\\y")], None, now=1000)
    value = label_value(NASTY)
    assert f'gpudoctor_up{{target="{value}"}} 1\n' in text
    assert (
        f'gpudoctor_check_status{{check="device.open",subject="/dev/x\\\\y",target="{value}"}} 3\n'
        in text
    )
    # one sample per line: no raw newline of a value splits a line
    assert all(line.startswith(("#", "gpudoctor_")) for line in text.splitlines())


def test_last_success_of_an_escaped_target_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "gpudoctor.prom"
    path.write_text(textfile([report(NASTY, "s", Status.PASS)], None, now=1234))
    assert read_previous_success(str(path)) == {NASTY: 1234.0}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_node_exporter_reads_the_escaped_values_back(tmp_path: Path) -> None:
    """node_exporter parses the textfile (a bad escape is a scrape error and no samples)
    and writes the samples again with Go's own escaping: the same bytes as ours."""
    exporter = shutil.which("prometheus-node-exporter")
    if not exporter:
        pytest.skip("prometheus-node-exporter missing (apt-get install it; tests/run.sh does)")
    textdir = tmp_path / "textfile"
    textdir.mkdir()
    text = textfile([report(NASTY, 'sub"ject\n2'), report("plain", "s", Status.PASS)], None, 99)
    (textdir / "gpudoctor.prom").write_text(text)
    port = free_port()
    proc = subprocess.Popen(
        [exporter, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
         "--collector.textfile", f"--collector.textfile.directory={textdir}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        served = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "node_textfile_scrape_error" not in served:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    served = r.read().decode()
            except OSError:
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "node_textfile_scrape_error 0" in served, served[-2000:]
    ours = [ln for ln in text.splitlines() if ln.startswith(("gpudoctor_up", "gpudoctor_status"))]
    ours += [ln for ln in text.splitlines() if ln.startswith("gpudoctor_check_status")]
    assert len(ours) == 6
    for line in ours:
        assert line in served.splitlines(), (line, served[-2000:])
