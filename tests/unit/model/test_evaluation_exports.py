"""``gpuops.model.evaluation`` re-exports the public names of its modules, so that
``from gpuops.model.evaluation import evaluate`` works as it did before the package was split."""

from __future__ import annotations

import importlib

import pytest

import gpuops.model.evaluation as evaluation

HOME = {
    "evaluate": "evaluator",
    "evaluate_alert": "alertmanager",
    "index_targets": "machine",
    "settle": "settling",
    "settle_all": "settling",
    "failed": "settling",
    "Settled": "settling",
    "PolicyState": "state",
    "TargetState": "state",
    "Status": "state",
    "Quiet": "state",
    "Delta": "state",
    "QueryResult": "step",
    "Freshness": "step",
    "Step": "step",
}


def test_the_users_names_import_from_the_package() -> None:
    from gpuops.model.evaluation import (  # noqa: F401
        Freshness,
        PolicyState,
        QueryResult,
        Status,
        Step,
        TargetState,
        evaluate,
        evaluate_alert,
        failed,
        settle_all,
    )


@pytest.mark.parametrize("name", sorted(HOME))
def test_each_name_is_its_modules_object(name: str) -> None:
    module = importlib.import_module(f"gpuops.model.evaluation.{HOME[name]}")
    assert getattr(evaluation, name) is getattr(module, name)


def test_all_lists_exactly_the_re_exports() -> None:
    assert sorted(evaluation.__all__) == sorted(HOME)
    for name in evaluation.__all__:
        assert hasattr(evaluation, name)
