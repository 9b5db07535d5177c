"""The report's three plots as a reader sees them, read back from the matplotlib figures
drawn for a real results.jsonl in tmp_path (no PNG decoded): which series, which points in
which order, axis names and scales, the p50/p99 styles, the legend, the ``c=N`` marks; then
the PNG files themselves, and no figure left open. test_report.py draws the plots of a
measured run end to end."""

from __future__ import annotations

import json
import os
import struct
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpudoctor.bench.results.reader import read_run
from gpudoctor.bench.results.report import PLOT_FILES, figures, write_plots

matplotlib = pytest.importorskip("matplotlib")
plt = pytest.importorskip("matplotlib.pyplot")
colors = pytest.importorskip("matplotlib.colors")


def _row(config: str, tp: int, c: int, status: str = "ok", **metrics: float) -> dict:
    key = f"{config}/tp{tp}/c{c}"
    return {"key": key, "config": config, "tp": tp, "concurrency": c, "status": status,
            "measurement": {"metrics": metrics} if status == "ok" else None}  # fmt: skip


def _numbers(c: int) -> dict[str, float]:
    """A cell's numbers, each telling its concurrency apart: throughput 100*c, TTFT p50 c+1,
    p99 c+2, TPOT p50 c+3, p99 c+4 (ms)."""
    return {"output_throughput": 100.0 * c, "median_ttft_ms": c + 1.0, "p99_ttft_ms": c + 2.0,
            "median_tpot_ms": c + 3.0, "p99_tpot_ms": c + 4.0}  # fmt: skip


def _run(tmp_path: Path, rows: list[dict]) -> Path:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


@pytest.fixture
def drawn(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The figures of a run: config a at TP1 measured at c=4, 1, 2 (in that file order; c=2
    has no TPOT), failed at c=16; config b at TP2 at c=8; config a again at TP2 at c=1."""
    no_tpot = {k: v for k, v in _numbers(2).items() if "tpot" not in k}
    run = _run(tmp_path, [
        _row("a", 1, 4, **_numbers(4)), _row("a", 1, 1, **_numbers(1)),
        _row("b", 2, 8, **_numbers(8)), _row("a", 1, 2, **no_tpot),
        _row("a", 1, 16, status="failed"), _row("a", 2, 1, **_numbers(1)),
    ])  # fmt: skip
    made = figures(read_run(run).cells)
    try:
        yield made
    finally:
        for fig in made.values():
            plt.close(fig)


def _lines(ax: Any) -> list[tuple[str | None, list[float], list[float]]]:
    """Return each line of ``ax`` as (its legend label, None for none; xs; ys)."""
    return [(None if line.get_label().startswith("_") else line.get_label(),
             list(line.get_xdata()), list(line.get_ydata()))
            for line in ax.get_lines()]  # fmt: skip


def _legend(ax: Any) -> list[str]:
    legend = ax.get_legend()
    return [] if legend is None else [text.get_text() for text in legend.get_texts()]


def test_throughput_is_one_line_per_config_and_tp_by_concurrency(drawn: dict) -> None:
    assert list(drawn) == list(PLOT_FILES)
    (ax,) = drawn["throughput"].get_axes()
    assert _lines(ax) == [  # series in order of their lowest concurrency; the failed c=16 out
        ("a (TP1)", [1, 2, 4], [100.0, 200.0, 400.0]),
        ("a (TP2)", [1], [100.0]),
        ("b (TP2)", [8], [800.0]),
    ]
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == (
        "concurrency", "output tokens/s", "Output throughput")  # fmt: skip
    assert ax.get_xscale() == "log"
    assert ax.xaxis.get_transform().base == 2  # ticks at 1, 2, 4, 8: concurrencies
    assert _legend(ax) == ["a (TP1)", "a (TP2)", "b (TP2)"]
    assert {line.get_marker() for line in ax.get_lines()} == {"o"}  # a lone point is seen


def test_latency_shows_p50_solid_and_p99_dashed_in_one_colour_per_series(drawn: dict) -> None:
    ttft, tpot = drawn["latency"].get_axes()
    left, right = ttft.get_position(), tpot.get_position()
    assert left.x1 < right.x0 and left.y0 == right.y0  # side by side
    assert _lines(ttft) == [
        ("a (TP1)", [1, 2, 4], [2.0, 3.0, 5.0]), (None, [1, 2, 4], [3.0, 4.0, 6.0]),
        ("a (TP2)", [1], [2.0]), (None, [1], [3.0]),
        ("b (TP2)", [8], [9.0]), (None, [8], [10.0]),
    ]  # fmt: skip
    assert _lines(tpot) == [  # c=2 has no TPOT: no point, the line goes from c=1 to c=4
        ("a (TP1)", [1, 4], [4.0, 7.0]), (None, [1, 4], [5.0, 8.0]),
        ("a (TP2)", [1], [4.0]), (None, [1], [5.0]),
        ("b (TP2)", [8], [11.0]), (None, [8], [12.0]),
    ]  # fmt: skip
    for ax in (ttft, tpot):
        lines = ax.get_lines()
        assert [line.get_linestyle() for line in lines] == ["-", "--"] * 3
        shades = [colors.to_rgba(line.get_color()) for line in lines]
        assert shades == [colors.to_rgba(f"C{n}") for n in (0, 0, 1, 1, 2, 2)]
        assert {line.get_marker() for line in lines} == {"o"}
        assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
        assert ax.get_xlabel() == "concurrency"
    assert [(ax.get_ylabel(), ax.get_title()) for ax in (ttft, tpot)] == [
        ("TTFT ms", "TTFT p50 (—) / p99 (--)"), ("TPOT ms", "TPOT p50 (—) / p99 (--)")]  # fmt: skip
    assert _legend(ttft) == ["a (TP1)", "a (TP2)", "b (TP2)"]  # the p50 lines name the series
    assert _legend(tpot) == []


def test_the_pareto_view_marks_each_point_with_its_concurrency(drawn: dict) -> None:
    (ax,) = drawn["pareto"].get_axes()
    assert _lines(ax) == [  # c=2 has no TPOT: not placed
        ("a (TP1)", [4.0, 7.0], [100.0, 400.0]),
        ("a (TP2)", [4.0], [100.0]),
        ("b (TP2)", [11.0], [800.0]),
    ]
    marks = [(t.get_text(), tuple(t.xy), t.get_fontsize()) for t in ax.texts]
    assert marks == [("c=1", (4.0, 100.0), 7), ("c=4", (7.0, 400.0), 7),
                     ("c=1", (4.0, 100.0), 7), ("c=8", (11.0, 800.0), 7)]  # fmt: skip
    assert (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == (
        "median TPOT ms", "output tokens/s", "Throughput vs TPOT")  # fmt: skip
    assert ax.get_xscale() == "linear"
    assert {line.get_marker() for line in ax.get_lines()} == {"o"}
    assert _legend(ax) == ["a (TP1)", "a (TP2)", "b (TP2)"]
    assert ax.get_legend().get_texts()[0].get_fontsize() == 7


def test_colours_repeat_after_the_ten_of_the_cycle(tmp_path: Path) -> None:
    run = _run(tmp_path, [_row(f"cfg{n:02}", 1, n + 1, **_numbers(n + 1)) for n in range(12)])
    made = figures(read_run(run).cells)
    try:
        lines = made["latency"].get_axes()[0].get_lines()[::2]  # the p50 line of each series
        assert [colors.to_rgba(line.get_color()) for line in lines] == [
            colors.to_rgba(f"C{n}") for n in (*range(10), 0, 1)
        ]
    finally:
        for fig in made.values():
            plt.close(fig)


def test_a_run_with_nothing_measured_gives_empty_plots_without_a_legend(tmp_path: Path) -> None:
    run = _run(tmp_path, [_row("a", 1, 1, status="crashed")])
    made = figures(read_run(run).cells)
    try:
        axes = [ax for fig in made.values() for ax in fig.get_axes()]
        assert len(axes) == 4
        assert [(_lines(ax), _legend(ax)) for ax in axes] == [([], [])] * 4
    finally:
        for fig in made.values():
            plt.close(fig)


def test_the_plots_are_written_as_pngs_and_every_figure_is_closed(tmp_path: Path) -> None:
    """800 x 500 PNGs whatever matplotlibrc says, readable by all (an older one of mode 0600 too), a config named
    with an emoji drawn without a warning (a box where the font has no glyph), and only
    the report's own figures closed (the caller's stays open)."""
    run = _run(tmp_path, [_row("a 🚀", 1, 1, **_numbers(1))])
    out = tmp_path / "out"
    out.mkdir()
    (out / PLOT_FILES["pareto"]).write_bytes(b"old")
    (out / PLOT_FILES["pareto"]).chmod(0o600)
    callers = plt.figure()
    try:
        open_before = plt.get_fignums()
        settings = {"figure.dpi": 50, "figure.figsize": (3.0, 2.0)}  # a user's matplotlibrc
        with warnings.catch_warnings(), matplotlib.rc_context(settings):
            warnings.simplefilter("error")
            written = write_plots(read_run(run).cells, out)
        assert plt.get_fignums() == open_before
    finally:
        plt.close(callers)
    assert written == [out / name for name in PLOT_FILES.values()]
    for path in written:
        png = path.read_bytes()
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
        assert struct.unpack(">II", png[16:24]) == (800, 500)  # IHDR: width, height
        assert path.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in out.iterdir()) == sorted(PLOT_FILES.values())


def test_a_plot_that_cannot_be_written_leaves_no_figure_open(tmp_path: Path) -> None:
    run = _run(tmp_path, [_row("a", 1, 1, **_numbers(1))])
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "elsewhere.png").write_bytes(b"mine")
    os.symlink(tmp_path / "elsewhere.png", out / PLOT_FILES["latency"])
    open_before = plt.get_fignums()
    with pytest.raises(OSError, match=r"latency_vs_concurrency\.png"):
        write_plots(read_run(run).cells, out)
    assert (tmp_path / "elsewhere.png").read_bytes() == b"mine"  # never through a link
    assert plt.get_fignums() == open_before
