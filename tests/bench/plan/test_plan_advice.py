"""What a valid plan may not measure as its author expects (issue 34.8), read from the
plan itself: one warning per configuration whose concurrency exceeds the prompts a cell
sends, naming those concurrencies and the fix; none when each cell's prompts follow its
concurrency (``prompts_per_concurrency``)."""

from __future__ import annotations

from gpudoctor.bench.plan import parse_plan
from gpudoctor.bench.plan.advice import plan_warnings

PLAN = """\
[model]
path = "/models/m"
[engine]
name = "vllm"
[axes]
tp = [1, 2]
concurrency = {concurrency}
[workload]
num_prompts = 8
{extra}
"""


def _warnings(concurrency: str, extra: str = "") -> list[str]:
    return plan_warnings(parse_plan(PLAN.format(concurrency=concurrency, extra=extra)))


def test_a_concurrency_above_num_prompts_is_warned_per_configuration() -> None:
    assert _warnings("{ 1 = [4, 16, 9, 8], 2 = [8] }") == [
        "default@tp1: concurrency 9, 16 is more than the 8 prompts a cell sends (num_prompts):"
        " at most 8 requests are ever in flight there; raise num_prompts or set"
        " prompts_per_concurrency in [workload]"
    ]  # 8 prompts at concurrency 8: all in flight, no warning
    both = _warnings("[64]")
    assert [line.split(":")[0] for line in both] == ["default@tp1", "default@tp2"]
    assert all("concurrency 64 is more than the 8 prompts" in line for line in both)


def test_no_warning_when_every_cell_fills_its_concurrency() -> None:
    assert _warnings("[1, 8]") == []
    assert _warnings("[64, 4096]", "prompts_per_concurrency = 2") == []
