"""What `host.xid` tells the user about each Xid event: every field of every event of the
recorded real kernel logs (tests/data/recorded/kernel_log/SOURCES.md), which
fallen-off-the-bus messages are one event with an Xid 79 and which are events of their own,
and how the kernel log is read (journalctl, else dmesg) and why it could not be.

The kernel-log readers run for real: `journalctl` and `dmesg` are stand-in scripts on PATH
(this machine's kernel log can hold no NVIDIA Xid) run by the real LocalHost."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.facts.xid import KernelLog, parse_kernel_log, read_kernel_log
from gpudoctor.hosts.base import CommandResult, HostError
from gpudoctor.hosts.local import LocalHost

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
    """No journal of this boot and dmesg refused (kernel.dmesg_restrict in a CT): the user
    reads each reader's own last words, and each command ran under 20 s."""
    path_bin("journalctl", 'echo "-- No entries --"\n')
    path_bin(
        "dmesg", 'echo "dmesg: read kernel buffer failed: Operation not permitted" >&2\nexit 1\n'
    )
    host = TimeoutsSeen()
    log = read_kernel_log(host)
    assert log == KernelLog(
        "",
        "",
        "journalctl -k -b: -- No entries --; dmesg: dmesg: read kernel buffer failed: Operation not permitted",
    )
    assert host.timeouts == [20.0, 20.0]


def test_a_reader_silent_and_failing_gives_its_exit_status_and_a_long_error_is_cut(
    path_bin,
) -> None:
    """journalctl exits 1 saying nothing; dmesg's error is one long line: the report shows
    `exit 1` and the last line of dmesg's words cut at 200 characters."""
    path_bin("journalctl", "exit 1\n")
    path_bin("dmesg", f'echo "first line" >&2\necho "{"e" * 300}" >&2\nexit 1\n')
    log = read_kernel_log(LocalHost())
    assert log.source == "" and log.text == ""
    assert log.error == f"journalctl -k -b: exit 1; dmesg: {'e' * 200}"


def test_a_marker_quoted_past_the_head_does_not_hide_the_log(path_bin) -> None:
    """Only journalctl's own `-- No entries --` answer (at the head of its output) means no
    journal; a log whose first 200 characters do not hold it is the kernel log."""
    head = "x" * 185  # the marker ends at character 201
    path_bin("journalctl", f'echo "{head}-- No entries --"\necho "{NVSWITCH}"\n')
    path_bin("dmesg", "exit 1\n")
    log = read_kernel_log(LocalHost())
    assert log.source == "journalctl -k -b"
    assert [e.code for e in parse_kernel_log(log.text)] == [79]


class Unreachable(LocalHost):
    """Stands for an SSH host whose connection dropped: every command raises HostError
    (what SSHHost raises when the transport is gone)."""

    def run(self, argv, timeout=30.0, input=None) -> CommandResult:
        raise HostError("ssh: connection to pve1 lost")


def test_an_unreachable_host_is_an_error_not_an_empty_log() -> None:
    assert read_kernel_log(Unreachable()) == KernelLog("", "", "ssh: connection to pve1 lost")
