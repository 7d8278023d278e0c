"""``gpuops.sources.promql``'s PromQL rewriting, pure (no server): what ``narrowed`` and
``input_selectors`` make of hostile selectors.
Against a real Prometheus: tests/integration/sources/test_narrowed_prometheus.py."""

from __future__ import annotations

from gpuops.sources.promql import input_selectors, narrowed


def test_a_selector_with_or_groups_is_not_narrowed_and_its_probe_keeps_them() -> None:
    """``{a="1" or b="2"}`` (MetricsQL) keeps its matchers in ``or`` groups. Dropped, the
    narrowed clear_expr would match every ``up`` series of a firing node (it would clear: an
    undo) and the age probe would be ``{}``, which Prometheus rejects (the policy skipped
    forever): such a query is asked wide, and the probe keeps the groups."""
    assert narrowed('up{a="1" or b="2"} == 1', ["node"], [{"node": "n1"}]) is None
    assert input_selectors('{a="1" or b="2"} > 0') == ('{a="1" or b="2"}',)
    assert input_selectors('up{a="1",c="q\\"" or b!~"2"} > 0') == ('up{a="1",c="q\\"" or b!~"2"}',)
    assert narrowed('up{a="1"} == 1', ["node"], [{"node": "n1"}]) == (
        '(up{a="1",node=~"n1"}) == (1.0)'
    )


def test_a_target_label_name_is_not_narrowed_by() -> None:
    """A target ``[__name__, uuid]`` adds no ``__name__=~""`` (a target keeps no ``__name__``),
    which would match no series: the firing targets would never clear."""
    assert narrowed("x == 1", ["__name__", "uuid"], [{"uuid": "u1"}]) == (
        '(x{uuid=~"u1"}) == (1.0)'
    )
    assert narrowed("x == 1", ["__name__"], [{"uuid": "u1"}]) is None  # nothing left: wide
