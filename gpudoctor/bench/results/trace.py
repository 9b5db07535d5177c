"""A cell's request timeline as a Chrome/Perfetto trace (``RUN/trace/<cell>.json``).

The Trace Event Format (JSON object form, ``{"traceEvents": [...]}``): ui.perfetto.dev
and chrome://tracing open it. One row ("thread") per concurrency lane: each request is
a complete event (``ph: X``) from send to its end, with two children, "waiting for the
first token" and "streaming"; a failed request is named ``FAILED`` and carries an
instant event (``ph: i``) at its end with the error. The server signals scraped during
the cell are counter tracks (``ph: C``). Times are microseconds from the cell's start.

Bounded: at most :data:`MAX_REQUESTS` requests (every failure first, then successes
evenly spread over the cell), so a cell of a million requests stays a few MB; the
trace's ``metadata`` says how many were kept of how many.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpudoctor.bench.request_record import RequestRecord

MAX_REQUESTS = 4000  # requests drawn at most (each ~3 events, ~600 bytes)
SIGNAL_TRACKS = ("kv_cache_usage", "running", "waiting", "prefix_cache_hit_rate",
                 "spec_accept_length")  # fmt: skip
_US = 1e6


def keep_bounded(
    records: Sequence[RequestRecord], limit: int = MAX_REQUESTS
) -> list[RequestRecord]:
    """Return at most ``limit`` records in send order: every failure (up to ``limit``),
    then successes evenly spaced over the cell."""
    if len(records) <= limit:
        return sorted(records, key=lambda r: r.send_s)
    failed = [r for r in records if not r.ok][:limit]
    ok = [r for r in records if r.ok]
    room = limit - len(failed)
    step = len(ok) / room if room > 0 else 0
    picked = [ok[int(i * step)] for i in range(room)] if room > 0 else []
    return sorted(failed + picked, key=lambda r: r.send_s)


def lanes(records: Sequence[RequestRecord]) -> list[int]:
    """Return a lane (row) per record (send order): the lowest lane free at its send time,
    so the rows show how many requests were in flight."""
    free: list[int] = []
    busy: list[tuple[float, int]] = []  # (end, lane)
    out: list[int] = []
    opened = 0
    for r in records:
        while busy and busy[0][0] <= r.send_s:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane, opened = opened, opened + 1
        heapq.heappush(busy, (r.end_s, lane))
        out.append(lane)
    return out


def trace_document(
    records: Sequence[RequestRecord], label: str, signals: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Return the trace of one cell (``label``: its name): request slices per lane, error
    instants, and counter tracks of ``signals`` (the scraper's summary) when given."""
    kept = keep_bounded(records)
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": f"requests: {label}"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "server signals"}},
    ]
    rows = lanes(kept)
    for lane in sorted(set(rows)):
        events.append({"ph": "M", "pid": 1, "tid": lane, "name": "thread_name",
                       "args": {"name": f"lane {lane}"}})  # fmt: skip
    for record, lane in zip(kept, rows, strict=True):
        events += request_events(record, lane)
    for name in SIGNAL_TRACKS:
        entry = (signals or {}).get("signals", {}).get(name) or {}
        for t, value in entry.get("series", []):
            events.append({"ph": "C", "pid": 2, "name": name, "ts": round(t * _US),
                           "args": {"value": value}})  # fmt: skip
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "metadata": {"cell": label, "requests": len(records), "requests_kept": len(kept),
                     "failed": sum(1 for r in records if not r.ok), "source": "gpudoctor"},
    }  # fmt: skip


def request_events(record: RequestRecord, lane: int) -> list[dict[str, Any]]:
    """Return one request's events: its slice (send -> end), its waiting and streaming
    children, and an error instant when it failed."""
    start = round(record.send_s * _US)
    total = max(record.end_s - record.send_s, 0.0)
    args = {"index": record.index, "prompt_len": record.prompt_len,
            "output_tokens": record.output_tokens, "ttft_s": record.ttft_s,
            "e2e_s": record.e2e_s, "status_code": record.status_code}  # fmt: skip
    request_id = getattr(record, "request_id", None)
    if request_id:
        args["request_id"] = request_id
    name = f"req {record.index}"
    if not record.ok:
        name = f"FAILED req {record.index} ({record.error_kind})"
        args["error"] = record.error
    base = {"pid": 1, "tid": lane}
    out = [{**base, "ph": "X", "name": name, "cat": "request" if record.ok else "failed",
            "ts": start, "dur": round(total * _US), "args": args}]  # fmt: skip
    if record.ttft_s is not None:
        out.append({**base, "ph": "X", "name": "waiting for the first token", "cat": "phase",
                    "ts": start, "dur": round(record.ttft_s * _US)})  # fmt: skip
        if record.e2e_s is not None and record.e2e_s > record.ttft_s:
            out.append({**base, "ph": "X", "name": "streaming", "cat": "phase",
                        "ts": start + round(record.ttft_s * _US),
                        "dur": round((record.e2e_s - record.ttft_s) * _US)})  # fmt: skip
    if not record.ok:
        out.append({**base, "ph": "i", "s": "t", "name": f"error: {record.error_kind}",
                    "ts": start + round(total * _US), "args": {"error": record.error}})  # fmt: skip
    return out


def trace_name(label: str) -> str:
    """Return the file name of a cell's trace: its label with anything but letters,
    digits, ``.``, ``-`` and ``_`` made ``_`` (``tp1-c8.json``)."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in label)
    return f"{safe.strip('._') or 'cell'}.json"


def cell_label(config: str, concurrency: int, request_rate: float | None, repeat: int) -> str:
    """Return a cell's name in its trace and trace file (``fast-c8``, ``fast-c8-r30``,
    ``fast-c8-rep1`` for a repeat after the first)."""
    from gpudoctor.bench.cell_spec import rate_label

    label = f"{config}-c{concurrency}"
    if request_rate is not None:
        label += f"-r{rate_label(request_rate)}"
    return label + (f"-rep{repeat}" if repeat else "")


def trace_path(run_dir: Path, label: str) -> Path:
    """Return where a cell's trace goes: ``RUN/trace/<label>.json``."""
    return Path(run_dir) / "trace" / trace_name(label)


def write_trace(
    path: Path, label: str, records: Sequence[RequestRecord], signals: dict[str, Any] | None
) -> Path:
    """Write the cell's trace to ``path`` (its folder made when missing; atomically, never
    through a link); return ``path``."""
    from gpudoctor import fsio

    fsio.make_missing_dirs(Path(path).parent)
    text = json.dumps(trace_document(records, label, signals), separators=(",", ":"))
    fsio.write_output(path, text)
    return Path(path)


def read_trace(path: Path) -> dict[str, Any] | None:
    """Return a trace written by :func:`write_trace`, or None when it is missing or not
    a trace object."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("traceEvents"), list) else None
