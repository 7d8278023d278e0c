"""What the built-in executors take as a verb's params (``gpuops.model.verbs``): a number is
``int()`` (``float()``) of what was given, a name ``str()`` of it, a target label wins over the
param, a param the executor does not read is not checked, and a verb several executors
implement takes what the most lenient of them takes. Also on the path the shipped policies use
(the logical ``scheduler`` and ``gpu-control``), an ``on_clear`` undo included. Bad params fail
permanently with the executor's message, after a missing target label the executor reads first;
the rule checks refuse only what the executors' own checks refused before any decision
(``Verb.checked``), and a third-party executor's params only by its own ``check_params``."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import pytest
import responses

from gpuops.actions.base import Executor, execute
from gpuops.actions.fleet import FleetExecutor
from gpuops.actions.logical import GpuControlExecutor, SchedulerExecutor
from gpuops.actions.nvml_agent import NvmlAgentExecutor
from gpuops.actions.registry import ExecutorRegistry
from gpuops.actions.slurm import SlurmExecutor
from gpuops.model.decisions import Decision, Outcome
from tests.unit.actions.support import UUID0, agent_decision, make_decision

URL = "http://fleet.invalid"
AGENT = "http://127.0.0.1:9835"
LABELS = {
    "uuid": "GPU-1",
    "node": "n1",
    "pool": "gpu",
    "project": "p1",
    "quota_request": "q1",
    "priority_class": "batch",
}

Call = tuple[str, str, dict[str, Any]]
"""A request the executor sent: method, path (and query), body."""


def sent(executor: Executor, decision: Decision) -> tuple[Outcome, list[Call]]:
    """The outcome of ``decision`` on ``executor`` and the requests it sent (each answered
    200 by every URL)."""

    def ok(request: Any) -> tuple[int, dict[str, str], str]:
        return 200, {}, json.dumps({"changed": {"ok": True}})

    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        for method in (responses.POST, responses.DELETE):
            mock.add_callback(method, re.compile(r"http://.*"), callback=ok)
        outcome = execute(executor, decision)
        calls = [
            (
                str(c.request.method),
                re.sub(r"^http://[^/]+", "", str(c.request.url)),
                json.loads(c.request.body or b"{}"),
            )
            for c in mock.calls
        ]
    return outcome, calls


def fleet(verb: str, params: Mapping[str, Any], **labels: str) -> tuple[Outcome, list[Call]]:
    decision = make_decision(verb, "fleet", params, **(labels or LABELS))
    return sent(FleetExecutor({"url": URL}), decision)


@pytest.mark.parametrize(
    ("verb", "params", "labels", "call"),
    [
        (
            "scale_out",
            {"nodes": "2"},
            LABELS,
            ("POST", "/api/v1/pools/gpu/scale_out", {"nodes": 2}),
        ),
        (
            "scale_out",
            {"nodes": 2.0},
            LABELS,
            ("POST", "/api/v1/pools/gpu/scale_out", {"nodes": 2}),
        ),
        ("scale_out", {"nodes": 0}, LABELS, ("POST", "/api/v1/pools/gpu/scale_out", {"nodes": 0})),
        (
            "scale_out",
            {"pool": 5},
            {"uuid": "u"},
            ("POST", "/api/v1/pools/5/scale_out", {"nodes": 1}),
        ),
        (
            "scale_out",
            {"pool": None},
            {"uuid": "u"},
            ("POST", "/api/v1/pools/default/scale_out", {"nodes": 1}),
        ),
        (
            "scale_in",
            {"nodes": "1"},
            LABELS,
            ("POST", "/api/v1/pools/gpu/scale_in", {"nodes": 1, "node": "n1"}),
        ),
        (
            "downclock",
            {"max_clock_mhz": "1100"},
            LABELS,
            ("POST", "/api/v1/gpus/GPU-1/clocks", {"max_clock_mhz": 1100}),
        ),
        (
            "downclock",
            {"max_clock_mhz": 1100.0},
            LABELS,
            ("POST", "/api/v1/gpus/GPU-1/clocks", {"max_clock_mhz": 1100}),
        ),
        (  # the fleet locks the highest clock only: min_clock_mhz is neither read nor checked
            "downclock",
            {"max_clock_mhz": 1100, "min_clock_mhz": "x"},
            LABELS,
            ("POST", "/api/v1/gpus/GPU-1/clocks", {"max_clock_mhz": 1100}),
        ),
        (
            "grant_quota",
            {"gpus": 2.5},
            LABELS,
            ("POST", "/api/v1/projects/p1/grants", {"grant": "q1", "pool": "gpu", "gpus": 2}),
        ),
        (
            "grant_quota",
            {"gpus": "4", "duration_s": "60", "grant": 7},
            {"project": "p1"},
            (
                "POST",
                "/api/v1/projects/p1/grants",
                {"grant": "7", "pool": "default", "gpus": 4, "duration_s": 60.0},
            ),
        ),
        (  # the label names the grant; the params' null and unread gpus are no matter
            "release_quota",
            {"grant": None, "gpus": "x"},
            LABELS,
            ("DELETE", "/api/v1/projects/p1/grants/q1", {}),
        ),
        (
            "hold_class",
            {"priority_class": ["a"]},
            LABELS,
            ("POST", "/api/v1/classes/batch/hold", {}),
        ),
        (
            "hold_class",
            {"priority_class": 3},
            {"uuid": "u"},
            ("POST", "/api/v1/classes/3/hold", {}),
        ),
    ],
)
def test_the_fleet_takes_what_it_always_took(
    verb: str, params: dict[str, Any], labels: dict[str, str], call: Call
) -> None:
    outcome, calls = fleet(verb, params, **labels)
    assert outcome.ok, outcome.error
    method, path, body = call
    assert calls == [(method, path, {"decision_id": "0123456789abcdef01234567", **body})]


@pytest.mark.parametrize(
    ("verb", "params", "labels", "error"),
    [
        (  # the GPU label is read first, as always
            "downclock",
            {},
            {"node": "n1"},
            "downclock needs the target label 'uuid'; the target has {'node': 'n1'}",
        ),
        (
            "downclock",
            {},
            LABELS,
            "downclock needs params.max_clock_mhz as a positive integer (MHz), got None",
        ),
        (
            "downclock",
            {"max_clock_mhz": "low"},
            LABELS,
            "downclock needs params.max_clock_mhz as a positive integer (MHz), got 'low'",
        ),
        ("scale_out", {"nodes": "x"}, LABELS, "params.nodes must be a number, not 'x'"),
        (
            "scale_out",
            {"nodes": "x", "pool": ".."},
            {"uuid": "u"},
            "label pool='..' cannot go into a URL path: it would name another path",
        ),
        (
            "grant_quota",
            {"gpus": None},
            {"node": "n1"},
            "grant_quota needs the target label 'project'; the target has {'node': 'n1'}",
        ),
        (
            "grant_quota",
            {"gpus": "x"},
            {"project": "p1"},
            "grant_quota needs a quota_request label or params.grant",
        ),
        ("grant_quota", {"gpus": "x"}, LABELS, "params.gpus must be a number, not 'x'"),
        (
            "grant_quota",
            {"duration_s": "soon"},
            LABELS,
            "params.duration_s must be a number, not 'soon'",
        ),
        (
            "release_quota",
            {"grant": None},
            {"project": "p1"},
            "release_quota needs a quota_request label or params.grant",
        ),
        (
            "hold_class",
            {"priority_class": None},
            {"uuid": "u"},
            "hold_class needs a priority_class label or param",
        ),
    ],
)
def test_the_fleet_refuses_bad_params_permanently_after_the_labels_it_reads_first(
    verb: str, params: dict[str, Any], labels: dict[str, str], error: str
) -> None:
    outcome, calls = fleet(verb, params, **labels)
    assert not outcome.ok and outcome.permanent
    assert outcome.error == error
    assert calls == []


def test_the_logical_executors_take_them_too_an_undo_included() -> None:
    scheduler = SchedulerExecutor(
        {"use": "fleet", "by_verb": {"notify": "log"}, "settings": {"fleet": {"url": URL}}},
        registry=ExecutorRegistry.from_entry_points(),
    )
    outcome, calls = sent(
        scheduler, make_decision("scale_out", "scheduler", {"nodes": "2"}, **LABELS)
    )
    assert outcome.ok, outcome.error
    assert [(m, p, b["nodes"]) for m, p, b in calls] == [("POST", "/api/v1/pools/gpu/scale_out", 2)]
    undo = make_decision("scale_in", "scheduler", {"nodes": 1.0}, **LABELS)
    outcome, calls = sent(scheduler, undo)
    assert outcome.ok, outcome.error
    assert [(m, p, b["nodes"]) for m, p, b in calls] == [("POST", "/api/v1/pools/gpu/scale_in", 1)]
    gpu_control = GpuControlExecutor(
        {"use": "nvml-agent", "settings": {"nvml-agent": {"url": "http://{node}:9835"}}},
        registry=ExecutorRegistry.from_entry_points(),
    )
    outcome, calls = sent(gpu_control, agent_decision("downclock", {"max_clock_mhz": "1100"}))
    assert outcome.ok, outcome.error
    assert calls == [
        ("POST", f"/api/v1/gpus/{UUID0}/clocks", {"decision_id": "dec-1", "max_clock_mhz": 1100})
    ]


@pytest.mark.parametrize(
    ("params", "body", "error"),
    [
        ({"max_clock_mhz": "1100"}, {"max_clock_mhz": 1100}, None),  # as the fleet took it
        (
            {"max_clock_mhz": 1100.0, "min_clock_mhz": "300"},
            {"max_clock_mhz": 1100, "min_clock_mhz": 300},
            None,
        ),
        ({"max_clock_mhz": 1100, "min_clock_mhz": None}, {"max_clock_mhz": 1100}, None),
        ({}, None, "downclock needs params.max_clock_mhz as a positive integer (MHz), got None"),
        (
            {"max_clock_mhz": 0},
            None,
            "downclock needs params.max_clock_mhz as a positive integer (MHz), got 0",
        ),
        (
            {"max_clock_mhz": 1100, "min_clock_mhz": "x"},
            None,
            "downclock needs params.min_clock_mhz as a positive integer (MHz), got 'x'",
        ),
    ],
)
def test_the_node_agent_takes_clocks_above_0(
    params: dict[str, Any], body: dict[str, Any] | None, error: str | None
) -> None:
    outcome, calls = sent(NvmlAgentExecutor({}), agent_decision("downclock", params))
    assert outcome.error == error
    if body is None:
        assert outcome.permanent and calls == []
    else:
        assert calls == [("POST", f"/api/v1/gpus/{UUID0}/clocks", {"decision_id": "dec-1", **body})]


class FakeSlurm:
    """The Slurm commands the scaling verbs run, recorded: partition ``gpu`` has a powered-down
    CLOUD node ``c1`` and a node ``c2`` that gpuops powered up, now idle."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def nodes(self) -> list[dict[str, Any]]:
        return [
            {"name": "c1", "state": "idle", "state_flags": ["POWERED_DOWN"], "partitions": ["gpu"]},
            {"name": "c2", "state": "idle", "partitions": ["gpu"], "comment": "gpuops:scale_out:x"},
        ]

    def scontrol(self, *args: str) -> str:
        self.calls.append(args)
        return ""


def slurm(
    verb: str, params: Mapping[str, Any], **labels: str
) -> tuple[Outcome, list[tuple[str, ...]]]:
    executor = SlurmExecutor({})
    fake = FakeSlurm()
    executor.client = fake  # type: ignore[assignment]
    outcome = execute(executor, make_decision(verb, "slurm", params, **(labels or {"pool": "gpu"})))
    return outcome, fake.calls


@pytest.mark.parametrize(
    ("verb", "params", "powered"),
    [
        ("scale_in", {"nodes": "1"}, {"pool": "gpu", "powered_down": ["c2"]}),
        ("scale_in", {"nodes": 1.0}, {"pool": "gpu", "powered_down": ["c2"]}),
        ("scale_out", {"nodes": "2"}, {"pool": "gpu", "powered_up": ["c1"]}),
        ("scale_out", {"nodes": True, "pool": "other"}, {"pool": "gpu", "powered_up": ["c1"]}),
    ],
)
def test_slurm_takes_what_it_always_took(
    verb: str, params: dict[str, Any], powered: dict[str, Any]
) -> None:
    outcome, calls = slurm(verb, params)
    assert outcome.ok, outcome.error
    assert dict(outcome.changed) == powered
    assert calls


@pytest.mark.parametrize(
    ("params", "labels", "error"),
    [
        ({"nodes": 0}, {"pool": "gpu"}, "params.nodes must be at least 1, not 0"),
        ({"nodes": -1}, {"pool": "gpu"}, "params.nodes must be at least 1, not -1"),
        ({"nodes": "x"}, {"pool": "gpu"}, "params.nodes must be a number, not 'x'"),
        ({"nodes": None}, {"pool": "gpu"}, "params.nodes must be a number, not None"),
        ({"nodes": "x"}, {"node": "n1"}, "scale_in needs a 'pool' label"),  # the pool first
        ({"nodes": 1, "pool": None}, {"node": "n1"}, "scale_in needs a 'pool' label"),
    ],
)
def test_slurm_powers_at_least_one_node_of_a_named_partition(
    params: dict[str, Any], labels: dict[str, str], error: str
) -> None:
    outcome, calls = slurm("scale_in", params, **labels)
    assert not outcome.ok and outcome.permanent
    assert outcome.error == error
    assert calls == []


class Ticket:
    """A third-party executor: verbs the table knows, and its own; no ``check_params``."""

    name = "ticket"
    verbs: frozenset[str] | None = frozenset({"downclock", "scale_out", "open_ticket"})

    def __init__(self, settings: Mapping[str, Any]) -> None:
        pass

    def run(self, decision: Decision) -> Mapping[str, Any]:
        return {}


@pytest.mark.parametrize(
    ("executor", "verb", "params", "problems"),
    [
        # the checks the fleet and the node agent made before any decision, no more
        ("fleet", "downclock", {"max_clock_mhz": "1100", "min_clock_mhz": "low"}, []),
        (
            "fleet",
            "downclock",
            {"max_clock": 900},
            ["downclock needs params.max_clock_mhz as a positive integer (MHz), got None"],
        ),
        ("fleet", "scale_out", {"nodes": "2"}, []),
        ("fleet", "scale_in", {"nodes": "two"}, ["params.nodes must be a number, not 'two'"]),
        ("fleet", "grant_quota", {"gpus": 2.5, "grant": "g"}, []),
        ("fleet", "grant_quota", {"gpus": "x"}, []),  # refused when it runs, as always
        ("fleet", "release_quota", {"grant": None}, []),
        ("fleet", "hold_class", {"priority_class": ["a"]}, []),
        (
            "nvml-agent",
            "downclock",
            {"max_clock_mhz": -5, "min_clock_mhz": "low"},
            [
                "downclock needs params.max_clock_mhz as a positive integer (MHz), got -5",
                "downclock needs params.min_clock_mhz as a positive integer (MHz), got 'low'",
            ],
        ),
        ("nvml-agent", "downclock", {"max_clock_mhz": "1100"}, []),
        ("slurm", "scale_out", {"nodes": "2"}, []),
        ("slurm", "scale_in", {"nodes": 0}, []),  # Slurm's own refusals come when it runs
        ("scheduler", "scale_out", {"nodes": "2"}, []),
        ("scheduler", "scale_out", {"nodes": "x"}, []),  # the logical ones: when it runs
        ("gpu-control", "downclock", {}, []),
        # a third-party executor's params: its own check_params, or none
        ("ticket", "downclock", {"power_w": 200}, []),
        ("ticket", "scale_out", {"nodes": "two", "pool": [1]}, []),
        ("ticket", "open_ticket", {"x": 1}, []),
    ],
)
def test_the_rule_checks_refuse_what_the_executors_refused_before_any_decision(
    executor: str, verb: str, params: dict[str, Any], problems: list[str]
) -> None:
    registry = ExecutorRegistry.from_entry_points()
    registry.register("ticket", Ticket)
    assert registry.params_problems(executor, verb, params) == problems
