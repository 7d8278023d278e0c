"""Logical executors (``scheduler``, ``gpu-control``): the engine configuration maps them to
concrete executors, so one policy file runs on the simulated fleet and on Slurm."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuops.actions.base import execute
from gpuops.actions.logical import SchedulerExecutor
from gpuops.actions.registry import ExecutorRegistry
from gpuops.model.decisions import Decision
from gpuops.settings import ConfigError, EngineConfig, load_config
from tests.unit.actions.support import make_decision


class Recorder:
    def __init__(self, name: str, verbs: frozenset[str] | None, settings: Mapping[str, Any]):
        self.name = name
        self.verbs = verbs
        self.settings = dict(settings)
        self.ran: list[str] = []

    def run(self, decision: Decision) -> Mapping[str, Any]:
        assert decision.action is not None
        self.ran.append(decision.action.type)
        return {"by": self.name}


def registry(made: dict[str, Recorder]) -> ExecutorRegistry:
    reg = ExecutorRegistry()
    for name, verbs in (("fleet", frozenset({"reclaim", "migrate"})), ("log", None)):

        def factory(settings: Mapping[str, Any], name: str = name, verbs: Any = verbs) -> Recorder:
            made[name] = Recorder(name, verbs, settings)
            return made[name]

        reg.register(name, factory)
    return reg


def test_default_scheduler_is_the_fleet_and_notify_is_only_recorded() -> None:
    config = EngineConfig(executors={"fleet": {"url": "http://fleet:9400"}})
    assert config.executors["scheduler"] == {
        "use": "fleet",
        "by_verb": {"notify": "log"},
        "settings": {"fleet": {"url": "http://fleet:9400"}, "log": {}},
    }
    made: dict[str, Recorder] = {}
    scheduler = SchedulerExecutor(config.executors["scheduler"], registry=registry(made))
    assert made["fleet"].settings == {"url": "http://fleet:9400"}
    out = execute(scheduler, make_decision("reclaim", "scheduler"))
    assert out.ok and dict(out.changed) == {"by": "fleet", "executor": "fleet"}
    assert execute(scheduler, make_decision("notify", "scheduler")).changed["by"] == "log"
    refused = execute(scheduler, make_decision("downclock", "scheduler"))
    assert not refused.ok
    assert refused.error == (
        "executor 'scheduler' does not support action 'downclock' "
        "(supported: migrate, notify, reclaim)"
    )
    assert made["fleet"].ran == ["reclaim"] and made["log"].ran == ["notify"]


def test_slurm_scheduler_gets_the_slurm_settings_and_prometheus_url() -> None:
    config = EngineConfig.model_validate(
        {
            "prometheus": {"url": "http://prom:9090"},
            "executors": {"scheduler": {"use": "slurm"}, "slurm": {"timeout_s": 5}},
        }
    )
    # where Prometheus is, and the engine's freshness bound (2 x the default 15 s scrape)
    slurm = {"timeout_s": 5, "prometheus_url": "http://prom:9090", "max_sample_age_s": 30.0}
    assert config.executors["slurm"] == slurm
    assert config.executors["scheduler"] == {
        "use": "slurm",
        "by_verb": {},
        "settings": {"slurm": slurm},
    }
    assert config.executors["gpu-control"]["use"] == "fleet"


def test_kubernetes_reclaim_learns_where_prometheus_is() -> None:
    config = EngineConfig.model_validate(
        {
            "prometheus": {"url": "http://prom:9090", "scrape_interval": "20s"},
            "executors": {
                "scheduler": {"use": "kubernetes"},
                "kubernetes": {"node_selector": "gpu=true", "reclaim": {"uuid_label": "uuid"}},
            },
        }
    )
    kubernetes = {
        "node_selector": "gpu=true",
        "reclaim": {
            "prometheus_url": "http://prom:9090",
            "max_sample_age_s": 40.0,  # the engine's bound: 2 x scrape_interval
            "uuid_label": "uuid",
        },
    }
    assert config.executors["kubernetes"] == kubernetes
    assert config.executors["scheduler"]["settings"] == {"kubernetes": kubernetes}
    bounded = EngineConfig.model_validate(
        {
            "prometheus": {"url": "http://prom:9090", "max_sample_age": "1m"},
            "executors": {"kubernetes": {"node_selector": "gpu=true"}},
        }
    )
    assert bounded.executors["kubernetes"]["reclaim"]["max_sample_age_s"] == 60.0


@pytest.mark.parametrize(
    ("executors", "message"),
    [
        (
            "scheduler: {use: gpu-control}",
            "executors: scheduler.use: name a concrete executor (fleet, slurm, nvml-agent, ...), "
            "not 'gpu-control'",
        ),
        (
            "scheduler: {use: slurm, backend: x}",
            "executors: scheduler: unknown key 'backend' (allowed: by_verb, settings, use)",
        ),
        (
            "scheduler: {use: slrum}",
            "executors: scheduler: unknown executor 'slrum' (known: ansible, command, fleet, "
            "kubernetes, log, nvml-agent, slurm, webhook)",
        ),
        (
            "gpu-control: {}",
            "executors: gpu-control.use: name a concrete executor (fleet, slurm, nvml-agent, ...), "
            "not None",
        ),
    ],
)
def test_a_bad_mapping_names_the_file_line_and_key(
    tmp_path: Path, executors: str, message: str
) -> None:
    path = tmp_path / "engine.yaml"
    path.write_text(f"rules: [rules]\nexecutors:\n  {executors}\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value) == f"{path}:2: {message}"
