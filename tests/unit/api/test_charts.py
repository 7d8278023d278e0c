"""The Timeline's SVG charts (``gpuops.api.console.charts``): scaled lines, gaps where data is
missing, decision markers linked to their pages, escaped labels, no data said so."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from gpuops.api.console.charts import (
    HEIGHT,
    LEFT,
    Chart,
    Line,
    Mark,
    legend,
    nice_max,
    render,
    segments,
    time_label,
)

SVG = "{http://www.w3.org/2000/svg}"


def parse(chart: Chart) -> ET.Element:
    return ET.fromstring(str(render(chart)))


def test_a_ratio_line_spans_the_plot_from_0_to_100_percent() -> None:
    chart = Chart("Utilization", "ratio", 0, 100, 100, [Line("a", [(0, 0.0), (100, 1.0)])])
    svg = parse(chart)
    (poly,) = svg.iter(f"{SVG}polyline")
    (x0, y0), (x1, y1) = (tuple(map(float, p.split(","))) for p in poly.attrib["points"].split())
    assert x0 == LEFT and y0 > y1 and y1 == 12.0  # 100% at the top of the plot
    labels = [t.text for t in svg.iter(f"{SVG}text")]
    assert "0%" in labels and "100%" in labels
    assert svg.find(f"{SVG}desc").text == "a: latest 100%"  # type: ignore[union-attr]


def test_a_gap_in_the_data_is_not_joined() -> None:
    points = [(0, 1.0), (10, 2.0), (50, 3.0), (60, 4.0)]
    assert segments(points, 10) == [[(0, 1.0), (10, 2.0)], [(50, 3.0), (60, 4.0)]]
    svg = parse(Chart("Queue", "count", 0, 60, 10, [Line("p", points)]))
    assert len(list(svg.iter(f"{SVG}polyline"))) == 2


def test_counts_scale_to_a_round_maximum() -> None:
    assert [nice_max(v) for v in (0, 1, 3, 36, 250, 251)] == [1, 1, 5, 50, 250, 500]
    svg = parse(Chart("Queue", "count", 0, 60, 10, [Line("p", [(0, 36.0), (10, 12.0)])]))
    assert "50" in [t.text for t in svg.iter(f"{SVG}text")]


def test_decisions_are_markers_linked_to_their_page_with_escaped_labels() -> None:
    marks = [
        Mark(30, 'p fire on node="<n1>"', "/decisions/abc", "success"),
        Mark(500, "outside the range", "/decisions/zzz", "failure"),
    ]
    text = str(render(Chart("U", "ratio", 0, 60, 10, [], marks)))
    assert "<n1>" not in text and "&lt;n1&gt;" in text
    svg = ET.fromstring(text)
    (link,) = svg.iter(f"{SVG}a")
    assert link.attrib["href"] == "/decisions/abc" and link.attrib["class"] == "mark mark-success"
    assert link.find(f"{SVG}title").text == 'p fire on node="<n1>"'  # type: ignore[union-attr]


def test_no_data_is_said_so() -> None:
    svg = parse(Chart("U", "ratio", 0, 60, 10, [Line("a", [])]))
    assert [t.text for t in svg.iter(f"{SVG}text") if t.attrib.get("class") == "nodata"] == [
        "no data in this time range"
    ]
    assert not list(svg.iter(f"{SVG}polyline"))


def test_a_single_point_is_a_dot_and_values_stay_in_the_plot() -> None:
    svg = parse(
        Chart("Q", "count", 0, 60, 10, [Line("a", [(30, 5.0)]), Line("b", [(0, -3.0), (10, -1.0)])])
    )
    (dot,) = svg.iter(f"{SVG}circle")
    assert dot.attrib["class"] == "series-0"
    (poly,) = svg.iter(f"{SVG}polyline")
    ys = [float(p.split(",")[1]) for p in poly.attrib["points"].split()]
    assert all(y <= HEIGHT for y in ys)


def test_time_labels_and_legend() -> None:
    assert time_label(3600 * 5 + 60 * 7, 3600) == "05:07"
    assert re.fullmatch(r"\d\d-\d\d \d\d:\d\d", time_label(0, 3 * 86400))
    chart = Chart("U", "ratio", 0, 1, 1, [Line(str(i), []) for i in range(7)])
    assert [c for c, _ in legend(chart)][5:] == ["series-5", "series-0"]
