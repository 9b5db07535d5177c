"""The SLO search's bounds as a plan's author reads them: ``tolerance`` is how close the
passing and failing loads may end up (a bracket exactly that wide is done: no further
probe), and it must be positive (0 would mean "never close enough")."""

from __future__ import annotations

import pytest

from gpudoctor.bench.plan import PlanError, SearchSpec, parse_plan
from gpudoctor.bench.plan.search import Bisection

PLAN = """\
[model]
path = "/models/m"
[engine]
name = "vllm"
[axes]
concurrency = [4]
[search]
over = "request_rate"
slo = {{ ttft_ms = 200 }}
low = 2
high = 10
tolerance = {tolerance}
"""


def test_a_bracket_exactly_as_wide_as_the_tolerance_ends_the_search() -> None:
    search = Bisection(SearchSpec("request_rate", {"ttft_ms": 200.0}, 0.95, 2.0, 10.0, 4.0))
    verdicts = {2.0: True, 10.0: False, 6.0: False}  # the server meets the SLO up to ~5 req/s
    probes = []
    while (load := search.next_probe()) is not None:
        probes.append(load)
        search.record(load, verdicts[load])
    assert probes == [2.0, 10.0, 6.0]  # met 2, failed 6: 4 apart = the tolerance, done
    result = search.result()
    assert (result.met, result.failed) == (2.0, 6.0)


@pytest.mark.parametrize("tolerance", ["0", "-1"])
def test_a_tolerance_that_is_not_positive_is_refused(tolerance: str) -> None:
    with pytest.raises(PlanError, match="tolerance"):
        parse_plan(PLAN.format(tolerance=tolerance))
    assert parse_plan(PLAN.format(tolerance="0.5")).search is not None
