"""Request records -> a cell's metrics, with SGLang bench_serving's definitions.

Pure functions, no I/O. Definitions (DESIGN.md section 6, ``sglang/bench_serving.py``
``calculate_metrics``), over the successful requests only:

- TTFT: send -> first content chunk.  E2E: send -> last streamed event.
- TPOT per request: (E2E - TTFT) / (output_tokens - 1), for output_tokens > 1.
- ITL: the gap between consecutive content chunks; a chunk of n tokens contributes
  n values of gap / n (SGLang's re-tokenized ITL; identical to the plain gaps when
  every chunk holds one token).
- Throughputs: tokens (or requests) of successful requests / the cell's wall time.
- Goodput: successful requests meeting every set SLO / wall time (vLLM's definition;
  a request with one output token has no TPOT and passes the TPOT SLO).
- Statistics: mean, median, population std (``np.std``), percentiles with linear
  interpolation (``np.percentile``'s default), max; milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gpudoctor.bench.cell_spec import SLO
from gpudoctor.bench.request_record import ERROR_KINDS, RequestRecord

PERCENTILES = (90, 95, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """Return the q-th percentile (0..100) with linear interpolation, as ``np.percentile``."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Sequence[float], name: str, scale: float = 1000.0) -> dict[str, float | None]:
    """Return ``{mean_<name>, median_<name>, std_<name>, p90/p95/p99_<name>, max_<name>}``.

    Values are multiplied by ``scale`` (seconds -> milliseconds by default); an empty
    input gives None for every key (not zeros: "no data" must not read as "instant").
    """
    keys = ["mean", "median", "std", *(f"p{p}" for p in PERCENTILES), "max"]
    if not values:
        return {f"{key}_{name}": None for key in keys}
    scaled = [v * scale for v in values]
    mean = math.fsum(scaled) / len(scaled)
    variance = math.fsum((v - mean) ** 2 for v in scaled) / len(scaled)
    out: dict[str, float | None] = {
        f"mean_{name}": mean,
        f"median_{name}": percentile(scaled, 50),
        f"std_{name}": math.sqrt(variance),
    }
    for p in PERCENTILES:
        out[f"p{p}_{name}"] = percentile(scaled, p)
    out[f"max_{name}"] = max(scaled)
    return out


def request_tpot_s(record: RequestRecord) -> float | None:
    """Return the request's time per output token in seconds, or None (< 2 tokens)."""
    if not record.ok or record.output_tokens < 2 or record.ttft_s is None or record.e2e_s is None:
        return None
    return (record.e2e_s - record.ttft_s) / (record.output_tokens - 1)


def request_itls_s(record: RequestRecord) -> list[float]:
    """Return the request's inter-token latencies in seconds (gap / n, n times per chunk)."""
    times = record.chunk_times_s
    counts = record.chunk_tokens or (1,) * len(times)
    itls: list[float] = []
    for k in range(1, len(times)):
        n = max(counts[k], 1)
        itls.extend([(times[k] - times[k - 1]) / n] * n)
    return itls


def meets_slo(record: RequestRecord, slo: SLO) -> bool:
    """Return True when a successful request meets every SLO that is set."""
    if not record.ok or record.ttft_s is None or record.e2e_s is None:
        return False
    if slo.ttft_ms is not None and record.ttft_s * 1000 > slo.ttft_ms:
        return False
    if slo.e2el_ms is not None and record.e2e_s * 1000 > slo.e2el_ms:
        return False
    tpot = request_tpot_s(record)
    return not (slo.tpot_ms is not None and tpot is not None and tpot * 1000 > slo.tpot_ms)


def count_errors(records: Sequence[RequestRecord]) -> dict[str, int]:
    """Return failed requests counted by kind; every kind in ``ERROR_KINDS`` is present."""
    counts = dict.fromkeys(ERROR_KINDS, 0)
    for record in records:
        if not record.ok:
            kind = record.error_kind if record.error_kind in counts else "other"
            counts[kind] += 1
    return counts


def compute_metrics(
    records: Sequence[RequestRecord], duration_s: float, slo: SLO | None = None
) -> dict[str, Any]:
    """Return the cell's metrics (flat, JSON-ready; latencies in ms, throughputs per second).

    Keys: ``completed``, ``failed``, ``total_input_tokens``, ``total_output_tokens``,
    ``request_throughput`` (req/s), ``input_throughput``, ``output_throughput``,
    ``total_throughput`` (tok/s), ``concurrency`` (sum of E2E / wall time, as SGLang),
    ``{mean,median,std,p90,p95,p99,max}_{ttft,tpot,itl,e2e}_ms``, and when ``slo`` is
    given ``goodput`` (req/s), ``good_requests`` and ``slo_attainment`` (good requests /
    all measured requests, failures count as misses).
    """
    if duration_s <= 0:
        raise ValueError(f"duration must be positive, got {duration_s}")
    ok = [r for r in records if r.ok]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    e2es = [r.e2e_s for r in ok if r.e2e_s is not None]
    tpots = [t for t in (request_tpot_s(r) for r in ok) if t is not None]
    itls = [gap for r in ok for gap in request_itls_s(r)]
    metrics: dict[str, Any] = {
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration_s,
        "input_throughput": total_in / duration_s,
        "output_throughput": total_out / duration_s,
        "total_throughput": (total_in + total_out) / duration_s,
        "concurrency": math.fsum(e2es) / duration_s,
    }
    metrics.update(summarize(ttfts, "ttft_ms"))
    metrics.update(summarize(tpots, "tpot_ms"))
    metrics.update(summarize(itls, "itl_ms"))
    metrics.update(summarize(e2es, "e2e_ms"))
    if slo is not None:
        good = sum(1 for r in ok if meets_slo(r, slo))
        metrics["good_requests"] = good
        metrics["goodput"] = good / duration_s
        metrics["slo_attainment"] = good / len(records) if records else None
    return metrics


def max_in_flight(records: Sequence[RequestRecord]) -> int:
    """Return the most requests that were in flight at once (send .. end intervals)."""
    events = [(r.send_s, 1) for r in records] + [(r.end_s, -1) for r in records]
    events.sort(key=lambda e: (e[0], e[1]))  # at a tie, an end frees its slot first
    current = peak = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def token_truth(records: Sequence[RequestRecord], forced: bool) -> dict[str, int | None]:
    """Return the output tokens' truth (issue 45.1): the client counts what arrived, the
    server's ``usage`` is only compared with it.

    Keys: ``token_count_mismatches``: successful replies whose ``usage.completion_tokens``
    differs from the tokens the client received (None when no reply carried ``usage``);
    ``usage_overclaims`` and ``usage_overclaimed_tokens``: the replies whose ``usage``
    claims more than arrived, and by how many tokens in all; ``short_replies``: with a
    forced output length (``forced``: ignore_eos), the successful replies that received
    fewer or more tokens than the ``max_tokens`` asked (else None); ``empty_replies``: the
    replies that streamed no content token (HTTP 200, kind ``empty``)."""
    ok = [r for r in records if r.ok]
    counted = [r for r in ok if r.usage_completion_tokens is not None]
    over = [int(r.usage_completion_tokens or 0) - r.output_tokens for r in counted]
    over = [n for n in over if n > 0]
    return {
        "token_count_mismatches": (
            sum(1 for r in counted if r.usage_completion_tokens != r.output_tokens)
            if counted
            else None
        ),
        "usage_overclaims": len(over),
        "usage_overclaimed_tokens": sum(over),
        "short_replies": sum(1 for r in ok if r.output_tokens != r.max_tokens) if forced else None,
        "empty_replies": sum(1 for r in records if r.error_kind == "empty"),
    }


def client_audit(
    records: Sequence[RequestRecord], duration_s: float, cpu_s: float
) -> dict[str, float | int | None]:
    """Return the load generator's audit of its own pacing (issue 31, item 6), measured
    where the server sees each request: when its bytes were written (``written_s``; the
    send stamp before the connect where the transport does not say), issue 45.9.

    Keys: ``target_rate`` (req/s the arrival schedule asked: requests - 1 over the
    schedule's span; None in a closed loop), ``achieved_rate`` (req/s actually sent:
    requests - 1 over the span of the writes), ``rate_ratio`` (the schedule's span / the
    writes' span: 1.0 = on time; below 1 the client fell behind),
    ``schedule_delay_ms_{p50,p99,max}`` (write - intended send: every wait counts, the
    pacer's and event loop's lag, a concurrency slot, the connect), ``slot_wait_ms_p99``
    (the waits for a concurrency slot alone: client-side queueing that a latency figure
    would otherwise hide), ``cpu_busy`` (the client's CPU seconds / the cell's wall time:
    near 1.0 the client, not the server, is the limit)."""
    sent = sorted((r for r in records if r.wall_s), key=_written)
    paced = [r for r in sent if r.intended_s is not None]
    out: dict[str, float | int | None] = {
        "target_rate": None,
        "achieved_rate": None,
        "rate_ratio": None,
        "schedule_delay_ms_p50": None,
        "schedule_delay_ms_p99": None,
        "schedule_delay_ms_max": None,
        "slot_wait_ms_p99": None,
        "cpu_busy": cpu_s / duration_s if duration_s > 0 else None,
    }
    if len(sent) >= 2 and _written(sent[-1]) > _written(sent[0]):
        out["achieved_rate"] = (len(sent) - 1) / (_written(sent[-1]) - _written(sent[0]))
    if not paced:  # a closed loop queues every request for a slot by design
        return out
    waits = [r.queued_s for r in paced if r.queued_s is not None]
    if waits:
        out["slot_wait_ms_p99"] = percentile(waits, 99) * 1000
    delays = [max(_written(r) - r.intended_s, 0.0) for r in paced]  # type: ignore[operator]
    out["schedule_delay_ms_p50"] = percentile(delays, 50) * 1000
    out["schedule_delay_ms_p99"] = percentile(delays, 99) * 1000
    out["schedule_delay_ms_max"] = max(delays) * 1000
    planned = [r.intended_s for r in paced]
    span = max(planned) - min(planned)  # type: ignore[type-var,operator]
    writes = [_written(r) for r in paced]
    real = max(writes) - min(writes)
    if span > 0 and len(paced) >= 2:
        out["target_rate"] = (len(paced) - 1) / span
        out["rate_ratio"] = span / real if real > 0 else None
    return out


def _written(record: RequestRecord) -> float:
    """Return when the server could first see ``record``: its bytes' write, else its send."""
    return record.written_s if record.written_s is not None else record.send_s
