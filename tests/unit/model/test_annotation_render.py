"""A decision's annotations rendered from templates cut once
(``gpuops.model.evaluation.machine.render_annotation``) read as ``render`` makes them: every
placeholder, a missing label, no value; the value as the words it is given."""

from __future__ import annotations

from gpuops.model.evaluation.machine import render_annotation as _render
from gpuops.model.rules.templating import render

TEMPLATES = [
    "",
    "no placeholder at all",
    "{{ $value }}",
    "GPU {{$labels.uuid}} on {{ $labels.node }} idle at {{ $value }} ({{ $labels.missing }})",
    "{{ $labels.node }}{{ $labels.node }}{{$value}}",
    "{{ $labels.node}} and {{ not_a_placeholder }} {{ $value",
    "multi\nline {{ $labels.uuid }}\n",
]
LABELS = {"node": "n-01", "uuid": "GPU-é/1"}


def test_rendered_as_render_renders() -> None:
    for template in TEMPLATES:
        for value in (None, 0.0, 0.123456789, 1e-9, 12345678.0, float("nan")):
            told = "" if value is None else f"{value:g}"
            assert _render(template, LABELS, told) == render(template, LABELS, value), template
    assert _render(TEMPLATES[3], LABELS, "50%") == "GPU GPU-é/1 on n-01 idle at 50% ()"
