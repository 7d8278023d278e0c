"""A full audit spool fails closed: with the default ``full_policy`` the engine acts
on nothing while the spool cannot take an intent, ``/healthz`` names the reason, nothing already
spooled is deleted, and the actions run once the shipper has made room."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuops.actions.base import ExecutorRegistry, RetryPolicy
from gpuops.audit import AuditLog, AuditSettings
from gpuops.audit.spool import read_spool
from gpuops.model.decisions import Decision
from gpuops.runtime import Engine
from gpuops.settings import (
    ApiSettings,
    AuditConfig,
    EngineConfig,
    PrometheusSettings,
    QuotaSettings,
)
from tests.fakes.prometheus import FakePrometheus

RULES = """
groups:
  - name: g
    interval: 10s
    rules:
      - policy: reclaim
        expr: idle
        for: 0s
        target: [uuid]
        action: {type: reclaim, executor: log}
        mode: enforce
"""


class Recorder:
    name = "log"
    verbs: frozenset[str] | None = None

    def __init__(self) -> None:
        self.ran: list[str] = []

    def run(self, decision: Decision) -> Mapping[str, Any]:
        self.ran.append(decision.id)
        return {}


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[Engine, AuditLog, FakePrometheus, Recorder]]:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "p.yaml").write_text(RULES)
    executor = Recorder()
    registry = ExecutorRegistry()
    registry.register("log", lambda s: executor)
    audit = AuditLog(
        AuditSettings(
            spool_dir=tmp_path / "audit", max_spool_bytes=12_000, segment_max_bytes=3_000
        ),
        host_name="h",
    )
    prom = FakePrometheus()
    config = EngineConfig(
        prometheus=PrometheusSettings(url="http://unused"),
        rules=[tmp_path / "rules"],
        state_file=tmp_path / "state.sqlite",
        audit=AuditConfig(spool_dir=tmp_path / "audit"),
        metrics_listen=None,
        api=ApiSettings(quota=QuotaSettings(executor="log", check_interval=3600)),
    )
    eng = Engine(
        config,
        clock=lambda: 2_000_000.0,
        executors=registry,
        audit=audit,
        prometheus=prom,
        action_retry=RetryPolicy(attempts=1),
    )
    eng.reload(strict=True)
    yield eng, audit, prom, executor
    eng.stop()
    audit.close()


def test_a_full_spool_runs_no_action_turns_health_red_and_deletes_nothing(
    engine: tuple[Engine, AuditLog, FakePrometheus, Recorder],
) -> None:
    eng, audit, prom, executor = engine
    assert audit.settings.full_policy == "fail_closed"  # the default
    filler = 0
    refused = {"policy": "fail_closed"}
    while not audit.registry.get_sample_value("gpuops_audit_dropped_documents_total", refused):
        audit.operation("u", ["admin"], "fill", "success", None, "x" * 400)
        filler += 1  # operations until the spool refuses one
    filler -= 1
    spooled = [d["event"]["id"] for d in read_spool(audit.spool_dir)]
    assert len(spooled) == filler > 0

    prom.results["idle"] = [{"uuid": f"GPU-{i}"} for i in range(3)]
    policy = eng.rules.policy("reclaim")
    assert policy is not None
    decisions = eng.evaluate_policy(policy)
    assert len(decisions) == 3
    assert eng.wait_idle(10)
    assert executor.ran == []  # no durable intent, no action
    problem = eng.problem() or ""
    assert "is full" in problem and "fail_closed" in problem
    assert [d["event"]["id"] for d in read_spool(audit.spool_dir)] == spooled  # nothing deleted

    for segment in audit._spool.sealed():  # what a shipper does once Elasticsearch took them
        audit._spool.remove(segment)
    assert eng.gate.reconcile() == 3
    assert eng.wait_idle(10)
    assert sorted(executor.ran) == sorted(d.id for d in decisions)
    assert eng.problem() is None
