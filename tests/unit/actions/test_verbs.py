"""The verb table (``gpuops.model.verbs``): what each verb is, declared once, and read by the
executors' dispatch tables, the registry's rule checks and results' JSON forms."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
import responses

from gpuops.actions.base import PermanentError, execute
from gpuops.actions.dispatch import Dispatch, on
from gpuops.actions.fleet import FleetExecutor
from gpuops.actions.nvml_agent import NvmlAgentExecutor
from gpuops.actions.registry import ExecutorRegistry
from gpuops.actions.results import Routed
from gpuops.actions.slurm import Powered, Reclaimed, SlurmExecutor
from gpuops.model.decisions import Decision
from gpuops.model.verbs import RECLAIM, VERBS, NoParams, implemented_by
from tests.unit.actions.support import make_decision

URL = "http://fleet.invalid"
LABELS = {
    "uuid": "GPU-1",
    "node": "n1",
    "pool": "gpu",
    "project": "p1",
    "quota_request": "q1",
    "priority_class": "batch",
}
FLEET_CALLS: dict[str, tuple[str, str, dict[str, Any], dict[str, Any]]] = {
    # verb: (method, path, params, body after decision_id)
    "reclaim": ("POST", "/api/v1/gpus/GPU-1/reclaim", {}, {}),
    "pack": ("POST", "/api/v1/gpus/GPU-1/pack", {}, {}),
    "consolidate": ("POST", "/api/v1/nodes/n1/consolidate", {}, {}),
    "migrate": ("POST", "/api/v1/nodes/n1/migrate", {}, {}),
    "resume": ("POST", "/api/v1/nodes/n1/resume", {}, {}),
    "lend": ("POST", "/api/v1/pools/gpu/lend", {}, {}),
    "unlend": ("DELETE", "/api/v1/pools/gpu/lend", {}, {}),
    "downclock": (
        "POST",
        "/api/v1/gpus/GPU-1/clocks",
        {"max_clock_mhz": 900, "note": "kept for the audit"},
        {"max_clock_mhz": 900},
    ),
    "restore_clocks": ("DELETE", "/api/v1/gpus/GPU-1/clocks", {}, {}),
    "scale_out": ("POST", "/api/v1/pools/gpu/scale_out", {"nodes": 2, "gpus": 16}, {"nodes": 2}),
    "scale_in": ("POST", "/api/v1/pools/gpu/scale_in", {}, {"nodes": 1, "node": "n1"}),
    "grant_quota": (
        "POST",
        "/api/v1/projects/p1/grants",
        {"nodes": 2, "gpus": 16, "pool": "other", "duration_s": 3600},
        {"grant": "q1", "pool": "gpu", "gpus": 16, "duration_s": 3600.0},
    ),
    "release_quota": ("DELETE", "/api/v1/projects/p1/grants/q1", {"gpus": 16}, {}),
    "hold_class": ("POST", "/api/v1/classes/batch/hold", {}, {}),
    "reset_gpu": ("POST", "/api/v1/gpus/GPU-1/reset", {}, {}),
    "reboot": ("POST", "/api/v1/nodes/n1/reboot", {"timeout_s": 600}, {}),
    # the ladder's health check: the fleet checks the node itself (no command to run)
    "validate": ("POST", "/api/v1/nodes/n1/validate", {"argv": ["dcgmi"], "timeout_s": 60}, {}),
    "release_class": ("DELETE", "/api/v1/classes/batch/hold", {}, {}),
}


def test_every_verb_names_a_known_undo_and_an_executor() -> None:
    for verb in VERBS.values():
        assert verb.undo is None or verb.undo in VERBS, verb.name
        assert verb.executors, verb.name
    assert VERBS["downclock"].undo == "restore_clocks"
    assert VERBS["migrate"].undo == "resume"


def test_the_executors_do_the_verbs_the_table_says() -> None:
    assert FleetExecutor.verbs == implemented_by("fleet") == frozenset(FLEET_CALLS)
    assert SlurmExecutor.verbs == implemented_by("slurm")
    assert NvmlAgentExecutor.verbs == frozenset(
        {"downclock", "restore_clocks", "reset_gpu", "validate", "reboot"}
    )


def test_a_dispatch_table_that_disagrees_with_the_verb_table_is_refused() -> None:
    def handler(executor: object, decision: Decision, params: NoParams) -> str:
        return "done"

    with pytest.raises(TypeError, match=r"routes \['reclaim'\], but gpuops.model.verbs says"):
        Dispatch("slurm", [on(RECLAIM, handler)])


@responses.activate
@pytest.mark.parametrize("verb", sorted(FLEET_CALLS))
def test_fleet_calls_one_endpoint_per_verb(verb: str) -> None:
    method, path, params, body = FLEET_CALLS[verb]
    responses.add(method, URL + path, json={"changed": {"done": verb}})
    decision = make_decision(verb, "fleet", params, **LABELS)
    outcome = execute(FleetExecutor({"url": URL}), decision)
    assert outcome.ok, outcome.error
    assert dict(outcome.changed) == {"done": verb}
    (call,) = responses.calls
    assert json.loads(call.request.body or b"{}") == {"decision_id": decision.id, **body}
    assert list(json.loads(call.request.body or b"{}")) == ["decision_id", *body]


def test_bad_params_fail_permanently_with_the_rule_check_message() -> None:
    outcome = execute(
        FleetExecutor({"url": URL}), make_decision("scale_out", "fleet", {"nodes": "two"})
    )
    assert not outcome.ok and outcome.permanent
    assert outcome.error == "params.nodes must be a number, not 'two'"
    registry = ExecutorRegistry.from_entry_points()
    assert registry.params_problems("fleet", "scale_out", {"nodes": "two"}) == [outcome.error]


class ThirdParty:
    """An executor of another package: a verb the table knows, and one of its own."""

    name = "third"
    verbs: frozenset[str] | None = frozenset({"downclock", "drain"})

    def __init__(self, settings: Mapping[str, Any]) -> None:
        pass

    def run(self, decision: Decision) -> Mapping[str, Any]:
        return {"ran": decision.action.type if decision.action else ""}


@pytest.mark.parametrize(
    ("executor", "verb", "params", "problems"),
    [
        (
            "fleet",
            "downclock",
            {"max_clock": 900},
            ["downclock needs params.max_clock_mhz as a positive integer (MHz), got None"],
        ),
        ("fleet", "scale_out", {"nodes": None}, ["params.nodes must be a number, not None"]),
        ("slurm", "scale_out", {"nodes": 0}, []),  # refused when it runs
        ("slurm", "reclaim", {"anything": 1}, []),
        ("fleet", "downclok", {}, []),  # the verb check says what is wrong
        (
            "webhook",
            "notify",
            {"timeout_s": -1},
            ["webhook params: timeout_s: Input should be greater than 0"],
        ),
        ("third", "downclock", {}, []),  # no check_params of its own: none
        ("third", "drain", {"whatever": [1, 2]}, []),  # free-form: its params as written
        ("nowhere", "downclock", {}, []),  # an unknown executor: the loader says so
    ],
)
def test_the_registry_checks_params_by_the_verb_table(
    executor: str, verb: str, params: dict[str, Any], problems: list[str]
) -> None:
    registry = ExecutorRegistry.from_entry_points()
    registry.register("third", ThirdParty)
    assert registry.params_problems(executor, verb, params) == problems


def test_a_result_reads_as_the_mapping_earlier_outcomes_recorded() -> None:
    done = Reclaimed(job="7", reclaimed=True, how="requeue", user=None)
    assert list(done) == ["job", "reclaimed", "how", "user"]
    assert done == {"job": "7", "reclaimed": True, "how": "requeue", "user": None}
    again = Reclaimed(job="7", reclaimed=True, already=True, how="requeue")
    assert list(again.changed()) == ["job", "reclaimed", "already", "how"]
    up = Powered.model_validate({"pool": "gpu", "powered_up": ["c1"], "already": True})
    assert up.changed() == {"pool": "gpu", "powered_up": ["c1"], "already": True}
    assert Routed(result=up, executor="slurm")["executor"] == "slurm"
    assert Routed(result={"executor": "x"}, executor="slurm").changed() == {"executor": "x"}


def test_run_refuses_a_verb_it_does_not_route() -> None:
    with pytest.raises(PermanentError, match="nvml-agent does not support action 'reclaim'"):
        NvmlAgentExecutor({}).run(make_decision("reclaim", "nvml-agent", node="n1", uuid="u"))
