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

import json
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

# Only a record the NVIDIA driver itself printed counts: its message begins with "NVRM: "
# and is one line (or is the driver's own record of several lines: _is_driver). The kernel log is read as records (journald's JSON, /dev/kmsg), where a
# newline inside a message stays inside it: a segfault record naming a program file called
# "x\nNVRM: Xid (PCI:...): 79, ..." (which any user, or any CT, can make the host's kernel
# print) holds a newline, and does not begin with NVRM. In a text log (recorded files), a
# line's header is the log's own (journalctl's date/monotonic stamp, host and "kernel:";
# dmesg's [stamp] or -T date; a syslog <level>), and a line that begins with a blank is a
# continuation of the record above it (journalctl and dmesg indent them), never a record.
_HEADER = (
    r"(?:(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?:\.\d+)?"  # journalctl -o short
    r"|\[\s*\d+\.\d+\]"  # -o short-monotonic
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?"  # -o short-iso
    r") \S+ kernel: )?"
)
_TEXT_HEADER = re.compile(
    r"^" + _HEADER + r"(?:<\d+>)?(?:\[\s*\d+\.\d+\]|\[[A-Z][a-z]{2} [A-Za-z0-9: ]{15,25}\])?\s*"
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
_MULTI_HEAD = re.compile(
    r"NVRM: The NVIDIA GPU "
    + _PCI
    + r"(?: \(PCI ID: [0-9a-fA-F]{4}:[0-9a-fA-F]{4}\) installed in this system (?:has|is))?"
)
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


@dataclass(frozen=True)
class KernelRecord:
    """One record of the kernel log (one printk call).

    Attributes:
        message: its text, a newline inside it kept (the segfault of a program whose file
            name holds one).
        uptime_s: seconds since boot when the kernel logged it, or None when unknown.
        line: how it is shown (``[ 123.456789] message``; a text log's line as read).
    """

    message: str
    uptime_s: float | None = None
    line: str = ""


def _stamp(line: str) -> float | None:
    match = _STAMP.search(line)
    return float(match["t"]) if match else None


def text_records(text: str) -> list[KernelRecord]:
    """Return the records of a text kernel log (``journalctl -o short*`` or ``dmesg``
    output, as recorded): each line's own header is dropped, and a line that begins with a
    blank is joined (after a newline) to the record above it, as journalctl and dmesg
    indent a record's second line."""
    records: list[KernelRecord] = []
    for line in text.splitlines():
        if line[:1].isspace() and records:
            last = records[-1]
            records[-1] = KernelRecord(f"{last.message}\n{line.strip()}", last.uptime_s, last.line)
            continue
        message = line if line[:1].isspace() else _TEXT_HEADER.sub("", line, count=1)
        records.append(KernelRecord(message, _stamp(line), line.strip()))
    return records


def _is_driver(message: str) -> bool:
    """Return True when the NVIDIA driver printed ``message``: one line that begins with
    ``NVRM: ``, or the driver's one record of several lines, each beginning with ``NVRM: ``
    after a first line that is exactly ``NVRM: The NVIDIA GPU BUS...`` (a GPU fallen off
    the bus, or not supported). No other record can be made to look so: another record's
    first line is not the driver's (a segfault's is at most the 15 characters of the
    program's name before ``[pid]: segfault``)."""
    first, *more = message.split("\n")
    if "\r" in message or not first.startswith("NVRM: "):
        return False
    if not more:
        return True
    return bool(_MULTI_HEAD.fullmatch(first)) and all(line.startswith("NVRM: ") for line in more)


def xid_events(records: list[KernelRecord]) -> list[XidEvent]:
    """Return the Xid and fallen-off-the-bus events of the kernel log's records, in log
    order. Only records the driver printed count (:func:`_is_driver`); one that merely
    quotes a driver line (a segfault of a program named like an Xid) is not an event. A
    fallen-off-the-bus message within three records of an Xid 79 of the same GPU is that
    event, not a second one."""
    found: list[tuple[int, XidEvent]] = []
    fallen: list[tuple[int, XidEvent]] = []
    driver = [r.message if _is_driver(r.message) else None for r in records]
    for i, record in enumerate(records):
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
                record.uptime_s,
                record.line,
            )))  # fmt: skip
            continue
        hit = _FALLEN_ONE.match(message)
        if hit is None:
            head = _FALLEN_HEAD.match(message)
            if head and "fallen off the bus" in " ".join(m or "" for m in driver[i : i + 3]):
                hit = head
        if hit:
            event = XidEvent(FALLEN, hit["pci"].lower(), "GPU has fallen off the bus",
                             uptime_s=record.uptime_s, line=record.line)  # fmt: skip
            fallen.append((i, event))
    xid79 = [(i, e.pci) for i, e in found if e.code == FALLEN]
    for i, event in fallen:
        if not any(pci == event.pci and abs(j - i) <= 3 for j, pci in xid79):
            found.append((i, event))
    return [e for _, e in sorted(found, key=lambda pair: pair[0])]


def parse_kernel_log(text: str) -> list[XidEvent]:
    """Return the Xid and fallen-off-the-bus events of a text kernel log (recorded
    ``journalctl -k -o short*`` or ``dmesg`` output): :func:`xid_events` of its
    :func:`text_records`."""
    return xid_events(text_records(text))


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
        source: what gave it (``journalctl -k -b -o json``, ``/dev/kmsg``), or "".
        records: its records, in log order (empty when unreadable).
        error: why it could not be read ("" when it was).
    """

    source: str
    records: tuple[KernelRecord, ...] = ()
    error: str = ""


_KMSG = re.compile(r"^(?P<level>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<msg>.*)$")
_KMSG_ESCAPE = re.compile(r"\\x([0-9a-f]{2})")


def _shown(uptime_s: float | None, message: str) -> str:
    stamp = f"[{uptime_s:12.6f}] " if uptime_s is not None else ""
    return stamp + message.replace("\n", "\\n").replace("\r", "\\r")


def kmsg_records(text: str) -> list[KernelRecord]:
    """Return the records of ``/dev/kmsg`` as read (one ``LEVEL,SEQ,USEC,FLAGS;MESSAGE``
    line per record, the kernel's ``\\xNN`` escapes decoded, so an escaped newline is a
    newline in the message; the `` KEY=VALUE`` dictionary lines are skipped)."""
    records = []
    for line in text.split("\n"):
        match = _KMSG.match(line)
        if match:
            raw = _KMSG_ESCAPE.sub(lambda m: chr(int(m[1], 16)), match["msg"])
            message = raw.encode("latin-1", "replace").decode("utf-8", "replace")
            uptime = int(match["usec"]) / 1e6
            records.append(KernelRecord(message, uptime, _shown(uptime, message)))
    return records


def journal_records(text: str) -> list[KernelRecord]:
    """Return the records of ``journalctl -o json`` output (one JSON object a line;
    ``MESSAGE`` a string, or a list of bytes when not clean UTF-8; the kernel's stamp
    ``_SOURCE_MONOTONIC_TIMESTAMP`` in microseconds). A line that is not such an object is
    skipped."""
    records = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        message = entry.get("MESSAGE") if isinstance(entry, dict) else None
        if isinstance(message, list) and all(isinstance(b, int) and 0 <= b < 256 for b in message):
            message = bytes(message).decode("utf-8", "replace")
        if not isinstance(message, str):
            continue
        usec = str(entry.get("_SOURCE_MONOTONIC_TIMESTAMP", ""))
        uptime = int(usec) / 1e6 if usec.isdigit() else None
        records.append(KernelRecord(message, uptime, _shown(uptime, message)))
    return records


KERNEL_LOG_READERS = (
    ("journalctl -k -b -o json",
     ["journalctl", "-k", "-b", "-o", "json", "--output-fields=MESSAGE,_SOURCE_MONOTONIC_TIMESTAMP",
      "--no-pager", "-q"], journal_records),
    ("/dev/kmsg",  # one read() per record; dd stops at EAGAIN (exit 1) once all are read
     ["dd", "if=/dev/kmsg", "iflag=nonblock", "bs=65536", "status=none"], kmsg_records),
)  # fmt: skip


def read_kernel_log(host: Host, timeout: float = 20.0) -> KernelLog:
    """Return the host's kernel log since boot as records: ``journalctl -k -b -o json``,
    else ``/dev/kmsg`` (run through ``host``, so over SSH for ``--host``). Never a text
    log: there a record's second line can pass for a record of its own."""
    errors = []
    for label, argv, parse in KERNEL_LOG_READERS:
        try:
            result = host.run(argv, timeout=timeout)
        except HostError as exc:
            return KernelLog("", error=str(exc))
        records = parse(result.stdout)
        if records:
            return KernelLog(label, tuple(records))
        said = (result.stderr.strip() or result.stdout.strip()).splitlines()
        why = said[-1][:200] if said else "no records" if result.ok else f"exit {result.returncode}"
        errors.append(f"{label}: {why}")
    return KernelLog("", error="; ".join(errors))
