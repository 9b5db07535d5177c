"""The sane range of every number a plan holds (issue 26.9), checked when the plan is read,
so ``--dry-run --no-validate`` refuses what a run would refuse.

A value outside its range is an error naming the file, line and key (``concurrency =
[1e30]``, ``request_timeout_s = inf``, ``nan``): no engine serves 10^30 concurrent
requests, and a deadline of ``inf`` is no deadline.
"""

from __future__ import annotations

import math

DAY_S = 86400.0
# key (the last part of the TOML path, or the path) -> (lowest, highest, low is exclusive)
BOUNDS: dict[str, tuple[float, float, bool]] = {
    "tp": (1, 256, False),
    "concurrency": (1, 65536, False),
    "input_len": (1, 10_000_000, False),
    "output_len": (1, 10_000_000, False),
    "num_prompts": (1, 10_000_000, False),
    "prompts_per_concurrency": (1, 1_000_000, False),
    "warmup": (0, 1_000_000, False),
    "seed": (0, 2**63 - 1, False),
    "request_rate": (0, math.inf, True),  # inf: every request at once (bench_serving's inf)
    "startup_timeout_s": (0, 7 * DAY_S, True),
    "stop_timeout_s": (0, DAY_S, True),
    "request_timeout_s": (0, 7 * DAY_S, True),
    "cell_timeout_s": (0, 30 * DAY_S, True),
    "template_overhead": (0, 1_000_000, False),
    "min_input_len": (1, 10_000_000, False),
    "expect_gpus": (1, 4096, False),
    "ttft_ms": (0, 1000 * DAY_S, True),
    "tpot_ms": (0, 1000 * DAY_S, True),
    "e2el_ms": (0, 1000 * DAY_S, True),
}


def out_of_bounds(key: str, value: float) -> str | None:
    """Return why ``value`` is not a sane ``key`` (``must be at most 65536, got 10**30``),
    or None when it is (or ``key`` has no bounds)."""
    if key not in BOUNDS:
        return None
    low, high, exclusive = BOUNDS[key]
    if value != value:  # nan
        return f"must be a number between {_shown(low)} and {_shown(high)}, got nan"
    if (value <= low) if exclusive else (value < low):
        return f"must be {'>' if exclusive else 'at least'} {_shown(low)}, got {_shown(value)}"
    if value > high:
        return f"must be at most {_shown(high)}, got {_shown(value)}"
    return None


def _shown(number: float) -> str:
    if isinstance(number, float) and number.is_integer() and abs(number) < 1e16:
        return str(int(number))
    if isinstance(number, int) and abs(number) >= 10**16:
        return f"{number:.3g}"
    return f"{number:g}" if isinstance(number, float) else str(number)
