"""Prometheus textfile output for node_exporter's textfile collector.

One gauge per finding, ``gpudoctor_check_status{check,subject[,target,node,ct]}``: 0 PASS,
1 SKIP, 2 WARN, 3 FAIL, 4 ERROR; plus ``gpudoctor_check_duration_seconds`` per check.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from gpudoctor.model import Report


def label_value(text: str) -> str:
    """Return ``text`` escaped for a Prometheus label value."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels(pairs: Sequence[tuple[str, str]]) -> str:
    """Return ``{k="v",...}`` for label pairs."""
    return "{" + ",".join(f'{k}="{label_value(v)}"' for k, v in pairs) + "}"


def write_prometheus(reports: Sequence[Report], stream: TextIO) -> None:
    """Write every finding of every report as gauges (``# HELP``/``# TYPE`` once each)."""
    stream.write(
        "# HELP gpudoctor_check_status Finding status: 0 PASS, 1 SKIP, 2 WARN, 3 FAIL, 4 ERROR.\n"
    )
    stream.write("# TYPE gpudoctor_check_status gauge\n")
    for report in reports:
        base = [("target", report.target), *report.labels]
        for f in report.findings:
            pairs = [("check", f.check_id), ("subject", f.subject), *base]
            stream.write(f"gpudoctor_check_status{labels(pairs)} {f.status.rank}\n")
    stream.write("# HELP gpudoctor_check_duration_seconds Wall time of each check.\n")
    stream.write("# TYPE gpudoctor_check_duration_seconds gauge\n")
    for report in reports:
        base = [("target", report.target), *report.labels]
        for r in report.results:
            stream.write(
                f"gpudoctor_check_duration_seconds{labels([('check', r.check_id), *base])} "
                f"{r.duration_s:.4f}\n"
            )
