"""``{{ $labels.x }}`` / ``{{ $value }}`` templates: rendering and what the loader rejects."""

from __future__ import annotations

import pytest

from gpuops.model.rules.schema import template_problem
from gpuops.model.rules.templating import render

LABELS = {"node": "gpu-node-1", "uuid": "GPU-abc"}


@pytest.mark.parametrize(
    ("template", "value", "rendered"),
    [
        ("GPU {{ $labels.uuid }} on {{ $labels.node }}", None, "GPU GPU-abc on gpu-node-1"),
        ("{{$labels.node}}", None, "gpu-node-1"),
        ("at {{ $value }}", 0.15, "at 0.15"),
        ("at {{ $value }}", 12.0, "at 12"),
        ("none: '{{ $value }}'", None, "none: ''"),
        ("missing '{{ $labels.pool }}'", None, "missing ''"),
        ("no placeholders", 1.0, "no placeholders"),
    ],
)
def test_render(template: str, value: float | None, rendered: str) -> None:
    assert render(template, LABELS, value) == rendered


def test_render_does_not_evaluate_anything() -> None:
    template = "{{ $labels.node.__class__ }} {{ __import__('os') }}"
    assert render(template, LABELS, None) == template


@pytest.mark.parametrize(
    "template",
    [
        "{{ $labels.x | toUpper }}",
        "{{ .Labels.x }}",
        "{{ $externalLabels.x }}",
        "{{ $labels.a.b }}",
    ],
)
def test_unknown_placeholders_are_problems(template: str) -> None:
    problem = template_problem(template)
    assert problem is not None
    assert problem.startswith(f'unknown template placeholder "{template}"')


@pytest.mark.parametrize("template", ["{{ $labels.x }", "{{ $value", "a }} b"])
def test_unbalanced_braces_are_problems(template: str) -> None:
    problem = template_problem(template)
    assert problem is not None
    assert problem.startswith("unbalanced template braces")


@pytest.mark.parametrize("template", ["", "plain", "{{ $value }}", "{{$labels.node_name}}"])
def test_good_templates_have_no_problem(template: str) -> None:
    assert template_problem(template) is None
