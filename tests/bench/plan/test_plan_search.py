"""The ``[search]`` block as a plan's author writes it, and the bisection it drives.

The author relies on: each bad key refused with one line naming the file, line and key;
the defaults (``over = "request_rate"``, goodput 0.95, low 1, tolerance a sixteenth of
the range, 1 for a concurrency search); and the bisection's answer: the highest load
that met the SLO and the lowest that did not, probes in the order they ran, integer
concurrencies, rates at 4 significant digits, a crashed probe ending the search.
"""

from __future__ import annotations

import pytest

from gpudoctor.bench.cell_spec import SLO
from gpudoctor.bench.plan import PlanError, SearchSpec, parse_plan
from gpudoctor.bench.plan.search import Bisection, SearchResult, passes

# lines 1-4; a [search] block appended after it starts on line 5, its first key on line 6
HEAD = '[model]\npath = "/models/m"\n[engine]\nname = "vllm"\n'
SLO_LINE = "slo = { ttft_ms = 200 }\n"


def _plan(search: str, before: str = "") -> str:
    return HEAD + before + "[search]\n" + search


def _error(text: str) -> str:
    with pytest.raises(PlanError) as info:
        parse_plan(text, "plan.toml")
    return str(info.value)


@pytest.mark.parametrize(
    ("search", "message"),
    [
        ("bogus = 1\n", "plan.toml:6: search.bogus: unknown key (allowed: goodput, high, low, over, slo, tolerance)"),
        ("over = 1\n", "plan.toml:6: search.over: expected a string, got 1"),
        ('over = "tokens"\n', "plan.toml:6: search.over: expected request_rate or concurrency, got 'tokens'"),
        ("slo = 5\n", "plan.toml:6: search.slo: expected a table, got int"),
        ("slo = { ttft = 1 }\n", "plan.toml:6: search.slo.ttft: unknown key (allowed: e2el_ms, tpot_ms, ttft_ms)"),
        ('slo = { ttft_ms = "fast" }\n', "plan.toml:6: search.slo.ttft_ms: expected an integer or a number, got 'fast'"),
        ("slo = { tpot_ms = 0 }\n", "plan.toml:6: search.slo.tpot_ms: must be > 0, got 0"),
        ("high = 8\n", "plan.toml:5: search.slo: missing: a search needs an SLO (search.slo or [slo])"),
        (SLO_LINE + 'goodput = "most"\nhigh = 8\n', "plan.toml:7: search.goodput: expected an integer or a number, got 'most'"),
        (SLO_LINE + "goodput = 0\nhigh = 8\n", "plan.toml:7: search.goodput: must be in (0, 1], got 0"),
        (SLO_LINE + "goodput = 1.5\nhigh = 8\n", "plan.toml:7: search.goodput: must be in (0, 1], got 1.5"),
        (SLO_LINE + 'low = "x"\nhigh = 8\n', "plan.toml:7: search.low: expected an integer or a number, got 'x'"),
        (SLO_LINE, "plan.toml:5: search.high: missing: the highest load to try"),
        (SLO_LINE + 'high = "x"\n', "plan.toml:7: search.high: expected an integer or a number, got 'x'"),
        (SLO_LINE + 'high = 8\ntolerance = "x"\n', "plan.toml:8: search.tolerance: expected an integer or a number, got 'x'"),
        (SLO_LINE + "low = 0\nhigh = 8\n", "plan.toml:5: search: expected 0 < low < high, got low = 0, high = 8"),
        (SLO_LINE + "low = 8\nhigh = 8\n", "plan.toml:5: search: expected 0 < low < high, got low = 8, high = 8"),
        (SLO_LINE + "high = 0.5\n", "plan.toml:5: search: expected 0 < low < high, got low = 1, high = 0.5"),
        (SLO_LINE + "high = 8\ntolerance = 0\n", "plan.toml:8: search.tolerance: must be > 0, got 0.0"),
        (SLO_LINE + "high = 8\ntolerance = -1\n", "plan.toml:8: search.tolerance: must be > 0, got -1.0"),
        (SLO_LINE + "high = 8\ntolerance = nan\n", "plan.toml:8: search.tolerance: must be a finite number, got nan"),
        (SLO_LINE + 'over = "concurrency"\nhigh = 8\ntolerance = nan\n', "plan.toml:9: search.tolerance: must be a finite number, got nan"),
        (SLO_LINE + 'over = "concurrency"\nhigh = 8\ntolerance = inf\n', "plan.toml:9: search.tolerance: must be a finite number, got inf"),
        (SLO_LINE + 'over = "concurrency"\nlow = 1.5\nhigh = 8\n', "plan.toml:5: search: low and high of a concurrency search must be integers"),
        (SLO_LINE + 'over = "concurrency"\nlow = 1\nhigh = 8.0\n', "plan.toml:5: search: low and high of a concurrency search must be integers"),
    ],
)  # fmt: skip
def test_a_bad_search_key_is_one_line_naming_file_line_and_key(search: str, message: str) -> None:
    assert _error(_plan(search)) == message


def test_a_rate_search_cannot_also_sweep_the_rate_axis() -> None:
    axes = "[axes]\nrequest_rate = [1, 2]\n"  # lines 5-6; [search] on 7
    assert _error(_plan(SLO_LINE + "high = 8\n", axes)) == (
        "plan.toml:7: search.over: a request_rate search replaces the request_rate axis"
    )
    written = _plan('over = "request_rate"\n' + SLO_LINE + "high = 8\n", axes)
    assert _error(written).startswith("plan.toml:8: search.over: ")
    one_rate = _plan(SLO_LINE + "high = 8\n", "[axes]\nrequest_rate = [1]\n")
    assert parse_plan(one_rate).search is not None  # a single rate is no axis to replace
    concurrency = _plan(SLO_LINE + 'over = "concurrency"\nhigh = 8\n', axes)
    assert parse_plan(concurrency).search.over == "concurrency"


def test_the_defaults_of_a_search() -> None:
    spec = parse_plan(_plan(SLO_LINE + "high = 9\n")).search
    assert spec == SearchSpec("request_rate", SLO(ttft_ms=200.0), 0.95, 1.0, 9.0, 0.5)
    assert all(isinstance(v, float) for v in (spec.goodput, spec.low, spec.high, spec.tolerance))
    conc = parse_plan(_plan(SLO_LINE + 'over = "concurrency"\nhigh = 64\n')).search
    assert conc == SearchSpec("concurrency", SLO(ttft_ms=200.0), 0.95, 1.0, 64.0, 1.0)


def test_the_values_a_search_is_given() -> None:
    text = _plan('over = "request_rate"\nslo = { e2el_ms = 900, tpot_ms = 25.5 }\n'
                 "goodput = 1\nlow = 1\nhigh = 3\ntolerance = 0.25\n")  # fmt: skip
    spec = parse_plan(text).search
    assert spec == SearchSpec("request_rate", SLO(tpot_ms=25.5, e2el_ms=900.0), 1.0, 1.0, 3.0, 0.25)
    assert isinstance(spec.slo.e2el_ms, float) and isinstance(spec.goodput, float)
    conc = _plan(SLO_LINE + 'over = "concurrency"\nlow = 2\nhigh = 64\ntolerance = 3.9\n')
    assert parse_plan(conc).search.tolerance == 3.0  # whole requests
    for tolerance in ("0", "-2"):  # a concurrency search never probes closer than 1
        zero = _plan(SLO_LINE + f'over = "concurrency"\nhigh = 64\ntolerance = {tolerance}\n')
        assert parse_plan(zero).search.tolerance == 1.0


def test_the_plan_slo_serves_a_search_without_its_own() -> None:
    text = _plan("high = 8\n", "[slo]\nttft_ms = 300\n")
    plan = parse_plan(text)
    assert plan.search.slo is None  # the plan's [slo] applies (Plan.probe)
    assert plan.slo == SLO(ttft_ms=300.0)
    assert parse_plan(HEAD).search is None
    assert parse_plan(HEAD + "[search]\n").search is None  # an empty table: no search


def _run(spec: SearchSpec, meets: object) -> tuple[list[float], SearchResult]:
    """Drive a bisection against a server that meets the SLO when ``meets(load)``."""
    search = Bisection(spec)
    probes = []
    while (load := search.next_probe()) is not None:
        probes.append(load)
        search.record(load, meets(load))  # type: ignore[operator]
        assert len(probes) < 50
    return probes, search.result()


def test_a_rate_search_brackets_the_highest_rate_that_meets_the_slo() -> None:
    spec = SearchSpec("request_rate", SLO(ttft_ms=200.0), 0.95, 1.0, 10.0, 1.0)
    probes, result = _run(spec, lambda load: load <= 4.2)
    assert probes == [1.0, 10.0, 5.5, 3.25, 4.375, 3.812]  # 3.8125 to 4 digits
    assert result == SearchResult(
        3.812, 4.375,
        ((1.0, True), (10.0, False), (5.5, False), (3.25, True), (4.375, False), (3.812, True)),
    )  # fmt: skip
    fine = SearchSpec("request_rate", None, 0.95, 1.0, 2.0, 0.001)
    probes, result = _run(fine, lambda load: load <= 1.9)
    assert probes[:5] == [1.0, 2.0, 1.5, 1.75, 1.875]
    assert probes[5] == 1.938  # 1.9375 kept to 4 significant digits
    assert (result.met, result.failed) == (1.9, 1.901)  # rounding ends it, not the tolerance
    assert all(float(f"{p:.4g}") == p for p in probes)


def test_a_concurrency_search_probes_whole_requests() -> None:
    spec = SearchSpec("concurrency", None, 0.95, 1.0, 10.0, 1.0)
    probes, result = _run(spec, lambda load: load <= 6)
    assert probes == [1.0, 10.0, 5.0, 7.0, 6.0]
    assert (result.met, result.failed, result.status) == (6.0, 7.0, "done")
    assert all(isinstance(p, float) and p == int(p) for p in probes)
    # a bracket of adjacent integers is done even under a tolerance below 1
    tight = SearchSpec("concurrency", None, 0.95, 1.0, 2.0, 0.5)
    assert _run(tight, lambda load: load <= 1)[0] == [1.0, 2.0]


def test_a_search_that_fails_at_low_or_passes_at_high_stops_at_once() -> None:
    spec = SearchSpec("request_rate", None, 0.95, 2.0, 8.0, 0.5)
    probes, result = _run(spec, lambda load: False)
    assert (probes, result) == ([2.0], SearchResult(None, 2.0, ((2.0, False),), "done"))
    probes, result = _run(spec, lambda load: True)
    assert probes == [2.0, 8.0]
    assert result == SearchResult(8.0, None, ((2.0, True), (8.0, True)), "done")


def test_a_probe_that_could_not_be_measured_ends_the_search() -> None:
    spec = SearchSpec("request_rate", None, 0.95, 2.0, 10.0, 0.5)
    search = Bisection(spec)
    for load, passed in ((2.0, True), (10.0, False)):
        assert search.next_probe() == load
        search.record(load, passed)
    assert search.next_probe() == 6.0
    search.record(6.0, None)  # the server crashed at 6 req/s
    assert search.next_probe() is None
    result = search.result("crashed")
    assert result == SearchResult(2.0, 10.0, ((2.0, True), (10.0, False), (6.0, None)), "crashed")
    first = Bisection(spec)
    first.record(2.0, None)  # not even low could be measured
    assert first.next_probe() is None
    assert first.result("skipped") == SearchResult(None, None, ((2.0, None),), "skipped")


@pytest.mark.parametrize(
    ("measurement", "goodput", "passed"),
    [
        ({"metrics": {"slo_attainment": 0.95}}, 0.95, True),  # exactly the goodput passes
        ({"metrics": {"slo_attainment": 1}}, 1.0, True),
        ({"metrics": {"slo_attainment": 0.9499}}, 0.95, False),
        ({"metrics": {"slo_attainment": None}}, 0.95, False),  # no SLO measured: no pass
        ({"metrics": {"slo_attainment": "0.99"}}, 0.95, False),
        ({"metrics": {}}, 0.95, False),
        ({"metrics": None}, 0.95, False),
        ({}, 0.95, False),
        (None, 0.95, False),
    ],
)
def test_a_probe_passes_when_enough_requests_met_the_slo(
    measurement: dict | None, goodput: float, passed: bool
) -> None:
    assert passes(measurement, goodput) is passed
