"""A finished run's verdict (issue 45.2, 45.8, 45.9): exit 3 unless every cell it ran is a
result, each reason in one line with what to do; in-process, from Summary values."""

from __future__ import annotations

import pytest

from gpudoctor.bench.launch.run_verdict import RunFacts, verdict_lines
from gpudoctor.bench.launch.steps import Summary

FACTS = RunFacts("gpudoctor bench p.toml --out runs/x", "/home/u/q.toml")


def _summary(**counts: int) -> Summary:
    base = {"total": 4, "already_done": 0, "ok": 0, "crashed": 0, "skipped": 0, "server_starts": 1}
    extra = {k: counts.pop(k) for k in ("failed", "client_bound") if k in counts}
    return Summary(**{**base, **counts}, **extra)  # type: ignore[arg-type]


def test_a_run_of_results_only_says_nothing() -> None:
    assert verdict_lines(_summary(ok=4), FACTS) == []
    assert verdict_lines(_summary(ok=2, skipped=2), FACTS) == []  # a known quirk skipped
    assert verdict_lines(_summary(already_done=2, skipped=2), FACTS) == []  # resumed


def test_each_reason_is_named_with_what_to_do() -> None:
    facts = RunFacts(FACTS.rerun, FACTS.quirks, tuple(f"f{i}" for i in range(7)), 7,
                     tuple(f"c{i}" for i in range(6)))  # fmt: skip
    lines = verdict_lines(_summary(failed=7, crashed=6, client_bound=1), facts, shown=2)
    assert lines == [
        "gpudoctor: FAILED: f0",
        "gpudoctor: FAILED: f1",
        "gpudoctor: 7 cell(s) failed: their requests failed, their numbers are not results;"
        " fix the cause above, then: gpudoctor bench p.toml --out runs/x --retry-failed",
        "gpudoctor: CRASHED: c0",
        "gpudoctor: CRASHED: c1",
        "gpudoctor: 6 cell(s) crashed their server in this run (a crash is noted in the local"
        " quirks table /home/u/q.toml, and later runs skip it): fix the cause above, then:"
        " gpudoctor bench p.toml --out runs/x --retry-crashed",
        "gpudoctor: 1 cell(s) client-bound: the load generator did not send at the schedule's"
        " rate (the table's rate column says what it sent), so their numbers measure the"
        " client, not the server: lower the rate, or run the load from a less busy machine",
    ]
    assert len(verdict_lines(_summary(crashed=1), RunFacts("r", "q", crashed=("a",) * 9))) == 6


@pytest.mark.parametrize(
    "counts",
    [{"skipped": 4}, {"skipped": 1, "total": 1}],
)
def test_a_run_whose_every_cell_was_skipped_measured_nothing(counts: dict) -> None:
    [line] = verdict_lines(_summary(**counts), FACTS)
    assert line == (
        f"gpudoctor: nothing was measured: all {counts['skipped']} cell(s) were skipped (the"
        " reasons above name each quirk and its table); to run them anyway: gpudoctor bench"
        " p.toml --out runs/x --retry-crashed"
    )


@pytest.mark.parametrize("other", ["ok", "failed", "crashed", "client_bound", "already_done"])
def test_a_skip_beside_anything_measured_or_failed_is_not_nothing(other: str) -> None:
    lines = verdict_lines(_summary(skipped=2, **{other: 1}), RunFacts("r", "q", failed_count=0))
    assert not any("nothing was measured" in line for line in lines)
