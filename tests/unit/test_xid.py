"""Xid parsing on recorded real kernel-log lines (tests/data/recorded/kernel_log/SOURCES.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.facts.xid import XID_TABLE, parse_kernel_log, summarize

DATA = Path(__file__).parent.parent / "data" / "recorded" / "kernel_log"


def events_of(name: str) -> list[tuple[int, str]]:
    return [(e.code, e.pci) for e in parse_kernel_log((DATA / name).read_text())]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # Xid 79 + the "GPU 0000:05:00.0: GPU has fallen off the bus." line: one event per GPU
        ("k80-470_journalctl-xid79-two-gpus.txt", [(79, "0000:05:00"), (79, "0000:06:00")]),
        ("nvswitch-host_dmesg-xid79-unknown-pid.txt", [(79, "0000:91:00")]),  # SXid ignored
        ("nvsentinel-155_570.158.01_dmesg-fallen-three-lines.txt", [(79, "0000:b3:00")]),
        ("proxmox-vm-passthrough_dmesg-fallen-two-lines.txt", [(79, "0000:01:00")]),
        (
            "pastebin-fTNHmgzB_journalctl-xid69-xid31.txt",
            [(69, "0000:08:00")] * 3 + [(31, "0000:08:00")],
        ),
        ("pastebin-xJaypMZt_journalctl-old-format.txt", [(79, "0000:01:00"), (3, "0000:01:00")]),
        ("ml-engineering_xid63-row-remap.txt", [(63, "0000:10:1c")]),
        ("fleet-notes_xid79-then-154.txt", [(79, "0000:01:00"), (154, "0000:01:00")]),
    ],
)
def test_recorded_kernel_logs(name: str, expected: list[tuple[int, str]]) -> None:
    assert events_of(name) == expected


def test_fields_pid_name_stamp() -> None:
    text = (DATA / "nvswitch-host_dmesg-xid79-unknown-pid.txt").read_text()
    event = parse_kernel_log(text)[0]
    assert (event.pid, event.process) == ("unknown", "unknown")
    assert event.uptime_s == pytest.approx(6781741.548779)
    k80 = parse_kernel_log((DATA / "k80-470_journalctl-xid79-two-gpus.txt").read_text())
    assert k80[0].pid == "1173" and k80[0].uptime_s == pytest.approx(44643.002804)
    assert k80[0].info.kind == "gpu" and k80[0].info.breaks_cuda


def test_summary_counts_and_subject() -> None:
    text = (DATA / "pastebin-fTNHmgzB_journalctl-xid69-xid31.txt").read_text()
    groups = summarize(parse_kernel_log(text))
    assert [(g.code, g.count) for g in groups] == [(69, 3), (31, 1)]
    assert groups[0].subject == "Xid 69 on 0000:08:00"


def test_unknown_code_and_table_rows() -> None:
    (event,) = parse_kernel_log("NVRM: Xid (PCI:0000:3b:00): 999, something new")
    assert event.info.kind == "unknown"
    for code in (13, 31, 43, 45, 48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 154):
        assert code in XID_TABLE, code
    assert not XID_TABLE[13].breaks_cuda and XID_TABLE[95].breaks_cuda


def test_no_nvrm_no_events() -> None:
    assert parse_kernel_log("[ 1.0] usb 1-1: new device\n[ 2.0] EXT4-fs mounted\n") == []


@pytest.mark.parametrize(
    "header",
    ["", "[ 1225.232297] ", "Jan 16 14:04:39 pyrite kernel: ", "[ 1225.232297] pyrite kernel: ",
     "2026-12-04T14:04:39+0000 pyrite kernel: ", "Jan 16 14:04:39 pyrite kernel: [44643.002792] "],
)  # fmt: skip
def test_only_the_drivers_own_lines_count(header: str) -> None:
    """Issue 33.4: a segfault line quoting an Xid (a program file named like one; the comm
    is its first 15 characters) is no event, in every log format read; the driver's is."""
    forged = ("NVRM: Xid (PCI:[17725]: segfault at 0 ip 000000000040007a sp 00007ffe19edcd40"
              " error 4 in NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off"
              " the bus.[7a,400000+1000] likely on CPU 0 (core 0, socket 0)")  # fmt: skip
    quoted = "a.out[9]: segfault at 0 ip 0 sp 0 error 4 in NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus"
    assert parse_kernel_log(f"{header}{forged}\n{header}{quoted}\n") == []
    real = f"{header}NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
    assert [(e.code, e.pci) for e in parse_kernel_log(real)] == [(79, "0000:3b:00")]
