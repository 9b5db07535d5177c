"""``gpudoctor_xid_events`` in the Prometheus textfile: one sample per GPU and Xid code that
host.xid found in the kernel log, its labels (``pci``, ``code``, ``kind``, ``fatal``, the
target's) and the event count, exactly; nothing for findings that are not Xid events.

The findings come from the real host.xid check run on recorded kernel logs
(tests/data/recorded/kernel_log/SOURCES.md) through a RecordedHost.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gpudoctor.context import CheckOptions
from gpudoctor.model import CheckResult, Finding, Report, Status
from gpudoctor.output.prometheus import textfile
from gpudoctor.runner import run_checks
from tests.fakes.kernel_records import JOURNAL, journal_json
from tests.unit.scenarios import h200_host

LOGS = Path(__file__).parent.parent / "data" / "recorded" / "kernel_log"
HEADER = (
    "# HELP gpudoctor_xid_events NVIDIA Xid events in the kernel log since boot, per GPU and code.",
    "# TYPE gpudoctor_xid_events gauge",
)


def recorded(*names: str) -> str:
    """Return the recorded kernel logs ``names``, one after the other."""
    return "".join((LOGS / name).read_text() for name in names)


def xid_report(target: str, text: str) -> Report:
    """Return the report of host.xid and driver.loaded on an H200 whose kernel log is
    ``text``."""
    host = h200_host()
    host.commands[JOURNAL] = (0, journal_json(text))
    return run_checks(host, CheckOptions(only=("host.xid", "driver.loaded")), target_name=target)


def xid_lines(text: str) -> list[str]:
    """Return the lines of the textfile that name gpudoctor_xid_events, in order."""
    return [line for line in text.splitlines() if "gpudoctor_xid_events" in line]


def test_each_gpu_and_code_is_one_sample_with_its_kind_fatality_and_count() -> None:
    """A fallen-off-the-bus GPU (Xid 79, FAIL: fatal="1"), a code gpudoctor's table does not
    know (Xid 3: kind "unknown"), and application faults (Xid 69 three times, Xid 31 once:
    WARN, fatal="0") on two targets, one of them a fleet CT with node and ct labels."""
    logs = ("pastebin-xJaypMZt_journalctl-old-format.txt",
            "pastebin-fTNHmgzB_journalctl-xid69-xid31.txt")  # fmt: skip
    one = xid_report("pve1", recorded(*logs))
    ct = dataclasses.replace(xid_report("root@pve2:ct/200", recorded(logs[1])),
                             labels=(("node", "pve2"), ("ct", "200")))  # fmt: skip
    assert one.findings[0].check_id == "driver.loaded"  # a finding before host.xid's
    text = textfile([one, ct], None, now=1000)
    assert xid_lines(text) == [
        *HEADER,
        'gpudoctor_xid_events{pci="0000:01:00",code="79",kind="gpu",fatal="1",target="pve1"} 1',
        'gpudoctor_xid_events{pci="0000:01:00",code="3",kind="unknown",fatal="0",target="pve1"} 1',
        'gpudoctor_xid_events{pci="0000:08:00",code="69",kind="app",fatal="0",target="pve1"} 3',
        'gpudoctor_xid_events{pci="0000:08:00",code="31",kind="app",fatal="0",target="pve1"} 1',
        'gpudoctor_xid_events{pci="0000:08:00",code="69",kind="app",fatal="0",'
        'target="root@pve2:ct/200",node="pve2",ct="200"} 3',
        'gpudoctor_xid_events{pci="0000:08:00",code="31",kind="app",fatal="0",'
        'target="root@pve2:ct/200",node="pve2",ct="200"} 1',
    ]
    # the block sits between the check statuses and the check durations
    lines = text.splitlines()
    start = lines.index(HEADER[0])
    assert lines[start - 1].startswith("gpudoctor_check_status{")
    assert lines[start + len(xid_lines(text))].startswith("# HELP gpudoctor_check_duration")


def test_a_clean_kernel_log_writes_no_xid_series_at_all() -> None:
    """host.xid's PASS (subject "kernel log") is no event: no sample, no HELP/TYPE either."""
    report = xid_report("pve1", "[    1.000000] Linux version 6.8.12-4-pve\n")
    assert [f.status for f in report.findings if f.check_id == "host.xid"] == [Status.PASS]
    assert xid_lines(textfile([report], None, now=1000)) == []


def single(check_id: str, subject: str, evidence: tuple[str, ...], status: Status) -> Report:
    """Return a report of one check with one finding."""
    made = Finding(check_id, status, subject, "m", evidence=evidence)
    return Report("pve1", (CheckResult(check_id, (made,)),))


def test_only_host_xid_findings_with_an_event_count_are_series() -> None:
    """Another check's finding that looks like an Xid (subject and count), or a host.xid
    finding without the ``events since boot: N`` evidence, is not an Xid sample; a real one
    after them in the same report still is."""
    count = ("first: NVRM: Xid ...", "events since boot: 2")
    lookalike = single("cuda.init", "Xid 79 on 0000:3b:00", count, Status.FAIL)
    uncounted = single("host.xid", "Xid 48 on 0000:3b:00", ("source: dmesg",), Status.FAIL)
    assert xid_lines(textfile([lookalike, uncounted], None, now=1)) == []
    real = single("host.xid", "Xid 13 on 0000:3b:00", count, Status.WARN)
    merged = Report("pve1", (*lookalike.results, *uncounted.results, *real.results))
    assert xid_lines(textfile([merged], None, now=1)) == [
        *HEADER,
        'gpudoctor_xid_events{pci="0000:3b:00",code="13",kind="app",fatal="0",target="pve1"} 2',
    ]
