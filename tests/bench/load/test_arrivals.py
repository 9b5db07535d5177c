"""gpudoctor/bench/load/arrivals.py: when each request of an open-loop cell is sent
(bench_serving's ``--request-rate`` / ``--burstiness``): seeded, with the mean gap 1 / rate
whatever the burstiness, and the same times for the same seed (a plan run again sends at
the times it sent before)."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest

from gpudoctor.bench.load.arrivals import INF, arrival_offsets, interval_s


def gaps(offsets: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(offsets)]


def test_the_first_request_goes_at_once_and_the_others_after_growing_offsets():
    offsets = arrival_offsets(50, 10.0, seed=3)
    assert len(offsets) == 50 and offsets[0] == 0.0
    assert all(g > 0 for g in gaps(offsets))
    assert arrival_offsets(0, 10.0) == []
    assert arrival_offsets(1, 10.0) == [0.0]


def test_an_infinite_rate_sends_every_request_at_once():
    assert arrival_offsets(4, INF, burstiness=0.5) == [0.0, 0.0, 0.0, 0.0]
    assert interval_s(random.Random(0), float("inf"), burstiness=-1) == 0.0


@pytest.mark.parametrize("burstiness", [1.0, 0.25, 4.0])
def test_the_mean_gap_is_one_over_the_rate_whatever_the_burstiness(burstiness):
    g = gaps(arrival_offsets(20001, 8.0, burstiness, seed=11))
    assert statistics.fmean(g) == pytest.approx(1 / 8.0, rel=0.05)


@pytest.mark.parametrize(("burstiness", "cv"), [(1.0, 1.0), (0.25, 2.0), (4.0, 0.5)])
def test_burstiness_sets_how_uneven_the_gaps_are(burstiness, cv):
    """A gamma gap of shape b has a coefficient of variation 1 / sqrt(b): 1 for Poisson
    arrivals, larger (bursts) below 1, smaller (steadier) above."""
    g = gaps(arrival_offsets(20001, 8.0, burstiness, seed=5))
    assert statistics.pstdev(g) / statistics.fmean(g) == pytest.approx(cv, rel=0.06)


def test_the_same_seed_gives_the_same_times_and_another_seed_others():
    assert arrival_offsets(20, 4.0, 0.5, seed=9) == arrival_offsets(20, 4.0, 0.5, seed=9)
    assert arrival_offsets(20, 4.0, 0.5, seed=9) != arrival_offsets(20, 4.0, 0.5, seed=10)
    assert arrival_offsets(5, 4.0) == arrival_offsets(5, 4.0, 1.0, 0)  # the defaults


@pytest.mark.parametrize(
    ("burstiness", "recorded"),
    [
        (1.0, [0.0, 0.097828711, 0.138708325, 0.40183223, 0.420630678]),
        (0.5, [0.0, 0.073497195, 0.370461144, 0.571725808, 0.574083403]),
    ],
)
def test_a_plan_run_again_sends_at_the_recorded_times(burstiness, recorded):
    """The offsets of seed 7 at 4 requests/s as this version draws them: a change of the
    draw would make a re-run of a recorded plan a different experiment."""
    assert arrival_offsets(5, 4.0, burstiness, seed=7) == pytest.approx(recorded, abs=1e-9)


@pytest.mark.parametrize(("rate", "burstiness"), [(0.0, 1.0), (-2.0, 1.0), (1.0, 0.0), (1.0, -1.0)])
def test_a_rate_or_burstiness_not_above_zero_is_refused(rate, burstiness):
    with pytest.raises(ValueError) as info:
        interval_s(random.Random(0), rate, burstiness)
    assert str(info.value) == (f"rate and burstiness must be > 0, got {rate} and {burstiness}")


def test_a_rate_below_one_request_per_second_is_accepted():
    assert statistics.fmean(gaps(arrival_offsets(4001, 0.5, seed=2))) == pytest.approx(
        2.0, rel=0.06
    )


def test_one_gap_without_a_burstiness_is_a_poisson_gap():
    assert interval_s(random.Random(7), 4.0) == pytest.approx(0.097828711, abs=1e-9)
