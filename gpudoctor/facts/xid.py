"""NVIDIA Xid events in the host's kernel log: parse them, and say what each code means.

The NVIDIA kernel module (NVRM) reports GPU faults as Xid events in the kernel log::

    NVRM: Xid (PCI:0000:3b:00): 79, pid=2231, name=python3, GPU has fallen off the bus.
    NVRM: Xid (0000:01:00): 13, Graphics Exception: ...          (older drivers: no "PCI:")

and a GPU that stops answering PCIe config cycles, on its own line or over three::

    NVRM: GPU at 0000:01:00.0 has fallen off the bus.
    NVRM: The NVIDIA GPU 0000:b3:00.0
    NVRM: (PCI ID: 10de:26b5) installed in this system has
    NVRM: fallen off the bus and is not responding to commands.

The meanings and actions below follow NVIDIA's Xid documentation ("Xid Errors",
https://docs.nvidia.com/deploy/xid-errors/ and its catalog for Ampere and newer,
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html: the mnemonic, the
immediate resolution bucket RESTART_APP / RESET_GPU / RESTART_VM (node) / CONTACT_SUPPORT).
``kind`` sorts them the way a CT owner needs: ``app`` (the application's own bug or input;
the GPU is fine), ``gpu`` (the GPU or its link is faulty or must be reset: no config change
in any CT helps), ``driver`` (the driver or its firmware misbehaved: reset, then upgrade).
Recorded real lines: tests/data/recorded/kernel_log/.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gpudoctor.hosts.base import Host, HostError


@dataclass(frozen=True)
class XidInfo:
    """What NVIDIA documents for one Xid code.

    Attributes:
        code: the Xid number.
        name: NVIDIA's short name for it.
        kind: ``app``, ``gpu`` or ``driver`` (see the module docstring).
        action: the immediate action, in words (NVIDIA's resolution bucket).
        breaks_cuda: True when the GPU is unusable until the action is taken (a later
            cuInit failure on that GPU is this event's consequence, not a config problem).
    """

    code: int
    name: str
    kind: str
    action: str
    breaks_cuda: bool


RESTART_APP = "restart the application (the GPU itself is fine)"
RESET_GPU = "drain the GPU's work and reset it (`nvidia-smi -r -i BUS`), or reboot the node"
REBOOT = "reboot the node (power-cycle it if the GPU is still missing); if it repeats, have the GPU serviced"
SUPPORT = "reset the GPU or reboot the node; if it repeats, contact NVIDIA support or the vendor"

XID_TABLE: dict[int, XidInfo] = {
    x.code: x
    for x in (
        XidInfo(8, "GPU stopped processing (channel idle timeout)", "app", RESTART_APP, False),
        XidInfo(13, "Graphics Engine Exception", "app", RESTART_APP, False),
        XidInfo(31, "GPU memory page fault (MMU fault)", "app", RESTART_APP, False),
        XidInfo(32, "Invalid or corrupted push buffer stream", "driver", SUPPORT, False),
        XidInfo(38, "Driver firmware error", "driver", SUPPORT, True),
        XidInfo(43, "GPU stopped processing (reset channel verification error)", "app", RESTART_APP, False),
        XidInfo(45, "Preemptive cleanup, due to previous errors", "app", RESTART_APP, False),
        XidInfo(46, "GPU stopped processing", "gpu", RESET_GPU, True),
        XidInfo(48, "Double bit ECC error (uncorrectable memory error)", "gpu", RESET_GPU, True),
        XidInfo(56, "Display engine error", "driver", SUPPORT, False),
        XidInfo(57, "Error programming video memory interface", "gpu", SUPPORT, True),
        XidInfo(61, "Internal micro-controller breakpoint/warning", "driver", RESET_GPU, True),
        XidInfo(62, "Internal micro-controller halt", "driver", RESET_GPU, True),
        XidInfo(63, "ECC page retirement or row remapping recorded", "gpu", RESET_GPU, False),
        XidInfo(64, "ECC page retirement or row remapping failure", "gpu", RESET_GPU, True),
        XidInfo(69, "Graphics Engine class error", "app", RESTART_APP, False),
        XidInfo(74, "NVLink error", "gpu", RESET_GPU, True),
        XidInfo(79, "GPU has fallen off the bus", "gpu", REBOOT, True),
        XidInfo(92, "High single-bit ECC error rate", "gpu", SUPPORT, False),
        XidInfo(94, "Contained ECC error", "gpu", RESTART_APP + "; reset the GPU when convenient", False),
        XidInfo(95, "Uncontained ECC error", "gpu", RESET_GPU, True),
        XidInfo(109, "Context switch timeout", "app", RESTART_APP, False),
        XidInfo(119, "GSP RPC timeout", "driver", RESET_GPU, True),
        XidInfo(120, "GSP error", "driver", RESET_GPU, True),
        XidInfo(121, "C2C link error", "gpu", RESET_GPU, True),
        XidInfo(136, "Link training failed", "gpu", REBOOT, True),
        XidInfo(140, "Unrecovered ECC error", "gpu", RESET_GPU, True),
        XidInfo(143, "GPU initialization failure", "gpu", REBOOT, True),
        XidInfo(154, "GPU recovery action changed (read nvidia-smi -q: Recovery Action)", "gpu", "follow the recovery action nvidia-smi -q reports (GPU reset or node reboot)", True),
    )
}  # fmt: skip

FALLEN = 79  # "fallen off the bus" lines count as Xid 79 (NVIDIA's catalog does too)

# Only a line the NVIDIA driver itself printed counts: its message begins with "NVRM: ",
# after nothing but the log's own header (journalctl's date/monotonic stamp, host and
# "kernel:"; dmesg's [stamp] or -T date; a syslog <level>) or a continuation's blanks.
# Anything else that quotes NVRM (a segfault line naming a program file called
# "NVRM: Xid (PCI:...): 79, ...", which any user or any CT can make the host's kernel
# print) is not the driver's word.
_HEADER = (
    r"(?:(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?"  # journalctl -o short
    r"|\[\s*\d+\.\d+\]"  # -o short-monotonic
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?"  # -o short-iso
    r") \S+ kernel: )?"
)
_DRIVER = re.compile(
    r"^" + _HEADER + r"(?:<\d+>)?(?:\[\s*\d+\.\d+\]|\[[A-Z][a-z]{2} [A-Za-z0-9: ]{15,25}\])?\s*"
    r"(?P<msg>NVRM: .*)$"
)
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.\d)?\):"
    r"\s*(?P<code>\d+),\s*(?P<rest>.*)$"
)
_PID = re.compile(r"\bpid=(?P<pid>'?<?\w+>?'?)(?:,\s*name=(?P<name>[^,]*))?")
_PCI = r"(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})(?:\.\d)?"
_FALLEN_ONE = re.compile(
    r"NVRM: GPU (?:at )?(?:PCI:)?" + _PCI + r":? (?:GPU )?has fallen off the bus"
)
_FALLEN_HEAD = re.compile(r"NVRM: The NVIDIA GPU " + _PCI + r"\b")
_STAMP = re.compile(r"(?:^|\s)\[\s*(?P<t>\d+\.\d+)\]\s")


@dataclass(frozen=True)
class XidEvent:
    """One Xid (or fallen-off-the-bus) event of the kernel log.

    Attributes:
        code: the Xid number (79 for "fallen off the bus").
        pci: the GPU's PCI address as the log names it, lower case (``0000:3b:00``).
        detail: the rest of the line (the driver's own words).
        pid: the process id the driver names, or "" (``pid=`` is absent in old drivers).
        process: the process name the driver names, or "".
        uptime_s: seconds since boot (``[ 123.456]``), or None when the line has no stamp.
        line: the log line as read.
    """

    code: int
    pci: str
    detail: str
    pid: str = ""
    process: str = ""
    uptime_s: float | None = None
    line: str = ""

    @property
    def info(self) -> XidInfo:
        """Return NVIDIA's documented meaning (an ``unknown`` entry for codes not listed)."""
        return XID_TABLE.get(self.code) or XidInfo(
            self.code, "not in gpudoctor's table (see NVIDIA's Xid catalog)", "unknown", SUPPORT, False
        )  # fmt: skip


def _stamp(line: str) -> float | None:
    match = _STAMP.search(line)
    return float(match["t"]) if match else None


def _driver_message(line: str) -> str | None:
    """Return the driver's message (from ``NVRM: ``) when the NVIDIA driver printed
    ``line``, else None (a line that only quotes NVRM: a forged segfault line)."""
    if "NVRM: " not in line:
        return None
    match = _DRIVER.match(line)
    return match["msg"] if match else None


def parse_kernel_log(text: str) -> list[XidEvent]:
    """Return the Xid and fallen-off-the-bus events of a kernel log (``journalctl -k -b -o
    short-monotonic`` or ``dmesg`` output), in log order. Only lines the driver printed
    count (their message begins with ``NVRM: ``); a line that merely quotes one (a
    segfault of a program named like an Xid) is not an event. A fallen-off-the-bus message
    within three lines of an Xid 79 of the same GPU is that event, not a second one."""
    found: list[tuple[int, XidEvent]] = []
    fallen: list[tuple[int, XidEvent]] = []
    lines = text.splitlines()
    driver = [_driver_message(line) for line in lines]
    for i, line in enumerate(lines):
        message = driver[i]
        if message is None:
            continue
        match = _XID.match(message)
        if match:
            rest = match["rest"].strip()
            pid = _PID.search(rest)
            found.append((i, XidEvent(
                int(match["code"]),
                match["pci"].lower(),
                rest,
                (pid["pid"] or "").strip("'<>") if pid else "",
                (pid["name"] or "").strip("<>").strip() if pid else "",
                _stamp(line),
                line.strip(),
            )))  # fmt: skip
            continue
        hit = _FALLEN_ONE.match(message)
        if hit is None:
            head = _FALLEN_HEAD.match(message)
            if head and "fallen off the bus" in " ".join(m or "" for m in driver[i : i + 3]):
                hit = head
        if hit:
            event = XidEvent(FALLEN, hit["pci"].lower(), "GPU has fallen off the bus",
                             uptime_s=_stamp(line), line=line.strip())  # fmt: skip
            fallen.append((i, event))
    xid79 = [(i, e.pci) for i, e in found if e.code == FALLEN]
    for i, event in fallen:
        if not any(pci == event.pci and abs(j - i) <= 3 for j, pci in xid79):
            found.append((i, event))
    return [e for _, e in sorted(found, key=lambda pair: pair[0])]


@dataclass(frozen=True)
class XidSummary:
    """Events of one (GPU, code) pair since boot.

    Attributes:
        pci: the GPU's PCI address (``0000:3b:00``).
        code: the Xid number.
        count: how many events.
        first: the first event; ``last``: the last one.
    """

    pci: str
    code: int
    count: int
    first: XidEvent
    last: XidEvent

    @property
    def subject(self) -> str:
        """Return the finding subject (``Xid 79 on 0000:3b:00``; the textfile reads it back
        with :data:`SUBJECT`)."""
        return f"Xid {self.code} on {self.pci}"


SUBJECT = re.compile(r"^Xid (?P<code>\d+) on (?P<pci>[0-9a-f:.]+)$")
COUNT_EVIDENCE = re.compile(r"^events since boot: (?P<count>\d+)$")


def summarize(events: Iterable[XidEvent]) -> list[XidSummary]:
    """Return one XidSummary per (GPU, code), in order of first appearance."""
    groups: dict[tuple[str, int], list[XidEvent]] = {}
    for event in events:
        groups.setdefault((event.pci, event.code), []).append(event)
    return [XidSummary(p, c, len(g), g[0], g[-1]) for (p, c), g in groups.items()]


@dataclass(frozen=True)
class KernelLog:
    """The kernel log as read from a host.

    Attributes:
        source: the command that gave it (``journalctl -k -b``, ``dmesg``), or "".
        text: its output ("" when unreadable).
        error: why it could not be read ("" when it was).
    """

    source: str
    text: str = ""
    error: str = ""


KERNEL_LOG_COMMANDS = (
    ("journalctl -k -b", ["journalctl", "-k", "-b", "-o", "short-monotonic", "--no-pager", "-q"]),
    ("dmesg", ["dmesg"]),
)


def read_kernel_log(host: Host, timeout: float = 20.0) -> KernelLog:
    """Return the host's kernel messages since boot: ``journalctl -k -b -o short-monotonic``,
    else ``dmesg`` (run through ``host``, so over SSH for ``--host``)."""
    errors = []
    for label, argv in KERNEL_LOG_COMMANDS:
        try:
            result = host.run(argv, timeout=timeout)
        except HostError as exc:
            return KernelLog("", error=str(exc))
        # journalctl without a journal of this boot prints "-- No entries --" and exits 0
        if result.ok and result.stdout.strip() and "-- No entries --" not in result.stdout[:200]:
            return KernelLog(label, result.stdout)
        why = result.stderr.strip() or result.stdout.strip() or f"exit {result.returncode}"
        errors.append(f"{label}: {why.splitlines()[-1][:200] if why else 'no output'}")
    return KernelLog("", error="; ".join(errors))
