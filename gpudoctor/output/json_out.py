"""The JSON report (schema ``gpudoctor.check/1``, documented in docs/json-schema.md)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TextIO

from gpudoctor import __version__
from gpudoctor.model import Report, worst

SCHEMA = "gpudoctor.check/1"


def report_dict(report: Report) -> dict[str, Any]:
    """Return one report as the schema's JSON object."""
    return {
        "target": report.target,
        "labels": dict(report.labels),
        "status": report.status.value,
        "duration_s": round(report.duration_s, 4),
        "checks": [
            {"check": r.check_id, "status": r.status.value, "duration_s": round(r.duration_s, 4)}
            for r in report.results
        ],
        "findings": [f.to_dict() for f in report.findings],
    }


def document(reports: Sequence[Report]) -> dict[str, Any]:
    """Return the whole JSON document: one report flat, several under ``reports``."""
    head = {"schema": SCHEMA, "gpudoctor_version": __version__}
    if len(reports) == 1:
        return {**head, **report_dict(reports[0])}
    return {
        **head,
        "status": worst(r.status for r in reports).value,
        "reports": [report_dict(r) for r in reports],
    }


def write_json(reports: Sequence[Report], stream: TextIO) -> None:
    """Write the JSON document to ``stream`` (indented, newline-terminated)."""
    json.dump(document(reports), stream, indent=2)
    stream.write("\n")
