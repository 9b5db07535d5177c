"""`journalctl -k -b` that answers "-- No entries --" (no journal of this boot: a volatile
journal lost, Storage=none, a fresh container host) has not read the kernel log: host.xid
goes on to `/dev/kmsg`, and an Xid there is reported, never a PASS over an unread log.

The real host.xid check running real executables on this machine, with files read under
an empty host root (tests/fakes/rooted_host.py: this test machine is itself a container,
which host.xid rightly skips). `journalctl` and `dd` are stand-ins on PATH (this
machine's kernel log can hold no NVIDIA Xid): the one prints what journalctl prints
without a journal, the other the /dev/kmsg records of a recorded real dmesg capture
(tests/data/recorded/kernel_log/SOURCES.md) and exits 1, as dd does at EAGAIN."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.context import CheckOptions
from gpudoctor.model import Status
from gpudoctor.runner import run_checks
from tests.fakes.kernel_records import kmsg
from tests.fakes.rooted_host import RootedHost

DATA = Path(__file__).parent.parent / "data" / "recorded" / "kernel_log"
DMESG = DATA / "nvswitch-host_dmesg-xid79-unknown-pid.txt"


@pytest.fixture
def standins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    journalctl = bin_dir / "journalctl"
    journalctl.write_text('#!/bin/sh\necho "-- No entries --"\nexit 0\n')
    (tmp_path / "kmsg").write_text(kmsg(DMESG.read_text()))
    dd = bin_dir / "dd"
    dd.write_text(f'#!/bin/sh\ncat "{tmp_path / "kmsg"}"\nexit 1\n')
    for tool in (journalctl, dd):
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return bin_dir


def test_no_entries_from_journalctl_falls_back_to_kmsg_and_finds_the_xid(
    standins: Path, tmp_path: Path
) -> None:
    (tmp_path / "host").mkdir()
    report = run_checks(RootedHost(str(tmp_path / "host")), CheckOptions(only=("host.xid",)))
    findings = [f for f in report.findings if f.check_id == "host.xid"]
    assert [(f.subject, f.status) for f in findings] == [("Xid 79 on 0000:91:00", Status.FAIL)]
    assert "source: /dev/kmsg" in findings[0].evidence
