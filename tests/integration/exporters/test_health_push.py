"""The node agent pushes an XID the moment the (fake) NVML reports it; the engine quarantines
the node through its alert inbox and the gate, once; while the engine is away the events wait
and are sent when it is back."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gpuops.exporters.nvml.push import PATH, HealthPusher
from gpuops.exporters.nvml.reboot import boot_id_of
from gpuops.exporters.nvml.scenarios import healthy_h100
from gpuops.exporters.nvml.server import ExporterServer
from gpuops.sources.promproc import free_port
from tests.integration.api.harness import Harness, running_api
from tests.integration.api.test_health_events import (
    HEALTH_RULES,
    POLICY,
    PROFILE_RULES,
    quarantined,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Harness]:
    with running_api(tmp_path, rules=HEALTH_RULES) as harness:
        yield harness


def agent(
    api: Harness, url: str, node: str, pool: str = "", labels: dict[str, str] | None = None
) -> tuple[ExporterServer, HealthPusher]:
    fake = healthy_h100()
    token = api.tokens["alertmanager"]
    pusher = HealthPusher(url, token, node, pool=pool, labels=labels, min_backoff_s=0.05)
    server = ExporterServer(fake, host="127.0.0.1", port=0, xid_poll_ms=20, push=pusher)
    server.start()
    wait_for(lambda: server.xids is not None and server.xids.watching == 8, 10, "XID events")
    return server, pusher


def test_an_xid_79_reaches_the_engine_and_quarantines_its_node_once(api: Harness) -> None:
    server, pusher = agent(api, api.url, "node-7")
    try:
        fake = server.session.backend
        fake.inject_xid(3, 79)
        wait_for(lambda: quarantined(api) == ["node-7"], 30, "node-7 quarantined")
        fake.inject_xid(3, 13)  # one application XID: counted, nothing more
        wait_for(lambda: pusher.sent == 2, 10, "the second event sent")
        assert quarantined(api) == ["node-7"]
        [decision] = [d for d, _ in api.decisions if d.policy == POLICY]
        assert decision.target.labels == {"node": "node-7"}
    finally:
        server.close()


def test_events_wait_while_the_engine_is_away(api: Harness) -> None:
    away = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    server, pusher = agent(api, away, "node-9")
    try:
        server.session.backend.inject_xid(5, 48)
        wait_for(lambda: pusher.pending() == 1, 10, "the event queued")
        wait_for(lambda: pusher.failures >= 3, 10, "sendings that failed")
        assert pusher.pending() == 1 and pusher.sent == 0
        pusher.url = api.url + PATH  # the engine is back
        wait_for(lambda: pusher.pending() == 0, 30, "the queued event sent")
        wait_for(lambda: quarantined(api) == ["node-9"], 30, "node-9 quarantined")
    finally:
        server.close()


def test_the_agents_pool_chooses_the_profile_and_its_domain_labels_reach_the_decision(
    tmp_path: Path,
) -> None:
    observing = "        action: {type: migrate, executor: log}\n        mode: dry-run"
    rules = PROFILE_RULES.replace("        target: [node]\n" + observing, observing)
    assert rules != PROFILE_RULES  # the observing policy's targets: the alert's labels
    domains = {"ladder": {"pacing": {"domains": ["pool", "rack", "zone"]}}}
    with running_api(tmp_path / "profiles", rules=rules, health=domains) as api:
        api.engine.health.profiles["canary"] = "observe"
        labels = {"rack": "r12", "zone": "z1", "pod": "other-pod", "namespace": "prod"}
        server, pusher = agent(api, api.url, "node-3", pool="canary", labels=labels)
        try:
            server.session.backend.inject_xid(0, 79)
            wait_for(lambda: pusher.sent == 1, 10, "the event sent")
            api.settle()
            with api.lock:
                done = [(d.policy, d.verdict.value) for d, _ in api.decisions]
                [decision] = [d for d, _ in api.decisions]
            assert done == [("observe-faulty-gpu-node", "dry_run")]
            assert (decision.target.labels["rack"], decision.target.labels["zone"]) == (
                "r12",
                "z1",
            )
            assert "pod" not in decision.target.labels  # not a failure domain: left out
            assert "namespace" not in decision.target.labels
        finally:
            server.close()


def test_a_refused_token_keeps_the_events(api: Harness) -> None:
    pusher = HealthPusher(api.url, "not-a-token", "node-1", min_backoff_s=0.05)
    pusher.start()
    try:
        pusher.xid("GPU-x", 79)
        wait_for(lambda: pusher.failures >= 3, 10, "sendings refused")
        assert pusher.pending() == 1 and pusher.sent == 0  # 401: sent again, never dropped
        answer = requests.post(api.url + PATH, json={"events": []}, timeout=5)
        assert answer.status_code == 401
    finally:
        pusher.stop()


def test_events_queued_on_disk_outlive_the_agent_and_quarantine_once(
    api: Harness, tmp_path: Path
) -> None:
    """Queued while the engine is away, the events survive the agent's restart and are
    delivered by the next one; a crash between the engine's answer and the removal of the
    files sends them again, and the engine counts them as duplicates."""
    queue = tmp_path / "agent-state" / "health-events"
    token = api.tokens["alertmanager"]
    away = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    first = HealthPusher(away, token, "node-4", min_backoff_s=0.05, queue_dir=queue)
    first.start()
    try:
        first.xid("GPU-4", 79)
        first.xid("GPU-4", 13)
        wait_for(lambda: first.failures >= 2, 10, "sendings that failed")
    finally:
        first.stop()  # the agent stops with its events unsent
    assert first.sent == 0 and len(list(queue.glob("*.json"))) == 2
    left = {p.name: p.read_bytes() for p in queue.glob("*.json")}

    second = HealthPusher(api.url, token, "node-4", min_backoff_s=0.05, queue_dir=queue)
    assert second.pending() == 2
    second.start()
    try:
        wait_for(lambda: second.pending() == 0, 30, "the events a former agent left sent")
    finally:
        second.stop()
    assert second.sent == 2 and not list(queue.glob("*.json"))
    wait_for(lambda: quarantined(api) == ["node-4"], 30, "node-4 quarantined")

    for name, data in left.items():  # as a crash after the engine's 200 leaves them
        (queue / name).write_bytes(data)
    third = HealthPusher(api.url, token, "node-4", min_backoff_s=0.05, queue_dir=queue)
    third.start()
    try:
        wait_for(lambda: third.pending() == 0, 30, "the events sent again")
    finally:
        third.stop()
    metrics = api.call(None, "GET", "/metrics").text
    assert 'gpuops_health_events_total{kind="xid",outcome="duplicate"} 2.0' in metrics
    assert quarantined(api) == ["node-4"]
    with api.lock:
        assert len([d for d, _ in api.decisions if d.policy == POLICY]) == 1


def test_an_unreadable_queued_event_is_set_aside_and_the_exporter_serves(
    api: Harness, tmp_path: Path
) -> None:
    queue = tmp_path / "health-events"
    queue.mkdir()
    (queue / "000000000001.json").write_text("{not json", encoding="utf-8")
    left = {"id": "node-2-old-1", "node": "node-2", "gpu": "GPU-2", "kind": "gpu_lost"}
    (queue / "000000000002.json").write_text(json.dumps({**left, "at": time.time()}), "utf-8")
    pusher = HealthPusher(
        api.url, api.tokens["alertmanager"], "node-2", min_backoff_s=0.05, queue_dir=queue
    )
    assert pusher.pending() == 1 and pusher.dropped == 1
    server = ExporterServer(healthy_h100(), host="127.0.0.1", port=0, xid_poll_ms=20, push=pusher)
    server.start()
    try:
        metrics = requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5)
        assert metrics.status_code == 200 and "nvml_gpu_up" in metrics.text
        assert 'nvml_agent_health_events_total{outcome="dropped"} 1.0' in metrics.text
        assert "nvml_agent_health_queue_on_disk 1.0" in metrics.text
        wait_for(lambda: pusher.sent == 1, 10, "the readable event sent")
        text = requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5).text
        assert 'nvml_agent_health_events_total{outcome="sent"} 1.0' in text
        assert "nvml_agent_health_events_queued 0.0" in text
        wait_for(lambda: quarantined(api) == ["node-2"], 30, "node-2 quarantined")
    finally:
        server.close()
    assert sorted(p.name for p in queue.iterdir()) == ["000000000001.json.unreadable"]


def test_events_queued_before_a_reboot_reach_the_engine_and_a_lost_gpu_still_acts(
    api: Harness, tmp_path: Path
) -> None:
    """A node's events wait on disk while the engine is away; the node reboots; the new agent
    sends them tagged with the boot they were seen in and its boot now: the engine records the
    crashed job's XID and counts it nowhere, and quarantines the node for the GPU lost before
    the reboot (gone since, NVML never reports it again)."""
    queue = tmp_path / "agent-state" / "health-events"
    boot = tmp_path / "boot_id"
    boot.write_text("boot-1\n", encoding="utf-8")
    read_boot = boot_id_of(boot)
    token = api.tokens["alertmanager"]
    away = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    before = HealthPusher(
        away, token, "node-5", min_backoff_s=0.05, queue_dir=queue, boot_id=read_boot
    )
    before.start()
    try:
        before.xid("GPU-5", 45)
        before.lost("GPU-5")
        wait_for(lambda: before.failures >= 2, 10, "sendings that failed")
    finally:
        before.stop()  # the node reboots with the events unsent
    boot.write_text("boot-2\n", encoding="utf-8")
    after = HealthPusher(
        api.url, token, "node-5", min_backoff_s=0.05, queue_dir=queue, boot_id=read_boot
    )
    after.start()
    try:
        wait_for(lambda: after.pending() == 0, 30, "the events of the former boot sent")
        assert after.sent == 2
        wait_for(lambda: quarantined(api) == ["node-5"], 30, "node-5 quarantined")
        metrics = api.call(None, "GET", "/metrics").text
        assert 'gpuops_health_events_total{kind="xid",outcome="before_reboot"} 1.0' in metrics
        assert 'gpuops_health_events_total{kind="gpu_lost",outcome="fault"} 1.0' in metrics
    finally:
        after.stop()
