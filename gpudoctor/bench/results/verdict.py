"""A cell's verdict from its requests: ``ok`` only when its requests succeeded.

Pure functions over a cell's measurement (``loadgen.measure_cell``'s record, itself
computed from the cell's request records), no I/O. Issue 31: a campaign whose every
request got HTTP 422 was recorded 12 x ``ok``; here a cell is ``failed`` when

- no request succeeded (the warmup rejected with HTTP 4xx counts: nothing was measured),
- the successful replies carried zero output tokens, or
- more than ``max_failed_fraction`` of its requests failed (``[limits]``, 0.01).

A ``failed`` verdict carries the error counts by kind and the first error verbatim (the
server's own message). Besides the verdict, two flags qualify an ``ok`` cell's numbers:
``client_bound`` (the load generator could not hold its schedule) and ``suspect`` (the
GPU throttled or logged an Xid during the cell).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.bench.cell_spec import EXTENSION_FIELDS

DEFAULT_MAX_FAILED_FRACTION = 0.01
CLIENT_RATE_FLOOR = 0.95  # achieved / scheduled rate below this: client_bound
CLIENT_DELAY_P99_MS = 10.0  # schedule delay p99 above this: client_bound
# NVML clock-event reasons that make a cell's numbers suspect (thermal, power brake, HW
# slowdown); a software power cap or idle clocks are ordinary and do not.
SLOWDOWNS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


@dataclass(frozen=True)
class Verdict:
    """What a cell's requests say about it.

    Attributes:
        status: ``ok`` or ``failed``.
        reason: one line: why failed, or the failures an ``ok`` cell tolerated ("" if none).
        requests: measured requests (warmup excluded).
        failed: measured requests that failed.
        errors: failed requests by kind, only the kinds that occurred.
        first_error: the first failure's message, verbatim (None when none failed).
    """

    status: str
    reason: str
    requests: int
    failed: int
    errors: dict[str, int] = field(default_factory=dict)
    first_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Return the verdict as the record's ``verdict`` dict (JSON-ready)."""
        return {"status": self.status, "reason": self.reason, "requests": self.requests,
                "failed": self.failed, "errors": dict(self.errors),
                "first_error": self.first_error}  # fmt: skip


def _table(value: object) -> Mapping[str, Any]:
    """Return ``value`` when it is a table, else an empty one: a record's sub-tables
    come from a file (a list or a number there must not crash every reader)."""
    return value if isinstance(value, Mapping) else {}


def _error_text(measurement: Mapping[str, Any]) -> str | None:
    first = measurement.get("first_error")
    if isinstance(first, dict):
        return first.get("message") or None
    warm = _table(_table(measurement.get("client")).get("warmup"))
    return warm.get("first_error") or None


def _kinds(errors: Mapping[str, int]) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in sorted(errors.items(), key=lambda kv: -kv[1]))


def judge(
    measurement: Mapping[str, Any], max_failed_fraction: float = DEFAULT_MAX_FAILED_FRACTION
) -> Verdict:
    """Return the verdict of one measured cell (see the module docstring).

    ``measurement``: the cell's record from ``measure_cell`` (``num_prompts``,
    ``completed``, ``errors`` by kind, ``metrics.total_output_tokens``, ``first_error``,
    ``client.warmup``)."""
    errors = {k: int(v) for k, v in _table(measurement.get("errors")).items() if v}
    completed = int(measurement.get("completed") or 0)
    failed = sum(errors.values())
    requests = completed + failed
    first = _error_text(measurement)
    warm = _table(_table(measurement.get("client")).get("warmup"))
    if warm.get("rejected"):
        why = f"the server rejected the warmup request ({first}); nothing was measured"
        return Verdict("failed", why, requests, failed, errors, first)
    if requests == 0:
        return Verdict("failed", "no request was measured", 0, 0, errors, first)
    if completed == 0:
        why = f"all {requests} requests failed ({_kinds(errors)})" + (f": {first}" if first else "")
        return Verdict("failed", why, requests, failed, errors, first)
    output = _table(measurement.get("metrics")).get("total_output_tokens") or 0
    if output <= 0:
        why = f"{completed} replies carried zero output tokens"
        return Verdict("failed", why, requests, failed, errors, first)
    if failed and failed > max_failed_fraction * requests:
        why = (f"{failed} of {requests} requests failed ({failed / requests:.1%} >"
               f" max_failed_fraction {max_failed_fraction:g}; {_kinds(errors)})"
               + (f": {first}" if first else ""))  # fmt: skip
        return Verdict("failed", why, requests, failed, errors, first)
    note = f"{failed} of {requests} requests failed ({_kinds(errors)})" if failed else ""
    return Verdict("ok", note, requests, failed, errors, first)


def client_bound(measurement: Mapping[str, Any]) -> str | None:
    """Return why the load generator, not the server, limited the cell (its achieved
    rate below 0.95 of its schedule, or its schedule delay p99 over 10 ms); None when
    it held its schedule or the cell was a closed loop."""
    audit = _table(_table(measurement.get("client")).get("audit"))
    if audit.get("target_rate") is None:  # no schedule to hold: a closed loop, an infinite rate
        return None
    ratio, p99 = audit.get("rate_ratio"), audit.get("schedule_delay_ms_p99")
    achieved = audit.get("achieved_rate")
    reasons = []
    if isinstance(ratio, (int, float)) and ratio < CLIENT_RATE_FLOOR:
        sent = f"{achieved:.0f} req/s" if isinstance(achieved, (int, float)) else "less"
        reasons.append(f"sent {sent}, {ratio:.2f} of the schedule's rate")
    if isinstance(p99, (int, float)) and p99 > CLIENT_DELAY_P99_MS:
        reasons.append(f"schedule delay p99 {p99:.1f} ms")
        slot = audit.get("slot_wait_ms_p99")
        if isinstance(slot, (int, float)) and slot > CLIENT_DELAY_P99_MS:
            reasons.append(
                f"waits for a concurrency slot p99 {slot:.1f} ms (the cap, not the server)"
            )
    return "; ".join(reasons) or None


def usage_overclaim(measurement: Mapping[str, Any]) -> str | None:
    """Return one line when the server's ``usage`` claimed more output tokens than its
    replies streamed (``metrics.usage_overclaims``; the cell's numbers count what
    arrived), else None."""
    metrics = _table(measurement.get("metrics"))
    replies, tokens = metrics.get("usage_overclaims"), metrics.get("usage_overclaimed_tokens")
    if not isinstance(replies, int) or replies <= 0:
        return None
    return (f"the server's usage claims {tokens} output tokens more than it streamed in"
            f" {replies} replies (the numbers count the tokens that arrived)")  # fmt: skip


def suspect(measurement: Mapping[str, Any]) -> str | None:
    """Return why the GPU's numbers are suspect: a slowdown of ``SLOWDOWNS`` active in the
    cell's telemetry samples (NVML clock-event reasons, with the fraction of samples), or
    an Xid recorded in the cell's window (``telemetry.xids``); None when neither."""
    tel = _table(measurement.get("telemetry"))
    reasons = []
    throttles = tel.get("throttle_reasons") or {}
    seen = [f"{name} {throttles[name]:.0%} of samples" if isinstance(throttles, dict)
            and isinstance(throttles[name], (int, float)) else str(name)
            for name in throttles if name in SLOWDOWNS]  # fmt: skip
    if seen:
        reasons.append("GPU slowed down: " + ", ".join(seen))
    xids = tel.get("xids") or []
    if xids:
        reasons.append(", ".join(
            f"Xid {x.get('xid')} on GPU {x.get('gpu')} at {x.get('t')} s" if isinstance(x, dict)
            else f"Xid {x}" for x in xids) + " during the cell")  # fmt: skip
    return "; ".join(reasons) or None


_FIELD_IN_MESSAGE = re.compile(r"['\"](\w+)['\"]")


def common_failure(records: Iterable[Mapping[str, Any]]) -> str | None:
    """Return one line when every cell of a configuration failed with the same first
    error (a plan problem, not a load problem): the message, and the plan field to change
    when the server named a request field; None otherwise."""
    firsts = []
    succeeded = 0
    for record in records:
        verdict = record.get("verdict") or {}
        if record.get("status") != "failed" or not verdict.get("first_error"):
            return None
        firsts.append(str(verdict["first_error"]))
        completed = _table(record.get("measurement")).get("completed")
        succeeded += completed if isinstance(completed, int) else 0
    if len(firsts) < 1 or len(set(firsts)) != 1:
        return None
    message = firsts[0]
    if succeeded:  # issue 47: a server failing now and then is no plan error
        return (f"every cell failed the same way: {message}; yet {succeeded} request(s)"
                " succeeded: the server fails intermittently, not the plan: read its log"
                " (bench report shows its last lines)")  # fmt: skip
    named = [f for f in _FIELD_IN_MESSAGE.findall(message) if f in EXTENSION_FIELDS]
    hint = (f"; the server refuses the request field {named[0]!r}: change {named[0]} in"
            " [workload] (or the engine)") if named else "; fix the plan, not the load"  # fmt: skip
    return f"every cell failed the same way: {message}{hint}"
