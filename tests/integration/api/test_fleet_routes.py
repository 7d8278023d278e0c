"""``/api/v1/fleet`` and ``/api/v1/timeline`` over a real Prometheus scraping the simulated
fleet: a node goes down, jobs queue, the engine drains the node, and the fleet says all of it
(the node down and drained by the decision, its GPUs without data, the queue), as does the
timeline (the queue over time, the decision with its outcome)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from gpuops.sim.fleet import FleetConfig, FleetSim
from gpuops.sources.promproc import PrometheusServer
from tests.integration.api.harness import Harness, running_api
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

RULES = """\
groups:
  - name: fleet-page
    interval: 1h
    rules:
      - policy: migrate-off-down-nodes
        expr: up{job="gpu-nodes"} == 0
        target: [node]
        action: {type: migrate, executor: fleet}
        mode: enforce
      - policy: quarantine-faulty-gpu-node
        trigger: {alertmanager: {alertname: GpuFault}}
        target: [node]
        action: {type: migrate, executor: log}
        mode: enforce
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FleetSim, Harness]]:
    workdir: Path = tmp_path_factory.mktemp("fleet-page")
    config = FleetConfig(arrival_rate_per_min=0.0, sd_file=str(workdir / "gpu-nodes.json"))
    with FleetSim(config) as fleet:
        prom_config = "global:\n  scrape_interval: 1s\n" + fleet.scrape_config("1s")
        with (
            PrometheusServer(workdir / "prom", prom_config) as prom,
            running_api(
                workdir / "engine",
                rules=RULES,
                prometheus=prom.url,
                executors={"fleet": {"url": fleet.control_url}},
            ) as harness,
        ):
            yield fleet, harness


def get(h: Harness, path: str, **params: Any) -> dict[str, Any]:
    h.clock.now = time.time()  # the engine asks Prometheus at its own clock
    r = h.call("developer", "GET", path, params=params)
    assert r.status_code == 200, r.text
    answer: dict[str, Any] = r.json()
    return answer


def nodes(h: Harness) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in get(h, "/api/v1/fleet")["nodes"]}


def test_a_down_node_queued_jobs_and_the_drain_are_on_the_fleet_and_timeline(
    stack: tuple[FleetSim, Harness],
) -> None:
    fleet, h = stack

    def all_up() -> dict[str, dict[str, Any]] | None:
        found = nodes(h)
        ready = len(found) == 4 and all(n["state"] == "up" for n in found.values())
        jobs = any(g["job"] for n in found.values() for g in n["gpus"])  # the fleet's target
        return found if ready and jobs else None

    up = wait_for(all_up, timeout=30, what="four nodes up, the initial jobs on their GPUs")
    assert all(len(n["gpus"]) == 4 and n["health"] == "ok" for n in up.values())
    started = time.time()

    control = fleet.control_url
    requests.post(f"{control}/api/v1/nodes/node-2/fail", timeout=5).raise_for_status()
    for _ in range(8):
        job = {"gpus": 4, "duration_s": 3600, "pool": "default"}
        requests.post(f"{control}/api/v1/jobs", json=job, timeout=5).raise_for_status()
    down = wait_for(
        lambda: (n := nodes(h)["node-2"])["state"] == "down" and n,
        timeout=30,
        what="node-2 down",
    )
    assert down["health"] == "failed" and down["state_source"] == 'up{job="gpu-nodes"} == 0'
    assert all(g["health"] == "no_data" and g["utilization"] is None for g in down["gpus"])
    queued = wait_for(
        lambda: (f := get(h, "/api/v1/fleet"))["pending_jobs"] and f, timeout=30, what="a queue"
    )
    assert queued["pending_jobs"] >= 4 and queued["queue"][0]["pool"] == "default"

    policy = h.engine.rules.policy("migrate-off-down-nodes")
    assert policy is not None
    h.clock.now = time.time()
    h.engine.evaluate_policy(policy, h.clock.now)
    h.settle()
    (fire,) = h.executed("migrate-off-down-nodes")
    assert fire.ok, fire
    node2 = nodes(h)["node-2"]
    (hold,) = node2["holds"]
    assert (hold["what"], hold["action"], hold["policy"]) == (
        "drained",
        "migrate",
        "migrate-off-down-nodes",
    )
    decision = h.engine.store.decision(hold["decision_id"])
    assert decision is not None and decision.decision.target.labels["node"] == "node-2"
    assert node2["state"] == "down"  # the scrape says down; the hold says what gpuops did

    only_other = get(h, "/api/v1/fleet", pool="no-such-pool")
    assert only_other["nodes"] == [] and only_other["queue"] == []

    timeline = wait_for(
        lambda: (
            (t := get(h, "/api/v1/timeline", since=started - 60))["queue"]
            and max(p["value"] for p in t["queue"][0]["points"]) >= 4
            and t
        ),
        timeout=30,
        what="the queue on the timeline",
    )
    (event,) = [e for e in timeline["events"] if e["id"] == hold["decision_id"]]
    assert (event["action"], event["verdict"], event["outcome"]) == (
        "migrate",
        "execute",
        "success",
    )
    assert event["effect"].startswith("node-2 drained") and event["state"] in ("done", "no effect")
    assert hold["effect"] == event["effect"]
    assert timeline["utilization"][0]["name"] == "default"
    assert not timeline["errors"]
    # a pool's timeline: node-2's decision is in pool default, not in another one
    mine = get(h, "/api/v1/timeline", since=started - 60, pool="default")
    assert hold["decision_id"] in {e["id"] for e in mine["events"]}
    other = get(h, "/api/v1/timeline", since=started - 60, pool="gpu-b")
    assert other["events"] == [] and other["queue"] == [] and not other["errors"]


def test_bad_ranges_and_pools_are_refused_by_name(stack: tuple[FleetSim, Harness]) -> None:
    _, h = stack
    r = h.call("developer", "GET", "/api/v1/timeline", params={"since": 100, "until": 50})
    assert r.status_code == 422 and "since (100) must be before until (50)" in r.text
    r = h.call("developer", "GET", "/api/v1/timeline", params={"since": 0, "until": 9e6})
    assert r.status_code == 422 and "at most 604800 s" in r.text
    r = h.call("developer", "GET", "/api/v1/fleet", params={"pool": "a b"})
    assert r.status_code == 422 and "pool" in r.text
    assert h.call(None, "GET", "/api/v1/fleet").status_code == 401


def test_an_alert_triggered_quarantine_holds_its_node_until_the_alert_resolves(
    stack: tuple[FleetSim, Harness],
) -> None:
    _, h = stack
    fault = h.alert("GpuFault", node="node-1", uuid="GPU-x")
    assert h.notify(fault).ok
    h.settle()
    (hold,) = nodes(h)["node-1"]["holds"]
    assert (hold["what"], hold["policy"], hold["undo"]) == (
        "quarantined",
        "quarantine-faulty-gpu-node",
        None,
    )
    assert h.notify({**fault, "status": "resolved"}).ok
    h.settle()
    assert nodes(h)["node-1"]["holds"] == []
