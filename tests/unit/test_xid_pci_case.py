"""The Xid parser's PCI addresses are lower case whatever the log's hex case (issue 45.5).

Nothing pinned the ``.lower()`` of ``facts/xid.py``: without it, a log with upper-case hex
(``0000:3B:00``) made an Xid 79 and its "fallen off the bus" line two incidents, and the
Xid dropped out of ``gpudoctor_xid_events`` (whose subject pattern reads lower case), so an
alert on it stayed silent. Each test runs on every log format the parser reads: journalctl
``-o short``, ``short-monotonic`` and ``short-iso``, dmesg with its ``[stamp]``, dmesg -T's
date and a syslog ``<level>``; and on each fallen-off-the-bus form the driver prints."""

from __future__ import annotations

import json

import pytest

from gpudoctor.context import CheckOptions
from gpudoctor.facts.xid import KERNEL_LOG_READERS, SUBJECT, parse_kernel_log, summarize
from gpudoctor.output.prometheus import textfile
from gpudoctor.runner import run_checks
from tests.unit.scenarios import h200_host

HEADS = {
    "journalctl short": "Jan 16 14:04:39 pve1 kernel: ",
    "journalctl short-monotonic": "[44643.002804] pve1 kernel: ",
    "journalctl short-iso": "2026-12-07T05:00:00+0000 pve1 kernel: ",
    "dmesg": "[44643.002804] ",
    "dmesg -T": "[Mon Dec  7 05:00:00 2026] ",
    "syslog level": "<4>[44643.002804] ",
}
XID = "NVRM: Xid (PCI:{pci}): 79, pid=1173, name=python3, GPU has fallen off the bus."
FALLEN = {
    "one line": ["NVRM: GPU at PCI:{pci}: GPU has fallen off the bus."],
    "old one line": ["NVRM: GPU at {pci}.0 has fallen off the bus."],
    "two lines": ["NVRM: The NVIDIA GPU {pci}.0", "NVRM: (PCI ID: 10de:2335) installed in this system has fallen off the bus."],
}  # fmt: skip


def _log(head: str, xid_pci: str, fallen: list[str], fallen_pci: str) -> str:
    lines = [XID.format(pci=xid_pci), *(f.format(pci=fallen_pci) for f in fallen)]
    return "".join(head + line + "\n" for line in lines)


@pytest.mark.parametrize("fallen", FALLEN.values(), ids=list(FALLEN))
@pytest.mark.parametrize("head", HEADS.values(), ids=list(HEADS))
@pytest.mark.parametrize(
    ("xid_pci", "fallen_pci"),
    [("0000:3B:00", "0000:3B:00"), ("0000:3b:00", "0000:3B:00"), ("0000:3B:00", "0000:3b:00")],
)
def test_an_xid_79_and_its_fallen_line_in_upper_case_hex_are_one_incident(
    head: str, fallen: list[str], xid_pci: str, fallen_pci: str
) -> None:
    events = parse_kernel_log(_log(head, xid_pci, fallen, fallen_pci))
    assert [(e.code, e.pci) for e in events] == [(79, "0000:3b:00")]
    [summary] = summarize(events)
    assert SUBJECT.match(summary.subject)


@pytest.mark.parametrize("fallen", FALLEN.values(), ids=list(FALLEN))
@pytest.mark.parametrize("head", HEADS.values(), ids=list(HEADS))
def test_a_fallen_line_alone_in_upper_case_hex_is_named_in_lower_case(
    head: str, fallen: list[str]
) -> None:
    text = "".join(head + f.format(pci="0000:AF:00") + "\n" for f in fallen)
    assert [(e.code, e.pci) for e in parse_kernel_log(text)] == [(79, "0000:af:00")]


def test_an_upper_case_xid_is_a_sample_of_gpudoctor_xid_events() -> None:
    """Through the real host.xid check (its journal read as JSON records) and the textfile:
    one sample, lower-case pci."""
    host = h200_host()
    messages = [XID.format(pci="0000:3B:00"), FALLEN["one line"][0].format(pci="0000:3B:00")]
    text = "".join(json.dumps({"MESSAGE": m, "_SOURCE_MONOTONIC_TIMESTAMP": str(44643002804 + i)})
                   + "\n" for i, m in enumerate(messages))  # fmt: skip
    host.commands[" ".join(KERNEL_LOG_READERS[0][1])] = (0, text)  # journalctl -k -b -o json
    report = run_checks(host, CheckOptions(only=("host.xid",)), target_name="pve1")
    samples = [line for line in textfile([report], None, now=1000).splitlines()
               if line.startswith("gpudoctor_xid_events{")]  # fmt: skip
    assert samples == [
        'gpudoctor_xid_events{pci="0000:3b:00",code="79",kind="gpu",fatal="1",target="pve1"} 1'
    ]
