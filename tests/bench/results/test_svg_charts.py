"""report.html's charts as the browser gets them: a valid SVG element whose dots sit where
their values put them on the axes, whose ticks read as round numbers, whose legend names
the solid series, and whose every label (from plans and result files someone else may
have written) is text, never markup. Parsed with the standard library's XML parser."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import pytest

from gpudoctor.bench.results.svg import COLORS, HEIGHT, WIDTH, Series, line_chart, pareto_front

NS = "{http://www.w3.org/2000/svg}"
LEFT, TOP, PLOT_W, PLOT_H = 64, 28, WIDTH - 64 - 16, HEIGHT - 28 - 44


def _parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{NS}svg"
    return root


def _all(root: ET.Element, tag: str) -> list[ET.Element]:
    return list(root.iter(f"{NS}{tag}"))


def _texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in _all(root, "text")]


def test_the_chart_element_has_its_size_title_and_class() -> None:
    root = _parse(line_chart("Throughput <b>", "c", "tok/s", [Series("a", ((1, 2, "h"),))]))
    tall = HEIGHT + 14 + 4  # one legend row below the plot
    assert root.attrib == {"class": "chart", "viewBox": f"0 0 {WIDTH} {tall}",
                           "width": str(WIDTH), "height": str(tall), "role": "img",
                           "aria-label": "Throughput <b>"}  # fmt: skip
    title = _all(root, "text")[0]
    assert title.text == "Throughput <b>"
    assert title.attrib == {"x": str(WIDTH / 2), "y": "16", "text-anchor": "middle",
                            "font-size": "13", "font-weight": "bold"}  # fmt: skip


def test_no_points_is_a_chart_saying_no_data() -> None:
    for series in ([], [Series("empty", ())]):
        root = _parse(line_chart("T", "x", "y", series))
        assert _texts(root) == ["T", "no data"]
        assert _all(root, "text")[1].attrib == {"x": str(WIDTH / 2), "y": str(HEIGHT / 2),
                                                "text-anchor": "middle", "fill": "#666"}  # fmt: skip
        assert _all(root, "circle") == [] and _all(root, "rect") == []


def _dots(root: ET.Element) -> list[tuple[float, float, str]]:
    return [(float(c.get("cx", "nan")), float(c.get("cy", "nan")),
             c.findtext(f"{NS}title") or "") for c in _all(root, "circle")
            if c.get("class") != "marked"]  # fmt: skip


def test_dots_sit_where_their_values_are_on_the_axes() -> None:
    series = [Series("a", ((0.0, 0.0, "c=0"), (10.0, 50.0, "c=10"), (20.0, 100.0, "c=20")))]
    root = _parse(line_chart("T", "concurrency", "tok/s", series))
    top = 100.0 * 1.05  # 5 % headroom over the highest value
    assert _dots(root) == [
        (LEFT, TOP + PLOT_H, "a: c=0"),
        (round(LEFT + PLOT_W / 2, 1), round(TOP + PLOT_H - 50 / top * PLOT_H, 1), "a: c=10"),
        (LEFT + PLOT_W, round(TOP + PLOT_H - 100 / top * PLOT_H, 1), "a: c=20"),
    ]
    (line,) = [p for p in _all(root, "polyline")]
    assert line.get("points") == " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in _dots(root))
    assert (line.get("fill"), line.get("stroke"), line.get("stroke-width")) == (
        "none", COLORS[0], "1.6")  # fmt: skip
    assert line.get("stroke-dasharray") is None
    frame = _all(root, "rect")[0]
    assert frame.attrib == {"x": str(LEFT), "y": str(TOP), "width": str(PLOT_W),
                            "height": str(PLOT_H), "fill": "none", "stroke": "#999"}  # fmt: skip


def test_negative_values_put_the_bottom_below_zero() -> None:
    root = _parse(line_chart("T", "x", "y", [Series("a", ((0, -10, ""), (1, 10, "")))]))
    (low, high) = _dots(root)
    assert low[1] == TOP + PLOT_H
    assert high[1] == round(TOP + PLOT_H - 20 / (10 * 1.05 + 10) * PLOT_H, 1)


def test_one_point_is_centred_in_a_range_of_one_either_side() -> None:
    root = _parse(line_chart("T", "x", "y", [Series("a", ((5.0, 0.0, ""),))]))
    ((x, y, _),) = _dots(root)
    assert (x, y) == (LEFT + PLOT_W / 2, TOP + PLOT_H)
    root = _parse(line_chart("T", "x", "y", [Series("a", ((5.0, 3.0, ""), (6.0, 3.0, "")))]))
    assert [d[1] for d in _dots(root)] == [round(TOP + PLOT_H - 3 / 3.15 * PLOT_H, 1)] * 2


def _ticks(root: ET.Element, anchor: str) -> list[str]:
    return [t.text or "" for t in _all(root, "text") if t.get("text-anchor") == anchor
            and t.get("font-size") == "10"]  # fmt: skip


def test_axis_ticks_read_as_round_numbers() -> None:
    series = [Series("a", ((1.0, 0.0, ""), (64.0, 1234.0, "")))]
    root = _parse(line_chart("T", "c", "tok/s", series))
    assert _ticks(root, "middle") == ["20", "40", "60"]
    assert _ticks(root, "end") == ["0", "500", "1000"]
    big = [Series("a", ((0.0, 0.0, ""), (1.0, 123456.0, "")))]
    assert _ticks(_parse(line_chart("T", "x", "y", big)), "end") == [
        "0", "50000", "100000"]  # fmt: skip
    wide = [Series("a", ((0.0, 0.0, ""), (49.0, 1.0, "")))]
    assert _ticks(_parse(line_chart("T", "x", "y", wide)), "middle") == [
        "0", "10", "20", "30", "40"]  # fmt: skip
    small = [Series("a", ((0.0, 0.0, ""), (1.0, 0.03, "")))]
    assert _ticks(_parse(line_chart("T", "x", "y", small)), "end") == ["0", "0.01", "0.02", "0.03"]
    assert _ticks(_parse(line_chart("T", "x", "y", small)), "middle") == [
        "0", "0.2", "0.4", "0.6", "0.8", "1"]  # fmt: skip


def test_tick_marks_sit_on_the_axes() -> None:
    root = _parse(line_chart("T", "x", "y", [Series("a", ((0.0, 0.0, ""), (5.0, 5.0, "")))]))
    lines = _all(root, "line")
    x_marks = [ln for ln in lines if ln.get("stroke") == "#999"]
    y_grid = [ln for ln in lines if ln.get("stroke") == "#eee"]
    assert x_marks and y_grid
    assert {(ln.get("y1"), ln.get("y2")) for ln in x_marks} == {
        (str(TOP + PLOT_H), str(TOP + PLOT_H + 4))}  # fmt: skip
    assert {(ln.get("x1"), ln.get("x2")) for ln in y_grid} == {(str(LEFT), str(LEFT + PLOT_W))}
    assert float(x_marks[0].get("x1", "nan")) == LEFT


def test_axis_labels_are_placed_and_escaped() -> None:
    root = _parse(line_chart("T", "<x & y>", '"y"\'', [Series("a", ((0, 1, ""),))]))
    by_text = {t.text: t.attrib for t in _all(root, "text")}
    assert by_text["<x & y>"] == {"x": str(LEFT + PLOT_W / 2), "y": str(HEIGHT - 6),
                                  "font-size": "11", "text-anchor": "middle"}  # fmt: skip
    assert by_text["\"y\"'"] == {"x": "12", "y": str(TOP + PLOT_H / 2), "font-size": "11",
                                 "text-anchor": "middle",
                                 "transform": f"rotate(-90 12 {TOP + PLOT_H / 2})"}  # fmt: skip


def test_a_label_from_a_result_file_never_becomes_markup() -> None:
    evil = '<script>alert(1)</script>" onload="x'
    svg = line_chart(evil, evil, evil, [Series(evil, ((0, 1, evil),))])
    root = _parse(svg)
    assert _all(root, "script") == [] and "<script>" not in svg
    assert all(el.get("onload") is None for el in root.iter())
    assert evil in _texts(root)
    (group,) = [g for g in _all(root, "g") if g.get("class") == "series"]
    assert group.get("data-label") == evil
    assert _dots(root)[0][2] == f"{evil}: {evil}"


def test_series_get_their_colors_dashes_and_a_legend_of_the_solid_ones() -> None:
    series = [Series("measured", ((0, 1, ""), (1, 2, "")), color=1),
              Series("bound", ((0, 2, ""), (1, 3, "")), dashed=True, color=2),
              Series("wrapped", ((0, 0, ""),), color=len(COLORS) + 3)]  # fmt: skip
    root = _parse(line_chart("T", "x", "y", series))
    groups = [g for g in _all(root, "g") if g.get("class") == "series"]
    assert [g.get("data-label") for g in groups] == ["measured", "bound", "wrapped"]
    lines = [g.find(f"{NS}polyline") for g in groups]
    assert [ln.get("stroke") for ln in lines if ln is not None] == [COLORS[1], COLORS[2], COLORS[3]]
    assert [ln.get("stroke-dasharray") for ln in lines if ln is not None] == [None, "5,3", None]
    assert [c.get("fill") for c in _all(root, "circle")] == [COLORS[1]] * 2 + [COLORS[2]] * 2 + [
        COLORS[3]]  # fmt: skip
    assert all(c.get("r") == "3" for c in _all(root, "circle"))
    # issue 47: the legend sits below the plot (never on a data point), left to right
    legend = [t for t in _all(root, "text") if t.get("font-size") == "10" and
              float(t.get("y", "0")) > HEIGHT]  # fmt: skip
    assert [t.text for t in legend] == ["measured", "wrapped"]
    first_w = 22 + 6 * len("measured") + 14
    assert [(t.get("x"), t.get("y")) for t in legend] == [
        (str(LEFT + 14), str(HEIGHT + 12)), (str(LEFT + first_w + 14), str(HEIGHT + 12))]  # fmt: skip
    swatches = [r for r in _all(root, "rect") if r.get("width") == "10"]
    assert [r.attrib for r in swatches] == [
        {"x": str(LEFT), "y": str(HEIGHT + 8), "width": "10", "height": "3", "fill": COLORS[1]},
        {"x": str(LEFT + first_w), "y": str(HEIGHT + 8), "width": "10", "height": "3",
         "fill": COLORS[3]},
    ]  # fmt: skip
    assert root.get("height") == str(HEIGHT + 14 + 4)


def test_a_long_legend_wraps_onto_rows_below_the_plot() -> None:
    series = [Series(f"configuration-{i}", ((0, i, ""),), color=i) for i in range(6)]
    root = _parse(line_chart("T", "x", "y", series))
    legend = [t for t in _all(root, "text") if float(t.get("y", "0")) > HEIGHT]
    rows = sorted({t.get("y") for t in legend})
    assert len(legend) == 6 and len(rows) > 1
    assert all(float(t.get("x", "0")) + 6 * len(t.text or "") <= WIDTH for t in legend)
    assert root.get("height") == str(HEIGHT + len(rows) * 14 + 4)


def _legend_places(labels: list[str]) -> list[tuple[str | None, str | None]]:
    series = [Series(label, ((0, i, ""),), color=i) for i, label in enumerate(labels)]
    root = _parse(line_chart("T", "x", "y", series))
    return [(t.get("x"), t.get("y")) for t in _all(root, "text") if float(t.get("y", "0")) > HEIGHT]


def test_a_legend_row_holds_an_entry_that_ends_exactly_at_its_edge() -> None:
    """An entry is 22 + 6 px a character + 14 wide (characters, not UTF-8 bytes: "é" is
    one); two of 34 characters fill the row to the right padding exactly and stay on it,
    the next one wraps; an entry wider than a row stays on the first (nothing to wrap)."""
    first_w = 22 + 6 * 34 + 14
    assert _legend_places(["é" * 34, "b" * 34, "c"]) == [
        (str(LEFT + 14), str(HEIGHT + 12)), (str(LEFT + first_w + 14), str(HEIGHT + 12)),
        (str(LEFT + 14), str(HEIGHT + 26))]  # fmt: skip
    assert LEFT + 2 * first_w == WIDTH - 16  # the right padding: the row is full
    assert _legend_places(["x" * 100]) == [(str(LEFT + 14), str(HEIGHT + 12))]


def test_marked_points_are_ringed_and_the_front_is_a_thick_grey_line() -> None:
    series = [Series("a", ((0.0, 0.0, ""), (10.0, 10.0, "")))]
    root = _parse(line_chart("T", "x", "y", series, marked=[(10.0, 10.0)],
                             front=[(0.0, 0.0), (10.0, 10.0)]))  # fmt: skip
    (ring,) = [c for c in _all(root, "circle") if c.get("class") == "marked"]
    dot = _dots(root)[1]
    assert (float(ring.get("cx", "nan")), float(ring.get("cy", "nan"))) == dot[:2]
    assert {k: ring.get(k) for k in ("r", "fill", "stroke", "stroke-width")} == {
        "r": "7", "fill": "none", "stroke": "#000", "stroke-width": "1.5"}  # fmt: skip
    (front,) = [p for p in _all(root, "polyline") if p.get("class") == "front"]
    assert front.attrib == {"class": "front", "points": " ".join(
        f"{x:.1f},{y:.1f}" for x, y, _ in _dots(root)), "fill": "none", "stroke": "#bbb",
        "stroke-width": "6", "stroke-linejoin": "round"}  # fmt: skip


def test_the_front_alone_is_enough_for_axes() -> None:
    root = _parse(line_chart("T", "x", "y", [], front=[(1.0, 2.0), (3.0, 4.0)]))
    assert "no data" not in _texts(root)
    assert len([p for p in _all(root, "polyline") if p.get("class") == "front"]) == 1


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1e308])
def test_values_the_reader_refuses_never_crash_a_chart(value: float) -> None:
    root = _parse(line_chart("T", "x", "y", [Series("a", ((0.0, 0.0, ""), (1.0, value, "")))]))
    assert len(_dots(root)) == 2


def test_the_pareto_front_keeps_the_points_nothing_beats_by_x() -> None:
    points = [(3.0, 5.0), (1.0, 1.0), (2.0, 4.0), (2.0, 3.0), (4.0, 5.0), (5.0, 9.0), (1.0, 1.0)]
    assert pareto_front(points) == [(1.0, 1.0), (2.0, 4.0), (3.0, 5.0), (5.0, 9.0)]
    assert pareto_front([]) == []
    assert pareto_front([(1.0, 5.0), (2.0, 5.0)]) == [(1.0, 5.0)]


def _x_ticks(x0: float, x1: float) -> list[str]:
    root = _parse(line_chart("T", "x", "y", [Series("a", ((x0, 1.0, ""), (x1, 1.0, "")))]))
    return _ticks(root, "middle")


def test_ticks_step_by_one_two_or_five_times_a_power_of_ten() -> None:
    assert _x_ticks(0.0, 5.0) == ["0", "1", "2", "3", "4", "5"]
    assert _x_ticks(0.0, 5.5) == ["0", "2", "4"]
    assert _x_ticks(10.0, 20.0) == ["10", "12", "14", "16", "18", "20"]
    # issue 47: never "4e+03" on an axis
    assert _x_ticks(0.0, 10000.0) == ["0", "2000", "4000", "6000", "8000", "10000"]
    assert _x_ticks(0.0, 999.0) == ["0", "200", "400", "600", "800"]
    assert _x_ticks(-4000.0, 0.0) == ["-4000", "-3000", "-2000", "-1000", "0"]


def test_an_axis_too_wide_for_floats_gets_its_two_ends() -> None:
    assert _x_ticks(-1e308, 1e308) == [f"{-1e308:.0f}", f"{1e308:.0f}"]


def test_an_infinite_value_gets_one_tick_at_zero() -> None:
    root = _parse(line_chart("T", "x", "y", [Series("a", ((0.0, 0.0, ""), (1.0, math.inf, "")))]))
    assert _ticks(root, "end") == ["0"]


def test_one_value_too_large_to_add_one_to_still_draws() -> None:
    """Was a ZeroDivisionError (a traceback from `bench report`) for one cell, or equal
    cells, measuring 1e16 or more: the reader accepts values up to 1e18."""
    root = _parse(line_chart("T", "x", "y", [Series("a", ((1e17, -1e17, ""),))]))
    ((x, y, _),) = _dots(root)
    assert (x, y) == (LEFT + PLOT_W / 2, TOP + PLOT_H)
    assert "100000000000000000" in _ticks(root, "middle")
    assert "-100000000000000000" in _ticks(root, "end")


def _no_stray_text(svg: str) -> None:
    root = _parse(svg)
    assert not (root.text or "").strip()
    for el in root.iter():
        assert not (el.tail or "").strip(), el.tag


def test_nothing_but_elements_in_a_chart() -> None:
    _no_stray_text(line_chart("T", "x", "y", []))
    _no_stray_text(line_chart("T", "x", "y", [Series("a", ((0, 1, ""), (1, 2, "")))]))


def test_one_value_widens_its_axis_by_one_either_side() -> None:
    assert _x_ticks(5.0, 5.0) == ["4", "4.5", "5", "5.5", "6"]
    root = _parse(line_chart("T", "x", "y", [Series("a", ((1.0, 0.0, ""), (2.0, 0.0, "")))]))
    assert _ticks(root, "end") == ["0", "0.2", "0.4", "0.6", "0.8", "1"]


def test_tick_labels_sit_below_and_left_of_the_plot() -> None:
    root = _parse(line_chart("T", "x", "y", [Series("a", ((0.0, 0.0, ""), (5.0, 5.0, "")))]))
    x_labels = [t for t in _all(root, "text") if t.get("text-anchor") == "middle"
                and t.get("font-size") == "10"]  # fmt: skip
    assert {t.get("y") for t in x_labels} == {str(TOP + PLOT_H + 16)}
    y_labels = [t for t in _all(root, "text") if t.get("text-anchor") == "end"]
    assert {t.get("x") for t in y_labels} == {str(LEFT - 4)}
    zero = next(t for t in y_labels if t.text == "0")
    assert zero.get("y") == f"{TOP + PLOT_H + 3:.1f}"
