"""A full audit spool fails closed: with the default ``full_policy`` the engine acts
on nothing while the spool cannot take an intent, ``/healthz`` names the reason, nothing already
spooled is deleted, and the actions run once the shipper has made room."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuops.actions.retry import RetryPolicy
from gpuops.audit import AuditLog, AuditSettings
from gpuops.audit.spool import read_spool
from gpuops.runtime import Engine
from gpuops.settings import ApiSettings, QuotaSettings
from tests.builders import build_engine
from tests.fakes.executors import Recorder
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


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[Engine, AuditLog, FakePrometheus, Recorder]]:
    executor = Recorder()
    audit = AuditLog(
        AuditSettings(
            spool_dir=tmp_path / "audit", max_spool_bytes=12_000, segment_max_bytes=3_000
        ),
        host_name="h",
    )
    prom = FakePrometheus()
    eng = build_engine(
        tmp_path,
        RULES,
        source=prom,
        clock=lambda: 2_000_000.0,
        executors={"log": executor},
        audit_log=audit,
        action_retry=RetryPolicy(attempts=1),
        api=ApiSettings(quota=QuotaSettings(executor="log", check_interval=3600)),
    )
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
    assert sorted(executor.ids) == sorted(d.id for d in decisions)
    assert eng.problem() is None
