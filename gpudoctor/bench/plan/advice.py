"""What a valid plan may not measure as its author expects: said as warnings, never
refused (issue 34.8)."""

from __future__ import annotations

from gpudoctor.bench.plan_model import Plan


def plan_warnings(plan: Plan) -> list[str]:
    """Return one line per configuration whose concurrency exceeds the prompts a cell
    sends (``num_prompts``, fixed): such a cell never has more requests in flight than
    it has prompts, so it measures a lower concurrency than its label says."""
    workload = plan.workload
    if workload.prompts_per_concurrency is not None:
        return []
    lines = []
    for config in plan.configs:
        over = [c for c in config.concurrencies if c > workload.num_prompts]
        if over:
            lines.append(
                f"{config.label}: concurrency {', '.join(map(str, over))} is more than the"
                f" {workload.num_prompts} prompts a cell sends (num_prompts): at most"
                f" {workload.num_prompts} requests are ever in flight there; raise num_prompts"
                " or set prompts_per_concurrency in [workload]"
            )
    return lines
