"""`repeats = N`: the repeats of a cell read as one row (status "ok 2/3", the mean and
spread of the measured repeats), which `bench compare`, the closing table and report.html
show."""

from __future__ import annotations

import statistics

from gpudoctor.bench.results.reader import CellResult
from gpudoctor.bench.results.repeats import RepeatGroup, Spread, group_cells, spread


def _cell(key: str, repeat: int = 0, group: str = "", status: str = "ok", **metrics) -> CellResult:
    return CellResult(key=key, config="c", tp=1, concurrency=1, status=status,
                      measurement={"metrics": metrics} if status == "ok" else None,
                      repeat=repeat, group=group)  # fmt: skip


def test_the_spread_of_repeats_is_their_mean_sample_std_and_relative_std() -> None:
    s = spread([10.0, 20.0, 30.0])
    assert s == Spread((10.0, 20.0, 30.0), 20.0, 10.0, 0.5)
    assert (s.low, s.high) == (10.0, 30.0)
    assert spread([3.0, 1.0, 2.0]).low == 1.0 and spread([3.0, 1.0, 2.0]).high == 3.0


def test_one_repeat_has_no_spread_and_a_zero_mean_no_relative_std() -> None:
    assert spread([7.0]) == Spread((7.0,), 7.0, 0.0, 0.0)
    assert spread([-1.0, 1.0]) == Spread((-1.0, 1.0), 0.0, statistics.stdev([-1.0, 1.0]), None)
    assert spread([]) is None


def test_the_mean_is_exact_over_many_values() -> None:
    assert spread([0.1] * 10).mean == 0.1  # math.fsum: no drift from adding ten 0.1s


def test_cells_group_by_their_group_in_first_seen_order_with_repeats_sorted() -> None:
    cells = [_cell("b#2", 2, "b"), _cell("a"), _cell("b#0", 0, "b"), _cell("b#1", 1, "b"),
             _cell("c", group="")]  # fmt: skip
    groups = group_cells(cells)
    assert [g.group for g in groups] == ["b", "a", "c"]
    assert [c.key for c in groups[0].cells] == ["b#0", "b#1", "b#2"]
    assert groups[0].first.key == "b#0" and groups[1].first.key == "a"


def test_a_group_s_status_and_spread_count_only_measured_repeats() -> None:
    group = RepeatGroup("k", (_cell("k#0", 0, "k", status="crashed"),
                              _cell("k#1", 1, "k", x=4.0), _cell("k#2", 2, "k", x=6.0),
                              _cell("k#3", 3, "k", y=1.0)))  # fmt: skip
    assert group.status() == "ok 3/4"
    assert [c.key for c in group.measured] == ["k#1", "k#2", "k#3"]
    assert group.spread("x") == spread([4.0, 6.0])
    assert group.spread("missing") is None


def test_a_group_of_one_status_reads_that_status() -> None:
    assert RepeatGroup("k", (_cell("k"),)).status() == "ok"
    crashed = RepeatGroup("k", (_cell("k#0", 0, "k", "crashed"), _cell("k#1", 1, "k", "crashed")))
    assert crashed.status() == "crashed" and crashed.measured == ()
    mixed = RepeatGroup("k", (_cell("k#0", 0, "k", "crashed"), _cell("k#1", 1, "k", "skipped")))
    assert mixed.status() == "ok 0/2"
