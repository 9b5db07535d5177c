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
    unreachable_report,
)
from tests.support.signals import default_signals

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
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=default_signals,
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


def test_the_whole_textfile_of_a_small_fleet_is_exact() -> None:
    """The contract in one piece (docs/prometheus.md): HELP/TYPE once per metric, a sample
    per target, the worst status of repeated series, last success carried over for the
    failed target only, durations in seconds with 4 decimals."""
    ok = Report(
        "pve1",
        (
            CheckResult(
                "driver.loaded", (Finding("driver.loaded", Status.PASS, "host", "m"),), 0.5
            ),
            CheckResult(
                "ct.device_rules",
                (
                    Finding("ct.device_rules", Status.WARN, "200.conf", "a"),
                    Finding("ct.device_rules", Status.PASS, "200.conf", "b"),
                ),
                0.01234,
            ),
        ),
        labels=(("node", "pve1"),),
    )
    bad = Report(
        "pve2",
        (CheckResult("device.open", (Finding("device.open", Status.FAIL, "/dev/x", "m"),), 2.0),),
    )
    gone = unreachable_report("pve3", "connection refused")
    previous = {"pve2": 500.0, "pve3": 400.0, "pve1": 1.0}
    text = textfile_from([ok, bad, gone], now=1000.9, previous=previous)
    assert text == (
        "# HELP gpudoctor_up 1 when the target was reached and its checks ran, else 0.\n"
        "# TYPE gpudoctor_up gauge\n"
        'gpudoctor_up{target="pve1"} 1\n'
        'gpudoctor_up{target="pve2"} 1\n'
        'gpudoctor_up{target="pve3"} 0\n'
        "# HELP gpudoctor_status Worst status of the target: 0 PASS, 1 SKIP, 2 WARN, 3 FAIL, 4 ERROR (unreachable).\n"
        "# TYPE gpudoctor_status gauge\n"
        'gpudoctor_status{target="pve1"} 2\n'
        'gpudoctor_status{target="pve2"} 3\n'
        'gpudoctor_status{target="pve3"} 4\n'
        "# HELP gpudoctor_last_run_timestamp_seconds Unix time of this run.\n"
        "# TYPE gpudoctor_last_run_timestamp_seconds gauge\n"
        'gpudoctor_last_run_timestamp_seconds{target="pve1"} 1000\n'
        'gpudoctor_last_run_timestamp_seconds{target="pve2"} 1000\n'
        'gpudoctor_last_run_timestamp_seconds{target="pve3"} 1000\n'
        "# HELP gpudoctor_last_success_timestamp_seconds Unix time of the last run without FAIL or ERROR.\n"
        "# TYPE gpudoctor_last_success_timestamp_seconds gauge\n"
        'gpudoctor_last_success_timestamp_seconds{target="pve1"} 1000\n'
        'gpudoctor_last_success_timestamp_seconds{target="pve2"} 500\n'
        'gpudoctor_last_success_timestamp_seconds{target="pve3"} 400\n'
        "# HELP gpudoctor_check_status Finding status: 0 PASS, 1 SKIP, 2 WARN, 3 FAIL, 4 ERROR.\n"
        "# TYPE gpudoctor_check_status gauge\n"
        'gpudoctor_check_status{check="driver.loaded",subject="host",target="pve1",node="pve1"} 0\n'
        'gpudoctor_check_status{check="ct.device_rules",subject="200.conf",target="pve1",node="pve1"} 2\n'
        'gpudoctor_check_status{check="device.open",subject="/dev/x",target="pve2"} 3\n'
        'gpudoctor_check_status{check="target.reach",subject="pve3",target="pve3"} 4\n'
        "# HELP gpudoctor_check_duration_seconds Wall time of each check.\n"
        "# TYPE gpudoctor_check_duration_seconds gauge\n"
        'gpudoctor_check_duration_seconds{check="driver.loaded",target="pve1",node="pve1"} 0.5000\n'
        'gpudoctor_check_duration_seconds{check="ct.device_rules",target="pve1",node="pve1"} 0.0123\n'
        'gpudoctor_check_duration_seconds{check="device.open",target="pve2"} 2.0000\n'
        'gpudoctor_check_duration_seconds{check="target.reach",target="pve3"} 0.0000\n'
    )
    # a target never successful has no last-success sample at all
    assert 'gpudoctor_last_success_timestamp_seconds{target="pve4"}' not in textfile_from(
        [unreachable_report("pve4", "x")], now=1, previous={}
    )


def textfile_from(reports: list[Report], now: float, previous: dict[str, float]) -> str:
    import io

    from gpudoctor.output.prometheus import write_prometheus

    out = io.StringIO()
    write_prometheus(reports, out, now=now, previous_success=previous)
    return out.getvalue()


def test_up_and_success_rules() -> None:
    from gpudoctor.output.prometheus import NOT_CHECKED, is_up, succeeded

    assert {"fleet.reach", "fleet.timeout", "fleet.state", "target.reach"} == NOT_CHECKED
    for check_id in NOT_CHECKED:
        down = Report("t", (CheckResult(check_id, (Finding(check_id, Status.SKIP, "t", "m"),)),))
        assert not is_up(down) and not succeeded(down)
    assert succeeded(report("t", "s", Status.WARN)) and succeeded(report("t", "s", Status.SKIP))
    assert not succeeded(report("t", "s", Status.ERROR)) and is_up(report("t", "s", Status.ERROR))
    unreachable = unreachable_report("pve9", "refused")
    assert unreachable.results[0].findings[0] == Finding(
        "target.reach", Status.ERROR, "pve9", "refused"
    )
