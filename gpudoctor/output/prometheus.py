"""Prometheus textfile output for node_exporter's textfile collector.

The metric names are a contract (alert rules are written against them, docs/prometheus.md):

- ``gpudoctor_up{target}``: 1 when the target was reached and its checks ran, else 0;
- ``gpudoctor_status{target}``: the worst status of the target's findings (0 PASS, 1 SKIP,
  2 WARN, 3 FAIL, 4 ERROR; 4 when unreachable);
- ``gpudoctor_last_run_timestamp_seconds{target}``: unix time of this run;
- ``gpudoctor_last_success_timestamp_seconds{target}``: unix time of the last run without
  FAIL/ERROR (carried over from the previous file when this run failed; absent if never);
- ``gpudoctor_check_status{check,subject,target[,node,ct]}``: one gauge per finding;
- ``gpudoctor_check_duration_seconds{check,target[,node,ct]}``: wall time of each check;
- ``gpudoctor_xid_events{pci,code,kind,fatal,target[,node,ct]}``: NVIDIA Xid events in the
  host's kernel log since boot (``host.xid``), per GPU and code; ``fatal="1"`` when the GPU
  is unusable until reset or reboot.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Mapping, Sequence
from typing import TextIO

from gpudoctor.model import CheckResult, Finding, Report, Status

# Synthetic results of targets whose checks did not run (unreachable, timed out, CT stopped).
NOT_CHECKED = frozenset({"fleet.reach", "fleet.timeout", "fleet.state", "target.reach"})
SUCCESS_METRIC = "gpudoctor_last_success_timestamp_seconds"
_SUCCESS_LINE = re.compile(
    r'^gpudoctor_last_success_timestamp_seconds\{target="((?:[^"\\]|\\.)*)"\} ([0-9]+(?:\.[0-9]+)?)$'
)
_PREVIOUS_MAX_BYTES = 16 * 1024 * 1024


def label_value(text: str) -> str:
    """Return ``text`` escaped for a Prometheus label value."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), text)


def labels(pairs: Sequence[tuple[str, str]]) -> str:
    """Return ``{k="v",...}`` for label pairs."""
    return "{" + ",".join(f'{k}="{label_value(v)}"' for k, v in pairs) + "}"


def unreachable_report(target: str, message: str) -> Report:
    """Return the Report of a target that could not be reached: one ERROR finding
    ``target.reach`` (so the textfile says ``gpudoctor_up 0``, status 4)."""
    finding = Finding("target.reach", Status.ERROR, target, message)
    return Report(target, (CheckResult("target.reach", (finding,)),))


def is_up(report: Report) -> bool:
    """Return True when the target was reached and its checks ran."""
    return not any(r.check_id in NOT_CHECKED for r in report.results)


def succeeded(report: Report) -> bool:
    """Return True when the target was checked and no finding is FAIL or ERROR."""
    bad = (Status.FAIL, Status.ERROR)
    return is_up(report) and not any(f.status in bad for f in report.findings)


def read_previous_success(path: str) -> dict[str, float]:
    """Return ``{target: last success unix seconds}`` from a previous textfile at ``path``.

    Only our own ``gpudoctor_last_success_timestamp_seconds`` lines are read, and only when
    ``path`` is a regular file (not a symlink) owned by the caller: a file someone else
    could write never feeds a timestamp back. Returns {} otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return {}
        text = fh.read(_PREVIOUS_MAX_BYTES).decode("utf-8", "replace")
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = _SUCCESS_LINE.match(line)
        if match:
            found[_unescape(match.group(1))] = float(match.group(2))
    return found


def _gauge(stream: TextIO, name: str, help_text: str) -> None:
    stream.write(f"# HELP {name} {help_text}\n# TYPE {name} gauge\n")


def write_prometheus(
    reports: Sequence[Report],
    stream: TextIO,
    *,
    now: float | None = None,
    previous_success: Mapping[str, float] | None = None,
) -> None:
    """Write the per-target gauges, then every finding and check duration (``# HELP`` and
    ``# TYPE`` once each). ``now`` is this run's unix time (default: the clock);
    ``previous_success`` the last success per target from the file being replaced."""
    now = time.time() if now is None else now
    previous = previous_success or {}
    targets = [(r, [("target", r.target)]) for r in reports]
    _gauge(stream, "gpudoctor_up", "1 when the target was reached and its checks ran, else 0.")
    for report, base in targets:
        stream.write(f"gpudoctor_up{labels(base)} {int(is_up(report))}\n")
    _gauge(
        stream,
        "gpudoctor_status",
        "Worst status of the target: 0 PASS, 1 SKIP, 2 WARN, 3 FAIL, 4 ERROR (unreachable).",
    )
    for report, base in targets:
        stream.write(f"gpudoctor_status{labels(base)} {report.status.rank}\n")
    _gauge(stream, "gpudoctor_last_run_timestamp_seconds", "Unix time of this run.")
    for _, base in targets:
        stream.write(f"gpudoctor_last_run_timestamp_seconds{labels(base)} {int(now)}\n")
    _gauge(stream, SUCCESS_METRIC, "Unix time of the last run without FAIL or ERROR.")
    for report, base in targets:
        last = now if succeeded(report) else previous.get(report.target)
        if last is not None:
            stream.write(f"{SUCCESS_METRIC}{labels(base)} {int(last)}\n")
    _gauge(
        stream,
        "gpudoctor_check_status",
        "Finding status: 0 PASS, 1 SKIP, 2 WARN, 3 FAIL, 4 ERROR.",
    )
    for report in reports:
        base = [("target", report.target), *report.labels]
        # One series per label set: several findings of a check about one subject (e.g.
        # ct.device_rules' WARNs about one config) keep the worst status; a repeated series
        # would make node_exporter log an error and serve only the first sample.
        worst: dict[str, int] = {}
        for f in report.findings:
            key = labels([("check", f.check_id), ("subject", f.subject), *base])
            worst[key] = max(worst.get(key, -1), f.status.rank)
        for key, rank in worst.items():
            stream.write(f"gpudoctor_check_status{key} {rank}\n")
    _write_xid(reports, stream)
    _gauge(stream, "gpudoctor_check_duration_seconds", "Wall time of each check.")
    for report in reports:
        base = [("target", report.target), *report.labels]
        for r in report.results:
            stream.write(
                f"gpudoctor_check_duration_seconds{labels([('check', r.check_id), *base])} "
                f"{r.duration_s:.4f}\n"
            )


def _write_xid(reports: Sequence[Report], stream: TextIO) -> None:
    """Write ``gpudoctor_xid_events`` from host.xid's findings (subject ``Xid C on PCI``,
    evidence ``events since boot: N``); nothing when no report has one."""
    from gpudoctor.facts.xid import COUNT_EVIDENCE, SUBJECT, XID_TABLE

    rows: dict[str, int] = {}
    for report in reports:
        base = [("target", report.target), *report.labels]
        for f in report.findings:
            match = SUBJECT.match(f.subject) if f.check_id == "host.xid" else None
            counts = [COUNT_EVIDENCE.match(e) for e in f.evidence]
            count = next((int(c["count"]) for c in counts if c), 0)
            if not match or not count:
                continue
            info = XID_TABLE.get(int(match["code"]))
            pairs = [("pci", match["pci"]), ("code", match["code"]),
                     ("kind", info.kind if info else "unknown"),
                     ("fatal", "1" if f.status is Status.FAIL else "0"), *base]  # fmt: skip
            rows[labels(pairs)] = count
    if rows:
        _gauge(stream, "gpudoctor_xid_events",
               "NVIDIA Xid events in the kernel log since boot, per GPU and code.")  # fmt: skip
        for key, count in rows.items():
            stream.write(f"gpudoctor_xid_events{key} {count}\n")


def textfile(reports: Sequence[Report], path: str | None, now: float | None = None) -> str:
    """Return the textfile that replaces ``path`` (its last-success times carried over)."""
    import io

    buffer = io.StringIO()
    previous = read_previous_success(path) if path else {}
    write_prometheus(reports, buffer, now=now, previous_success=previous)
    return buffer.getvalue()
