"""The Prometheus textfile never lies: it is rewritten on every run, failed ones too.

Real runs of ``gpudoctor check --format prometheus -o FILE`` on this machine, and against
an SSH address where nothing listens (a closed loopback port): the file must say
``gpudoctor_up 0`` / status 4 there, and carry the last success over.
"""

from __future__ import annotations

import os
import re
import socket
import time

from gpudoctor.model import CheckResult, Finding, Report, Status
from gpudoctor.output.prometheus import read_previous_success, textfile
from tests.cli.support import gpudoctor


def metric(text: str, name: str, target: str) -> float | None:
    """Return the value of ``name{target="..."}`` in a textfile, or None when absent."""
    match = re.search(rf'^{name}\{{target="{re.escape(target)}"\}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else None


def closed_port() -> int:
    """Return a loopback TCP port where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_healthy_run_then_unreachable_run_keeps_the_truth(tmp_path):
    """A green run, then a run whose host is unreachable: the file must turn red (up 0,
    status 4, a new run time) and keep the time of the last success."""
    prom = tmp_path / "gpudoctor.prom"
    ok = gpudoctor("check", "--only", "proc.usable", "--format", "prometheus", "-o", str(prom))
    assert ok.returncode == 0, ok.stderr
    first = prom.read_text()
    assert metric(first, "gpudoctor_up", "local") == 1
    assert metric(first, "gpudoctor_status", "local") == 0
    success = metric(first, "gpudoctor_last_success_timestamp_seconds", "local")
    assert success is not None and success == metric(
        first, "gpudoctor_last_run_timestamp_seconds", "local"
    )
    # Same target name as the unreachable run below: local -> 127.0.0.1 with a ct label is
    # different, so rename the previous series to the remote target to test the carry-over.
    remote = f"root@127.0.0.1:{closed_port()}"
    prom.write_text(first.replace('target="local"', f'target="{remote}"'))
    failed = gpudoctor(
        "check", "--host", remote, "--only", "proc.usable", "--format", "prometheus",
        "-o", str(prom), "--known-hosts", str(tmp_path / "kh"),
    )  # fmt: skip
    assert failed.returncode == 1, failed.stderr
    assert "Traceback" not in failed.stderr
    second = prom.read_text()
    assert metric(second, "gpudoctor_up", remote) == 0
    assert metric(second, "gpudoctor_status", remote) == 4
    assert metric(second, "gpudoctor_last_run_timestamp_seconds", remote) >= success
    assert metric(second, "gpudoctor_last_success_timestamp_seconds", remote) == success
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpudoctor.prom"]  # atomic, no temp


def test_unwritable_output_is_refused_before_any_check(tmp_path):
    """`-o` in a directory that does not exist: one error line, before any check runs."""
    done = gpudoctor("check", "--format", "prometheus", "-o", str(tmp_path / "no" / "x.prom"))
    assert done.returncode == 1
    assert done.stdout == ""  # no report: nothing ran
    assert "cannot write -o" in done.stderr and "Traceback" not in done.stderr


def report(target: str, status: Status) -> Report:
    finding = Finding("proc.usable", status, "host", "m")
    return Report(target, (CheckResult("proc.usable", (finding,)),))


def test_failed_run_carries_only_its_own_targets_success(tmp_path):
    """A FAIL keeps the previous success time; a target never successful has none."""
    prom = tmp_path / "x.prom"
    prom.write_text(textfile([report("a", Status.PASS), report("b", Status.FAIL)], None, now=100))
    again = textfile([report("a", Status.FAIL), report("b", Status.FAIL)], str(prom), now=200)
    assert metric(again, "gpudoctor_last_success_timestamp_seconds", "a") == 100
    assert metric(again, "gpudoctor_last_success_timestamp_seconds", "b") is None
    assert metric(again, "gpudoctor_status", "a") == 3
    assert metric(again, "gpudoctor_up", "a") == 1
    assert metric(again, "gpudoctor_last_run_timestamp_seconds", "b") == 200


def test_previous_file_not_owned_by_us_is_not_trusted(tmp_path):
    """Attack: another user plants a textfile (or a symlink to one) claiming a recent
    success, so that a failing host still looks recently healthy. Only a regular file
    owned by the caller is read back."""
    planted = tmp_path / "planted.prom"
    planted.write_text('gpudoctor_last_success_timestamp_seconds{target="a"} 9999999999\n')
    assert read_previous_success(str(planted)) == {"a": 9999999999.0}  # ours: read
    link = tmp_path / "link.prom"
    link.symlink_to(planted)
    assert read_previous_success(str(link)) == {}  # a symlink: never followed
    os.chown(planted, 65534, 65534)  # now owned by nobody
    assert read_previous_success(str(planted)) == {}
    again = textfile([report("a", Status.FAIL)], str(planted), now=200)
    assert metric(again, "gpudoctor_last_success_timestamp_seconds", "a") is None


def test_previous_file_with_broken_bytes_still_gives_its_success_times(tmp_path):
    """A previous textfile holding bytes that are not UTF-8 (another exporter's garbage, a
    torn write) still gives back its well-formed success lines, never an exception."""
    prom = tmp_path / "x.prom"
    good = textfile([report("a", Status.PASS)], None, now=100).encode()
    prom.write_bytes(b"# junk \xff\xfe\x80\n" + good + b"\xc3(\n")
    assert read_previous_success(str(prom)) == {"a": 100.0}


def test_previous_file_is_read_only_up_to_16_mib(tmp_path):
    """A huge previous file is read in its first 16 MiB only (bounded memory): a success
    line past that limit is not carried over."""
    prom = tmp_path / "x.prom"
    head = b'gpudoctor_last_success_timestamp_seconds{target="a"} 100\n'
    tail = b'gpudoctor_last_success_timestamp_seconds{target="b"} 200\n'
    prom.write_bytes(head + b"#" * (16 * 1024 * 1024) + b"\n" + tail)
    assert read_previous_success(str(prom)) == {"a": 100.0}


def test_run_time_defaults_to_the_clock():
    """Without an explicit time, the run (and a success) is stamped with the current unix
    time, in whole seconds."""
    before = int(time.time())
    text = textfile([report("a", Status.PASS)], None)
    after = int(time.time())
    stamp = metric(text, "gpudoctor_last_run_timestamp_seconds", "a")
    assert stamp is not None and before <= stamp <= after
    assert metric(text, "gpudoctor_last_success_timestamp_seconds", "a") == stamp
