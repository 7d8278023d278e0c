"""``POST /api/v1/health/events``: node agents' XIDs and lost GPUs, counted against the XID
catalogue; a faulty GPU raises ``GpuFault`` in the alert inbox, whose policy quarantines the
node once, however often the event is sent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.api.harness import RULES, Harness, running_api

POLICY = "quarantine-faulty-gpu-node"
HEALTH_RULES = (
    RULES
    + f"""\
      - policy: {POLICY}
        trigger: {{alertmanager: {{alertname: GpuFault}}}}
        target: [node]
        action: {{type: migrate, executor: log}}
        mode: enforce
"""
)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Harness]:
    with running_api(tmp_path, rules=HEALTH_RULES, api={"max_body_bytes": 64 * 1024}) as h:
        yield h


def event(
    api: Harness, id: str, node: str, gpu: str, xid: int | None, ago: float = 1.0
) -> dict[str, Any]:
    doc: dict[str, Any] = {"id": id, "node": node, "gpu": gpu, "at": api.clock() - ago}
    doc.update({"kind": "xid", "xid": xid} if xid is not None else {"kind": "gpu_lost"})
    return doc


def push(api: Harness, *events: dict[str, Any], role: str | None = "alertmanager") -> Any:
    return api.call(role, "POST", "/api/v1/health/events", json={"events": list(events)})


def quarantined(api: Harness) -> list[str]:
    api.settle()
    with api.lock:
        return sorted(
            d.target.labels["node"]
            for d, o in api.decisions
            if d.policy == POLICY and o is not None and o.ok
        )


def test_a_fallen_off_gpu_quarantines_its_node_once_however_often_sent(api: Harness) -> None:
    fallen = event(api, "n1-1", "n1", "GPU-a", 79)
    answer = push(api, fallen)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"accepted": 1, "duplicates": 0, "faults": 1, "skipped": 0}
    assert push(api, fallen).json() == {"accepted": 0, "duplicates": 1, "faults": 0, "skipped": 0}
    replayed = {**fallen, "id": "n1-1-again"}  # the same fault under another id: same episode
    assert push(api, replayed).json()["faults"] == 1
    assert quarantined(api) == ["n1"]
    [decision] = [d for d, o in api.decisions if d.policy == POLICY]
    assert decision.target.key == "node=n1"
    metrics = api.call(None, "GET", "/metrics").text
    assert 'gpuops_health_events_total{kind="xid",outcome="fault"} 2.0' in metrics
    assert 'gpuops_health_events_total{kind="xid",outcome="duplicate"} 1.0' in metrics
    assert "gpuops_health_time_to_quarantine_seconds_count 1.0" in metrics


def test_a_crashed_jobs_xid_45_on_80_nodes_quarantines_none_past_threshold_one(
    api: Harness,
) -> None:
    flood = [event(api, f"crash-{n}", f"node{n:03d}", f"GPU-{n:03d}", 45) for n in range(80)]
    assert push(api, *flood).json() == {"accepted": 80, "duplicates": 0, "faults": 0, "skipped": 0}
    assert quarantined(api) == []
    repeated = [event(api, f"n7-{i}", "node007", "GPU-007", 45, ago=30.0 * i) for i in range(1, 10)]
    answer = push(api, *repeated).json()
    assert answer["faults"] >= 1  # the tenth XID 45 within 10 minutes on GPU-007
    assert quarantined(api) == ["node007"]


def test_a_lost_gpu_quarantines_its_node(api: Harness) -> None:
    assert push(api, event(api, "lost-1", "n2", "GPU-b", None)).json()["faults"] == 1
    assert quarantined(api) == ["n2"]


def test_an_event_older_than_the_nodes_return_does_nothing_also_after_a_restart(
    tmp_path: Path,
) -> None:
    with running_api(tmp_path, rules=HEALTH_RULES) as first:
        first.engine.health.returned("n3", first.clock() - 10)
        old = event(first, "old-1", "n3", "GPU-c", 79, ago=60.0)
        assert push(first, old).json() == {
            "accepted": 1,
            "duplicates": 0,
            "faults": 0,
            "skipped": 1,
        }
    with running_api(tmp_path, rules=HEALTH_RULES) as second:
        replayed = event(second, "old-1-replayed", "n3", "GPU-c", 79, ago=60.0)
        assert push(second, replayed).json()["skipped"] == 1
        assert quarantined(second) == []
        new = event(second, "new-1", "n3", "GPU-c", 79, ago=1.0)
        assert push(second, new).json()["faults"] == 1
        assert quarantined(second) == ["n3"]


def test_an_event_older_than_max_event_age_never_acts(api: Harness) -> None:
    old = event(api, "stale-1", "n7", "GPU-g", 79, ago=2 * 3600.0)
    assert push(api, old).json() == {"accepted": 1, "duplicates": 0, "faults": 0, "skipped": 1}
    lost = event(api, "stale-2", "n7", "GPU-g", None, ago=2 * 3600.0)
    assert push(api, lost).json()["skipped"] == 1
    assert quarantined(api) == []
    metrics = api.call(None, "GET", "/metrics").text
    assert 'gpuops_health_events_total{kind="xid",outcome="stale"} 1.0' in metrics


def test_an_unknown_xid_is_recorded_only_and_the_skip_audited(api: Harness) -> None:
    assert push(api, event(api, "u-1", "n4", "GPU-d", 9999)).json()["skipped"] == 1
    assert quarantined(api) == []
    [call] = [d for d in api.operations() if d["event"]["action"] == "receive_health_events"]
    assert call["message"].endswith(
        "(skipped u-1 (GPU-d on n4): XID 9999 is not in the XID catalogue)"
    )


def test_bad_senders_and_bodies_are_refused_naming_what(api: Harness) -> None:
    good = event(api, "x-1", "n5", "GPU-e", 79)
    assert push(api, good, role=None).status_code == 401
    assert push(api, good, role="developer").status_code == 403
    no_xid = {**good, "xid": None}
    answer = push(api, no_xid)
    assert answer.status_code == 400
    assert answer.json()["detail"] == "events[0]: an xid event needs xid (the XID code)"
    answer = push(api, good, {**good, "id": "x-2", "at": "soon"})
    assert answer.status_code == 400
    assert answer.json()["detail"].startswith("events[1].at: Input should be a valid number")
    answer = api.call("alertmanager", "POST", "/api/v1/health/events", json={"event": []})
    assert answer.status_code == 400
    assert answer.json()["detail"].startswith("events: Field required; event: Extra inputs")
    answer = push(api, {**good, "labels": {"rack-1": "r1"}})
    assert answer.status_code == 400
    assert answer.json()["detail"] == (
        "events[0].labels: 'rack-1' is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)"
    )
    answer = push(api, {**good, "labels": {"pool": "a"}})
    assert answer.status_code == 400
    assert answer.json()["detail"] == (
        "events[0].labels: 'pool' is a label of the GpuFault alert itself"
    )
    big = [event(api, f"b-{i}", "n6", "GPU-f", 79) for i in range(1000)]
    assert push(api, *big).status_code == 413
    assert quarantined(api) == []


def test_counts_and_duplicates_survive_a_restart(tmp_path: Path) -> None:
    with running_api(tmp_path, rules=HEALTH_RULES) as first:
        nine = [event(first, f"r-{i}", "n8", "GPU-8", 45, ago=30.0 * (i + 1)) for i in range(9)]
        assert push(first, *nine).json()["faults"] == 0
    with running_api(tmp_path, rules=HEALTH_RULES) as second:
        assert push(second, nine[0]).json()["duplicates"] == 1
        assert quarantined(second) == []
        tenth = event(second, "r-9", "n8", "GPU-8", 45)
        assert push(second, tenth).json()["faults"] == 1
        assert quarantined(second) == ["n8"]


PROFILE_RULES = (
    RULES
    + """\
      - policy: quarantine-faulty-gpu-node
        trigger: {alertmanager: {alertname: GpuFault, profile: quarantine}}
        target: [node]
        action: {type: migrate, executor: log}
        mode: enforce
      - policy: observe-faulty-gpu-node
        trigger: {alertmanager: {alertname: GpuFault, profile: observe}}
        target: [node]
        action: {type: migrate, executor: log}
        mode: dry-run
"""
)


def test_a_pool_that_observes_records_a_dry_run_and_quarantines_nothing(tmp_path: Path) -> None:
    with running_api(tmp_path, rules=PROFILE_RULES) as api:
        api.engine.health.profiles["canary"] = "observe"
        canary = {**event(api, "c-1", "c1", "GPU-c1", 79), "pool": "canary"}
        prod = {**event(api, "p-1", "p1", "GPU-p1", 79), "pool": "prod"}
        answer = push(api, canary, prod)
        assert answer.json()["faults"] == 2
        assert quarantined(api) == ["p1"]
        with api.lock:
            observed = [
                (d.target.labels["node"], d.verdict.value)
                for d, _ in api.decisions
                if d.policy == "observe-faulty-gpu-node"
            ]
        assert observed == [("c1", "dry_run")]
        [call] = [d for d in api.operations() if d["event"]["action"] == "receive_health_events"]
        assert (
            "GPU-c1 on c1: XID 79 (GPU has fallen off the bus) x1: GpuFault raised (observe)"
            in (call["message"])
        )
