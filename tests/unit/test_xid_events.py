"""What `host.xid` tells the user about each Xid event: every field of every event of the
recorded real kernel logs (tests/data/recorded/kernel_log/SOURCES.md), which
fallen-off-the-bus messages are one event with an Xid 79 and which are events of their own,
and how the kernel log is read (journalctl, else dmesg) and why it could not be.

The kernel-log readers run for real: `journalctl` and `dmesg` are stand-in scripts on PATH
(this machine's kernel log can hold no NVIDIA Xid) run by the real LocalHost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpudoctor.facts.xid import (
    KernelLog,
    KernelRecord,
    parse_kernel_log,
    read_kernel_log,
    text_records,
    xid_events,
)
from gpudoctor.hosts.base import CommandResult, HostError
from gpudoctor.hosts.local import LocalHost
from tests.fakes.kernel_records import kmsg_escape

DATA = Path(__file__).parent.parent / "data" / "recorded" / "kernel_log"
FALLEN = "GPU has fallen off the bus"

K80_05 = "Jan 16 14:04:39 pyrite kernel: [44643.002804] NVRM: Xid (PCI:0000:05:00): 79, pid=1173, GPU has fallen off the bus."
K80_06 = "Jan 16 14:04:39 pyrite kernel: [44643.002866] NVRM: Xid (PCI:0000:06:00): 79, pid=1173, GPU has fallen off the bus."
NVSWITCH = "[6781741.548779] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
OLD_FALLEN = "Jan 18 11:38:05 localhost kernel: [ 269.516977] NVRM: GPU at 0000:01:00.0 has fallen off the bus."
OLD_XID3 = "Jan 18 11:38:05 localhost kernel: [ 269.517039] NVRM: Xid (0000:01:00): 3, C 00000005 SC 00000007 M 00001ffc Data ffffffff"
ROW_REMAP = "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate."
XID31 = ("May 13 17:19:01 hyperion kernel: NVRM: Xid (PCI:0000:08:00): 31, Ch 0000003b, intr 10000000."
         " MMU Fault: ENGINE GRAPHICS HUBCLIENT_SCC faulted @ 0x0_04687000. Fault is of type FAULT_PDE ACCESS_TYPE_READ")  # fmt: skip


def fields(text: str) -> list[tuple]:
    return [
        (e.code, e.pci, e.detail, e.pid, e.process, e.uptime_s, e.line)
        for e in parse_kernel_log(text)
    ]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("k80-470_journalctl-xid79-two-gpus.txt", [
            (79, "0000:05:00", "pid=1173, GPU has fallen off the bus.", "1173", "", 44643.002804, K80_05),
            (79, "0000:06:00", "pid=1173, GPU has fallen off the bus.", "1173", "", 44643.002866, K80_06),
        ]),
        ("nvswitch-host_dmesg-xid79-unknown-pid.txt", [
            (79, "0000:91:00", "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
             "unknown", "unknown", 6781741.548779, NVSWITCH),
        ]),
        ("nvsentinel-155_570.158.01_dmesg-fallen-three-lines.txt", [
            (79, "0000:b3:00", FALLEN, "", "", 1843.308145, "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0"),
        ]),
        ("proxmox-vm-passthrough_dmesg-fallen-two-lines.txt", [
            (79, "0000:01:00", FALLEN, "", "", None,
             "NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:2d04) installed in this system has"),
        ]),
        ("pastebin-xJaypMZt_journalctl-old-format.txt", [
            (79, "0000:01:00", FALLEN, "", "", 269.516977, OLD_FALLEN),
            (3, "0000:01:00", "C 00000005 SC 00000007 M 00001ffc Data ffffffff", "", "", 269.517039, OLD_XID3),
        ]),
        ("ml-engineering_xid63-row-remap.txt", [
            (63, "0000:10:1c", "pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.",
             "1896", "", None, ROW_REMAP),
        ]),
    ],
)  # fmt: skip
def test_every_field_of_each_recorded_event(name: str, expected: list[tuple]) -> None:
    """The code, GPU, the driver's words, pid, process, uptime and the line itself: what
    the finding's evidence shows the user for each event."""
    assert fields((DATA / name).read_text()) == expected


def test_the_process_the_driver_names() -> None:
    """`name=Xorg`: the process is shown as the driver names it (no character lost)."""
    line = "[  812.112233] NVRM: Xid (PCI:0000:01:00): 13, pid=1234, name=Xorg, Graphics SM Warp Exception on (GPC 0, TPC 0)"
    assert fields(line) == [
        (13, "0000:01:00", "pid=1234, name=Xorg, Graphics SM Warp Exception on (GPC 0, TPC 0)",
         "1234", "Xorg", 812.112233, line),
    ]  # fmt: skip


def test_events_after_other_drivers_lines_are_found() -> None:
    """A whole boot's log: after the NVSwitch's SXid lines (not the GPU driver's) come more
    incidents; every one of them is reported, in log order."""
    text = "".join(
        (DATA / n).read_text()
        for n in ("nvswitch-host_dmesg-xid79-unknown-pid.txt",
                  "proxmox-vm-passthrough_dmesg-fallen-two-lines.txt",
                  "ml-engineering_xid63-row-remap.txt")
    )  # fmt: skip
    assert [(e.code, e.pci) for e in parse_kernel_log(text)] == [
        (79, "0000:91:00"), (79, "0000:01:00"), (63, "0000:10:1c"),
    ]  # fmt: skip


XID79_A = "NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, name=python3, GPU has fallen off the bus."
OTHER = "NVRM: GPU 0000:3b:00.0: GPU serial number is 1653723052734."


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        # the driver's fallen line three lines after the Xid 79 of the same GPU: that event
        ([XID79_A, OTHER, OTHER, "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."],
         [(79, "0000:3b:00", 0)]),
        # four lines after: a second fall of that GPU (its own event)
        ([XID79_A, OTHER, OTHER, OTHER, "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."],
         [(79, "0000:3b:00", 0), (79, "0000:3b:00", 4)]),
        # the line before the Xid 79, three lines up: the same event
        (["NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.", OTHER, OTHER, XID79_A],
         [(79, "0000:3b:00", 3)]),
        # another GPU fell right beside the Xid 79: both GPUs are reported
        ([XID79_A, "NVRM: GPU 0000:5e:00.0: GPU has fallen off the bus."],
         [(79, "0000:3b:00", 0), (79, "0000:5e:00", 1)]),
        # "The NVIDIA GPU ... is not supported": no fall, even with one three lines below
        (["NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:1b80) installed in this system is",
          "NVRM: not supported by the NVIDIA 390.157 driver release.", OTHER,
          "NVRM: GPU 0000:02:00.0: GPU has fallen off the bus."],
         [(79, "0000:02:00", 3)]),
    ],
)  # fmt: skip
def test_which_fallen_messages_are_their_own_event(
    lines: list[str], expected: list[tuple[str, int]]
) -> None:
    """A fallen-off-the-bus message within three lines of an Xid 79 of the same GPU is that
    Xid (one event, one count); farther away, of another GPU, or no fall at all: not."""
    events = parse_kernel_log("\n".join(lines))
    assert [(e.code, e.pci, lines.index(e.line)) for e in events] == expected


# -- reading the kernel log ------------------------------------------------------------------


@pytest.fixture
def path_bin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))

    def tool(name: str, script: str) -> None:
        (bin_dir / name).write_text("#!/bin/sh\n" + script)
        (bin_dir / name).chmod(0o755)

    tool.dir = tmp_path  # type: ignore[attr-defined]
    return tool


class TimeoutsSeen(LocalHost):
    """This machine, noting the time limit each command ran under."""

    def __init__(self) -> None:
        super().__init__()
        self.timeouts: list[float] = []

    def run(self, argv, timeout=30.0, input=None) -> CommandResult:
        self.timeouts.append(timeout)
        return super().run(argv, timeout, input)


def test_both_readers_failing_says_why_each_failed(path_bin) -> None:
    """No journal of this boot and /dev/kmsg refused (kernel.dmesg_restrict in a CT): the
    user reads each reader's own last words, and each command ran under 20 s."""
    path_bin("journalctl", 'echo "-- No entries --"\n')
    path_bin("dd", "echo \"dd: failed to open '/dev/kmsg': Operation not permitted\" >&2\nexit 1\n")
    host = TimeoutsSeen()
    log = read_kernel_log(host)
    assert log == KernelLog(
        "",
        (),
        "journalctl -k -b -o json: -- No entries --; "
        "/dev/kmsg: dd: failed to open '/dev/kmsg': Operation not permitted",
    )
    assert host.timeouts == [20.0, 20.0]


def test_a_reader_silent_and_failing_gives_its_exit_status_and_a_long_error_is_cut(
    path_bin,
) -> None:
    """journalctl exits 1 saying nothing; dd's error is one long line: the report shows
    `exit 1` and the last line of dd's words cut at 200 characters; a reader that exits 0
    with nothing is `no records`."""
    path_bin("journalctl", "exit 1\n")
    path_bin("dd", f'echo "first line" >&2\necho "{"e" * 300}" >&2\nexit 1\n')
    log = read_kernel_log(LocalHost())
    assert log.source == "" and log.records == ()
    assert log.error == f"journalctl -k -b -o json: exit 1; /dev/kmsg: {'e' * 200}"
    path_bin("journalctl", "exit 0\n")
    assert read_kernel_log(LocalHost()).error.startswith("journalctl -k -b -o json: no records;")


def test_the_journal_is_read_as_records(path_bin) -> None:
    """journalctl's JSON: a record per line, its MESSAGE a string or (not clean UTF-8) a
    list of bytes, the kernel's stamp in microseconds; a line that is not an object of
    that shape is no record. The journal is asked for those two fields only."""
    real = "NVRM: Xid (PCI:0000:3B:00): 79, pid=7, GPU has fallen off the bus."
    lines = [
        json.dumps({"MESSAGE": real, "_SOURCE_MONOTONIC_TIMESTAMP": "44643002804"}),
        json.dumps({"MESSAGE": list(b"caf\xc3\xa9 \xff")}),
        json.dumps({"MESSAGE": [300]}), json.dumps({"MESSAGE": [-1]}), json.dumps({"MESSAGE": 5}),
        json.dumps({"MESSAGE": [88, 256]}),  # 256 is no byte: no record, and no crash
        json.dumps([1]), json.dumps({"MESSAGE": [0, 255]}),
        "not json", json.dumps({"MESSAGE": "x", "_SOURCE_MONOTONIC_TIMESTAMP": "-1"}),
    ]  # fmt: skip
    (tmp := path_bin.dir / "journal.json").write_text("\n".join(lines) + "\n")
    args = "-k -b -o json --output-fields=MESSAGE,_SOURCE_MONOTONIC_TIMESTAMP --no-pager -q"
    path_bin("journalctl", f'[ "$*" = "{args}" ] && /bin/cat "{tmp}"\n')
    log = read_kernel_log(LocalHost())
    assert log.source == "journalctl -k -b -o json"
    assert log.records == (
        KernelRecord(real, 44643.002804, f"[44643.002804] {real}"),
        KernelRecord("caf\u00e9 \ufffd", None, "caf\u00e9 \ufffd"),
        KernelRecord("\x00\ufffd", None, "\x00\ufffd"),
        KernelRecord("x", None, "x"),
    )
    assert [(e.code, e.pci, e.uptime_s) for e in xid_events(list(log.records))] == [
        (79, "0000:3b:00", 44643.002804)
    ]


FORGED = "NVRM: Xid (PCI:0000:3b:00): 79, pid=77, name=x, GPU has fallen off the bus."
SEGFAULT = (
    "x\nNVRM: Xid (PC[8473]: segfault at 0 ip 000000000040007a sp 00007fff89813ae0 error 4 "
    f"in x\n{FORGED}[7a,400000+1000] likely on CPU 0 (core 0, socket 0)"
)


def test_kmsg_is_read_as_records_and_a_newline_stays_inside_its_record(path_bin) -> None:
    """/dev/kmsg as the kernel gave it for nobody's crash of a program named
    ``x<newline>NVRM: Xid ... 79, ...`` (recorded on this machine's kernel, 6.18): the
    name's newline is ``\\x0a`` inside the segfault record, so the record holds a newline
    and is no Xid; the driver's own record next to it is one. Dictionary lines and other
    text are no records; the kernel's escapes (``\\x5c``, UTF-8 bytes) are decoded."""
    kmsg_text = (
        f"6,339,133186847,-;{kmsg_escape(SEGFAULT)}\n SUBSYSTEM=x\n"
        f"4,340,133187056,c;{FORGED}\n"
        "garbage line\n"
        "6,341,5,-;a\\x5cb caf\\xc3\\xa9\n"
        "6,342,6,-;r\\x0dn \u20ac\n"  # a carriage return; a character no byte stands for
        "6,343,7,-;bad \\xff end\n"  # a byte that is not UTF-8: replaced, never a crash
    )
    assert "\\x0aNVRM: Xid (PCI:0000:3b:00): 79" in kmsg_text  # as the kernel shows it
    (tmp := path_bin.dir / "kmsg").write_text(kmsg_text)
    path_bin("journalctl", "exit 0\n")
    args = "if=/dev/kmsg iflag=nonblock bs=65536 status=none"
    path_bin("dd", f'[ "$*" = "{args}" ] && /bin/cat "{tmp}"\nexit 1\n')
    log = read_kernel_log(LocalHost())
    assert log.source == "/dev/kmsg"
    assert log.records == (
        KernelRecord(SEGFAULT, 133.186847, "[  133.186847] " + SEGFAULT.replace("\n", "\\n")),
        KernelRecord(FORGED, 133.187056, f"[  133.187056] {FORGED}"),
        KernelRecord("a\\b caf\u00e9", 5e-06, "[    0.000005] a\\b caf\u00e9"),
        KernelRecord("r\rn ?", 6e-06, "[    0.000006] r\\rn ?"),
        KernelRecord("bad \ufffd end", 7e-06, "[    0.000007] bad \ufffd end"),
    )
    assert [(e.code, e.line) for e in xid_events(list(log.records))] == [
        (79, f"[  133.187056] {FORGED}")
    ]


THREE = (
    "NVRM: The NVIDIA GPU 0000:B3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\n"
    "NVRM: fallen off the bus and is not responding to commands."
)


@pytest.mark.parametrize(
    ("message", "events"),
    [
        (FORGED, [(79, "0000:3b:00")]),
        (THREE, [(79, "0000:b3:00")]),  # the driver's own record of three lines (nv.c)
        ("NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:2d04) installed in this system has\n"
         "NVRM: fallen off the bus and is not responding to commands.", [(79, "0000:01:00")]),
        (FORGED + "\nmore", []),
        (FORGED + "\rmore", []),
        ("x\n" + FORGED, []),
        (THREE.replace("\nNVRM: fallen", "\nfallen"), []),  # a line not the driver's
        (THREE.replace("\n", "\r", 1), []),
        (THREE.replace(".0\n", ".0 \n"), []),  # the first line is not exactly the driver's
        # nobody's program "NVRM: a<newline>NVRM: Xid ...": every line of its segfault
        # record begins with NVRM, its first line is the program's name
        (f"NVRM: a\nNVRM: X[8473]: segfault at 0 ip 0 sp 0 error 4 in NVRM: a\n{FORGED}[7a]", []),
        (f"NVRM: The NVIDIA GP\nNVRM: X[1]: segfault at 0 in NVRM: The NVIDIA GPU\n{FORGED}", []),
    ],
)  # fmt: skip
def test_which_records_are_the_drivers(message: str, events: list[tuple[int, str]]) -> None:
    """A record counts when it is one line beginning with ``NVRM: ``, or the driver's own
    record of several lines: each line begins with ``NVRM: ``, the first is exactly
    ``NVRM: The NVIDIA GPU BUS[ (PCI ID: ...) installed in this system has|is]``. A record
    another program's text made (a newline, a carriage return) is not the driver's."""
    assert [(e.code, e.pci) for e in xid_events([KernelRecord(message)])] == events


def test_a_text_logs_indented_line_continues_the_record_above() -> None:
    """journalctl's short output and dmesg indent a record's second line: in a recorded
    text log that line is joined to its record (which then holds a newline), never a
    record of its own, with or without the log's header."""
    for head in ("[  133.186847] ", "Dec 07 05:01:02 pve1 kernel: ", ""):
        text = f"{head}x\n               {FORGED}[7a,400000+1000] likely on CPU 0\n"
        assert text_records(text) == [
            KernelRecord(f"x\n{FORGED}[7a,400000+1000] likely on CPU 0",
                         133.186847 if head.startswith("[") else None, f"{head}x".strip())
        ]  # fmt: skip
        assert parse_kernel_log(text) == []
    # an indented first line (a log cut mid-record) is kept as it is: no record of the driver
    assert text_records(f"  {FORGED}") == [KernelRecord(f"  {FORGED}", None, FORGED)]
    # one blank is an indent as well: it continues a record, and a first line keeps it
    assert text_records("x\n y") == [KernelRecord("x\ny", None, "x")]
    assert text_records(" y") == [KernelRecord(" y", None, "y")]
    assert parse_kernel_log(f"  {FORGED}\n{FORGED}") == parse_kernel_log(FORGED)


class Unreachable(LocalHost):
    """Stands for an SSH host whose connection dropped: every command raises HostError
    (what SSHHost raises when the transport is gone)."""

    def run(self, argv, timeout=30.0, input=None) -> CommandResult:
        raise HostError("ssh: connection to pve1 lost")


def test_an_unreachable_host_is_an_error_not_an_empty_log() -> None:
    assert read_kernel_log(Unreachable()) == KernelLog("", (), "ssh: connection to pve1 lost")
