"""Is a difference between two cells real? A bootstrap over the per-request raw records.

Two runs of the same cell differ by chance (a loaded machine, a server's warm caches);
a ratio B / A means something only when it is outside that noise. For each cell both
runs' raw records (``raw/<key>.jsonl``) are resampled with replacement
(``RESAMPLES`` times, seeded) and each metric is recomputed on the resample; the 2.5th
and 97.5th percentiles of the resampled ratios give a 95 % interval. An interval that
contains 1 means "within the noise".

Latencies (TTFT, TPOT, ITL, E2E) are recomputed exactly as ``metrics.compute_metrics``.
Throughputs need the cell's wall time, which a resample does not have: a resample's
wall time is its requests' summed wall time divided by the cell's observed mean
concurrency (so the full sample gives back ``tokens / wall``).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpudoctor import fsio
from gpudoctor.bench.request_record import RequestRecord
from gpudoctor.bench.results.metrics import percentile, request_itls_s, request_tpot_s

RESAMPLES = 1000
# Below this many successful requests on a side, a bootstrap interval says nothing (one
# request resamples to itself: the interval collapses onto the ratio and any difference
# would look real). The H200 campaign's c=1 cells (one request each) showed it.
MIN_REQUESTS = 5
BOOTSTRAPPED = (
    "output_throughput",
    "request_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "mean_e2e_ms",
)


@dataclass(frozen=True)
class Sample:
    """One cell's per-request values, ready to resample.

    Attributes:
        ok: per request: it succeeded.
        tokens: output tokens (0 for a failure).
        wall_s: per request: send -> over (seconds).
        ttft_ms, tpot_ms, e2e_ms: per request (None when not defined).
        itl_sum_ms, itl_count: per request: summed ITL values and how many.
        concurrency: the cell's observed mean concurrency (sum of wall_s / cell wall).
    """

    ok: tuple[bool, ...]
    tokens: tuple[int, ...]
    wall_s: tuple[float, ...]
    ttft_ms: tuple[float | None, ...]
    tpot_ms: tuple[float | None, ...]
    e2e_ms: tuple[float | None, ...]
    itl_sum_ms: tuple[float, ...]
    itl_count: tuple[int, ...]
    concurrency: float

    @property
    def size(self) -> int:
        """Return the number of requests."""
        return len(self.ok)


def sample_of(records: Sequence[RequestRecord], duration_s: float) -> Sample | None:
    """Return the resampling view of a cell's records (None without records or wall time,
    the cell's or its requests': a cell of unsent requests has no concurrency to scale by)."""
    if not records or duration_s <= 0:
        return None
    walls = [r.wall_s if r.wall_s is not None else (r.e2e_s or 0.0) for r in records]
    if math.fsum(walls) <= 0:
        return None
    itls = [request_itls_s(r) if r.ok else [] for r in records]
    tpots = [request_tpot_s(r) for r in records]
    return Sample(
        ok=tuple(r.ok for r in records),
        tokens=tuple(r.output_tokens if r.ok else 0 for r in records),
        wall_s=tuple(walls),
        ttft_ms=tuple(r.ttft_s * 1000 if r.ok and r.ttft_s is not None else None for r in records),
        tpot_ms=tuple(t * 1000 if t is not None else None for t in tpots),
        e2e_ms=tuple(r.e2e_s * 1000 if r.ok and r.e2e_s is not None else None for r in records),
        itl_sum_ms=tuple(math.fsum(i) * 1000 for i in itls),
        itl_count=tuple(len(i) for i in itls),
        concurrency=math.fsum(walls) / duration_s,
    )


def _mean(values: list[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def statistics(sample: Sample, index: Sequence[int]) -> dict[str, float | None]:
    """Return every ``BOOTSTRAPPED`` metric computed on the requests ``index`` of ``sample``."""
    wall = math.fsum(sample.wall_s[i] for i in index) / sample.concurrency
    ok = [i for i in index if sample.ok[i]]
    ttft = [v for i in ok if (v := sample.ttft_ms[i]) is not None]
    tpot = [v for i in ok if (v := sample.tpot_ms[i]) is not None]
    e2e = [v for i in ok if (v := sample.e2e_ms[i]) is not None]
    itl_n = sum(sample.itl_count[i] for i in ok)
    return {
        "output_throughput": sum(sample.tokens[i] for i in ok) / wall if wall > 0 else None,
        "request_throughput": len(ok) / wall if wall > 0 else None,
        "mean_ttft_ms": _mean(ttft),
        "median_ttft_ms": percentile(ttft, 50) if ttft else None,
        "p99_ttft_ms": percentile(ttft, 99) if ttft else None,
        "mean_tpot_ms": _mean(tpot),
        "median_tpot_ms": percentile(tpot, 50) if tpot else None,
        "p99_tpot_ms": percentile(tpot, 99) if tpot else None,
        "mean_itl_ms": math.fsum(sample.itl_sum_ms[i] for i in ok) / itl_n if itl_n else None,
        "mean_e2e_ms": _mean(e2e),
    }


def ratio_intervals(
    a: Sample, b: Sample, resamples: int = RESAMPLES, seed: int = 0
) -> dict[str, tuple[float, float] | None]:
    """Return, per ``BOOTSTRAPPED`` metric, the 95 % bootstrap interval of B / A
    (None when a resample lacks the metric or A's value is 0, and for every metric when
    a side has fewer than ``MIN_REQUESTS`` successful requests: failed ones carry no
    latency, and a lone success resamples to itself)."""
    if min(sum(a.ok), sum(b.ok)) < MIN_REQUESTS:
        return {m: None for m in BOOTSTRAPPED}
    rng = random.Random(seed)
    ratios: dict[str, list[float]] = {m: [] for m in BOOTSTRAPPED}
    broken: set[str] = set()
    for _ in range(resamples):
        sa = statistics(a, [rng.randrange(a.size) for _ in range(a.size)])
        sb = statistics(b, [rng.randrange(b.size) for _ in range(b.size)])
        for metric in BOOTSTRAPPED:
            va, vb = sa[metric], sb[metric]
            if va is None or vb is None or va == 0:
                broken.add(metric)
            elif metric not in broken:
                ratios[metric].append(vb / va)
    return {
        m: None if m in broken else (percentile(v, 2.5), percentile(v, 97.5))
        for m, v in ratios.items()
    }


def load_sample(
    run_dir: Path, raw: str | None, run_id: str | None, duration_s: float | None
) -> Sample | None:
    """Return the Sample of one cell from ``run_dir/raw`` (None when the raw file is gone).

    Only lines of the measurement's own ``run_id`` count (an interrupted earlier attempt
    may have left lines); unreadable lines are skipped."""
    if not raw or not duration_s:
        return None
    parts = Path(raw).parts
    if len(parts) != 2 or parts[0] != "raw" or parts[1] in ("..", "."):
        return None  # a record naming a file outside DIR/raw/ (../../etc/shadow) is not read
    path = Path(run_dir) / raw
    try:  # never through a symlink planted in the run directory
        lines = fsio.read_regular(path).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    records = []
    for line in lines:
        try:
            row = json.loads(line)
            if run_id is None or row.get("run_id") == run_id:
                records.append(RequestRecord.from_json(row))
        except (ValueError, TypeError, AttributeError):
            continue
    return sample_of(records, float(duration_s))
