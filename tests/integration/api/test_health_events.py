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
    answer = push(api, {**good, "xid": 9999, "labels": {"pool_": "p q"}})  # not a domain
    assert answer.status_code == 200, answer.text
    answer = push(api, {**good, "pool": "a100/../prod"})
    assert answer.status_code == 400
    assert answer.json()["detail"].startswith("events[0].pool: the pool is not a label value")
    answer = api.call(
        "alertmanager", "POST", "/api/v1/health/events", json={"events": [], "boot_id": ""}
    )
    assert answer.status_code == 400
    assert answer.json()["detail"].startswith("boot_id: String should have at least 1 char")
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


LABEL_RULES = HEALTH_RULES.replace("        target: [node]\n", "")
"""The quarantine's target: the alert's labels (as an executor sees them)."""


def targets(api: Harness) -> dict[str, dict[str, str]]:
    """Each node's quarantine decision's target labels."""
    api.settle()
    with api.lock:
        return {
            d.target.labels["node"]: dict(d.target.labels)
            for d, _ in api.decisions
            if d.policy == POLICY
        }


def said(api: Harness, audited: str, counted: str) -> None:
    """The first push's audit document says ``audited``; ``/metrics`` has ``counted``."""
    [call, *_] = [d for d in api.operations() if d["event"]["action"] == "receive_health_events"]
    assert audited in call["message"]
    assert counted in api.call(None, "GET", "/metrics").text


def test_an_agents_labels_are_its_failure_domains_never_what_an_executor_reads(
    tmp_path: Path,
) -> None:
    """An agent (or anyone with the push token) that sends ``pod``, ``namespace`` or
    ``instance`` never chooses what an executor acts on: the engine keeps only the labels
    ``health.ladder.pacing.domains`` names, and says what it left out."""
    domains = {"ladder": {"pacing": {"domains": ["pool", "rack"]}}}
    with running_api(tmp_path, rules=LABEL_RULES, health=domains) as api:
        labels = {
            "rack": "r1",
            "pod": "healthy-pod",
            "namespace": "prod",
            "instance": "elsewhere.example:9835",
            "zone": "z1",
        }
        sent = {**event(api, "l-1", "n1", "GPU-a", 79), "pool": "a100", "labels": labels}
        assert push(api, sent).json()["faults"] == 1
        target = targets(api)["n1"]
        assert {k: target[k] for k in ("node", "uuid", "pool", "rack")} == {
            "node": "n1",
            "uuid": "GPU-a",
            "pool": "a100",
            "rack": "r1",
        }
        assert not {"pod", "namespace", "instance", "zone"} & set(target)
        answer = push(api, {**sent, "id": "l-2", "labels": {"rack": "r 12"}})
        assert answer.status_code == 400
        assert answer.json()["detail"] == (
            "events[0].labels.rack: the value is not a label value (letters, digits, '-', "
            "'_' or '.', beginning and ending with a letter or digit)"
        )
        long = {"rack": "r" * 64, "zone": "z" * 64}
        answer = push(api, sent, {**sent, "id": "l-3", "labels": long})
        assert answer.status_code == 400
        assert answer.json()["detail"] == (
            "events[1].labels.rack: the value is 64 characters long (at most 63)"
        )
        said(
            api,
            "labels left out (not in health.ladder.pacing.domains): instance, namespace, pod, zone",
            'gpuops_health_labels_ignored_total{reason="not_a_domain"} 4.0',
        )


def test_the_values_kept_of_a_domain_are_bounded_also_after_a_restart(tmp_path: Path) -> None:
    """Past ``max_domain_values`` values of a domain label, a further value is left out (the
    node is paced in ``rack=default``), said in the audit; the domains the store keeps count
    after a restart."""
    domains = {"ladder": {"pacing": {"domains": ["pool", "rack"]}}}
    with running_api(tmp_path, rules=LABEL_RULES, health=domains) as api:
        api.engine.store.save_domain("rack=r0", '{"name": "rack=r0"}')
    with running_api(tmp_path, rules=LABEL_RULES, health=domains) as api:
        api.engine.health.max_domain_values = 3
        sent = [
            {**event(api, f"d-{i}", f"n{i}", "GPU-0", 79), "labels": {"rack": f"r{i}"}}
            for i in range(1, 4)
        ]
        sent.append({**event(api, "d-4", "n4", "GPU-0", 79), "labels": {"rack": "r0"}})
        assert push(api, *sent).json()["faults"] == 4
        racks = {node: labels.get("rack") for node, labels in targets(api).items()}
        assert racks == {"n1": "r1", "n2": "r2", "n3": None, "n4": "r0"}
        said(
            api,
            "label rack='r3' of n3 left out: 3 values of rack are kept already (the node is "
            "paced in rack=default)",
            'gpuops_health_labels_ignored_total{reason="over_bound"} 1.0',
        )


def test_an_application_xid_from_before_its_nodes_reboot_never_acts_a_hardware_fault_does(
    api: Harness,
) -> None:
    """The agent tags each event with the boot it was seen in and sends its boot now: an
    application's XID its queue kept from before a reboot is recorded and skipped and counts
    in no XID's window; a GPU fallen off the bus before the reboot still acts (the reboot may
    be its own doing, and the GPU, gone, is never reported again)."""

    def send(*events: dict[str, Any], boot: str | None) -> Any:
        body: dict[str, Any] = {"events": list(events)}
        if boot is not None:
            body["boot_id"] = boot
        answer = api.call("alertmanager", "POST", "/api/v1/health/events", json=body)
        assert answer.status_code == 200, answer.text
        return answer.json()

    fallen = {**event(api, "b-1", "n9", "GPU-9", 79), "boot_id": "boot-1"}
    assert send(fallen, boot="boot-2") == {
        "accepted": 1,
        "duplicates": 0,
        "faults": 1,
        "skipped": 0,
    }
    assert send(fallen, boot="boot-2")["duplicates"] == 1
    assert quarantined(api) == ["n9"]
    crashes = [
        {**event(api, f"c-{i}", "n8", "GPU-8", 45, ago=30.0 * (i + 2)), "boot_id": "boot-1"}
        for i in range(9)
    ]
    assert send(*crashes, boot="boot-2")["skipped"] == 9
    tenth = {**event(api, "c-9", "n8", "GPU-8", 45), "boot_id": "boot-2"}
    assert send(tenth, boot="boot-2")["faults"] == 0  # the earlier boot's nine do not count
    assert quarantined(api) == ["n9"]
    said(
        api,
        "(GPU-9 on n9: XID 79 (GPU has fallen off the bus) x1: GpuFault raised (quarantine))",
        'gpuops_health_events_total{kind="xid",outcome="before_reboot"} 9.0',
    )
    pushes = [
        d["message"] for d in api.operations() if d["event"]["action"] == "receive_health_events"
    ]
    assert any("skipped c-0 (GPU-8 on n8): from before the node's reboot" in m for m in pushes)
    older_agent = event(api, "o-1", "n7", "GPU-7", 79)  # no boot id: acts as it always did
    assert send(older_agent, boot="boot-2")["faults"] == 1
    no_boot_now = {**event(api, "o-2", "n6", "GPU-6", 79), "boot_id": "boot-1"}
    assert send(no_boot_now, boot=None)["faults"] == 1
    assert quarantined(api) == ["n6", "n7", "n9"]
