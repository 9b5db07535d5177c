"""A measured cell's record fields from its verdict (issue 31): ``ok`` only when its
requests succeeded, else ``failed`` with the reason; the ``client_bound`` and
``suspect`` flags beside either."""

from __future__ import annotations

from typing import Any

from gpudoctor.bench.plan import Limits
from gpudoctor.bench.results.verdict import client_bound, judge, suspect, usage_overclaim


def cell_outcome(measurement: dict[str, Any], limits: Limits) -> dict[str, Any]:
    """Return the fields a measured cell's record gets: ``status`` (ok | failed),
    ``reason`` (why failed; for an ok cell the failures it tolerated and its flags, ""
    when clean), ``verdict`` (:meth:`Verdict.to_json`) and, when they apply,
    ``client_bound`` and ``suspect`` (one line each)."""
    verdict = judge(measurement, limits.max_failed_fraction)
    flags = {"client_bound": client_bound(measurement), "suspect": suspect(measurement)}
    flags = {k: v for k, v in flags.items() if v}
    notes = [verdict.reason] if verdict.reason else []
    overclaim = usage_overclaim(measurement)
    if overclaim:
        notes.append(overclaim)
    notes += [f"{name.replace('_', '-')}: {why}" for name, why in flags.items()]
    return {"status": verdict.status, "reason": "; ".join(notes), "verdict": verdict.to_json(),
            **flags}  # fmt: skip
