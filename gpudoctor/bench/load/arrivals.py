"""When each request of an open-loop cell is sent: seeded inter-arrival times.

As SGLang's / vLLM's ``bench_serving`` (``--request-rate``, ``--burstiness``): the gap
before the next request is drawn from a gamma distribution with shape ``burstiness``
and scale ``1 / (rate * burstiness)``, so its mean is ``1 / rate`` whatever the
burstiness; ``burstiness = 1`` is the exponential distribution (Poisson arrivals).
``rate = inf`` sends every request at once. A trace replay gives the offsets itself
(:mod:`gpudoctor.bench.load.workloads.trace`).
"""

from __future__ import annotations

import math
import random

from gpudoctor.bench.cell_spec import INF

__all__ = ["INF", "arrival_offsets", "interval_s"]


def interval_s(rng: random.Random, rate: float, burstiness: float = 1.0) -> float:
    """Return one inter-arrival gap in seconds: gamma(shape=burstiness,
    scale=1/(rate*burstiness)); 0 when ``rate`` is infinite."""
    if math.isinf(rate):
        return 0.0
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"rate and burstiness must be > 0, got {rate} and {burstiness}")
    if burstiness == 1.0:
        return rng.expovariate(rate)
    return rng.gammavariate(burstiness, 1.0 / (rate * burstiness))


def arrival_offsets(count: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Return the send time of each of ``count`` requests, seconds after the first
    (the first at 0, then cumulative gaps of :func:`interval_s`); same seed, same times."""
    rng = random.Random(seed)
    offsets, t = [], 0.0
    for _ in range(count):
        offsets.append(t)
        t += interval_s(rng, rate, burstiness)
    return offsets
