"""The kernel log as gpudoctor reads it, made from a recorded text log
(tests/data/recorded/kernel_log/SOURCES.md): what ``journalctl -k -b -o json`` prints (one
JSON object per record: journald's ``MESSAGE`` and the kernel's
``_SOURCE_MONOTONIC_TIMESTAMP`` in microseconds) and what ``/dev/kmsg`` gives (one
``LEVEL,SEQ,USEC,FLAGS;MESSAGE`` line per record, a newline inside a message escaped
``\\x0a`` as the kernel escapes it). Stands for the records the real journald and kernel
hold for the lines that were recorded; this machine's log holds no NVIDIA Xid."""

from __future__ import annotations

import json

from gpudoctor.facts.xid import KERNEL_LOG_READERS, text_records

JOURNAL = " ".join(KERNEL_LOG_READERS[0][1])  # the command as RecordedHost keys it
KMSG = " ".join(KERNEL_LOG_READERS[1][1])


def _usec(uptime_s: float | None) -> int:
    return round(uptime_s * 1e6) if uptime_s is not None else 0


def journal_json(text: str) -> str:
    """Return ``journalctl -o json`` lines for the records of the text log ``text``."""
    lines = []
    for record in text_records(text):
        entry: dict[str, str] = {"MESSAGE": record.message}
        if record.uptime_s is not None:
            entry["_SOURCE_MONOTONIC_TIMESTAMP"] = str(_usec(record.uptime_s))
        lines.append(json.dumps(entry))
    return "".join(line + "\n" for line in lines)


def kmsg_escape(message: str) -> str:
    """Return ``message`` as /dev/kmsg shows it: every byte below 0x20, from 0x7f, and the
    backslash as ``\\xNN`` (the kernel's ``msg_add_ext_text``)."""
    return "".join(
        chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02x}" for b in message.encode()
    )


def kmsg(text: str) -> str:
    """Return /dev/kmsg's records (with a dictionary line after each, as the kernel adds
    ``SUBSYSTEM=``/``DEVICE=``) for the records of the text log ``text``."""
    return "".join(
        f"6,{seq},{_usec(r.uptime_s)},-;{kmsg_escape(r.message)}\n SUBSYSTEM=pci\n"
        for seq, r in enumerate(text_records(text))
    )
