"""The control API over HTTP: every endpoint, idempotency, 4xx reasons, fail/restore sockets."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
import requests

from gpuops.sim.fleet import FleetSim
from tests.waiting import wait_for


def api(fleet: FleetSim, method: str, path: str, body: Any = None) -> requests.Response:
    return requests.request(method, f"{fleet.control_url}/api/v1{path}", json=body, timeout=5)


def state(fleet: FleetSim) -> dict[str, Any]:
    doc: dict[str, Any] = api(fleet, "GET", "/state").json()
    return doc


def gpu(fleet: FleetSim, node: str, index: int) -> dict[str, Any]:
    n = next(n for n in state(fleet)["nodes"] if n["name"] == node)
    found: dict[str, Any] = n["gpus"][index]
    return found


def refuses(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_state_document_has_the_contract_shape(fleet: FleetSim) -> None:
    doc = state(fleet)
    assert set(doc) >= {"time", "nodes", "queue", "jobs", "counters"}
    assert isinstance(doc["time"], float)
    node = doc["nodes"][0]
    assert set(node) == {"name", "pool", "state", "port", "model", "driver_version", "gpus"}
    assert node["driver_version"] == "550.54.15"
    assert node["port"] == fleet.node_ports["node-0"]
    assert set(node["gpus"][0]) == {
        "index", "uuid", "job", "project", "tenants", "utilization", "clock_locked_mhz",
        "max_clock_mhz",
    }  # fmt: skip
    assert set(doc["jobs"][0]) >= {"id", "project", "profile", "gpus", "state", "node"}
    assert doc["counters"] == {
        "reclaimed": 0, "migrated": 0, "requeued_by_migrate": 0, "nodes_added": 0,
        "downclocked": 0, "restored": 0, "packed": 0, "consolidated": 0, "moved": 0, "culled": 0,
    }  # fmt: skip
    assert doc["queue"] == {"default": 0}


def test_time_advances_in_the_background(fleet: FleetSim) -> None:
    wait_for(lambda: state(fleet)["time"] > 0.3)


def test_reclaim_then_repeat_is_a_noop(fleet: FleetSim) -> None:
    uuid = gpu(fleet, "node-0", 2)["uuid"]
    r = api(fleet, "POST", f"/gpus/{uuid}/reclaim")
    assert r.status_code == 200
    assert r.json()["changed"]["job"] == "job-1"
    assert gpu(fleet, "node-0", 0)["job"] is None
    assert api(fleet, "POST", f"/gpus/{uuid}/reclaim").json() == {"changed": {}}
    assert state(fleet)["counters"]["reclaimed"] == 1


def test_repeated_decision_id_replays_the_first_response(fleet: FleetSim) -> None:
    first = api(fleet, "POST", "/pools/default/scale_out", {"nodes": 1, "decision_id": "d-1"})
    again = api(fleet, "POST", "/pools/default/scale_out", {"nodes": 1, "decision_id": "d-1"})
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json() == {"changed": {"pool": "default", "added": ["node-4"]}}
    assert len(state(fleet)["nodes"]) == 5
    third = api(fleet, "POST", "/pools/default/scale_out", {"nodes": 1, "decision_id": "d-2"})
    assert third.json()["changed"]["added"] == ["node-5"]


def test_clocks_lock_is_visible_in_metrics_and_reset_restores(fleet: FleetSim) -> None:
    uuid = gpu(fleet, "node-0", 0)["uuid"]
    r = api(fleet, "POST", f"/gpus/{uuid}/clocks", {"max_clock_mhz": 900})
    assert r.json()["changed"]["max_clock_mhz"] == 900
    assert gpu(fleet, "node-0", 0)["clock_locked_mhz"] == 900
    text = requests.get(fleet.node_url("node-0"), timeout=5).text
    for clock in ("graphics", "sm"):
        line = next(
            ln for ln in text.splitlines()
            if ln.startswith("nvml_gpu_clock_hertz{") and f'clock="{clock}"' in ln
            and f'uuid="{uuid}"' in ln
        )  # fmt: skip
        assert float(line.split()[-1]) <= 900e6
    r = api(fleet, "POST", f"/gpus/{uuid}/clocks", {"max_clock_mhz": 99})
    assert r.status_code == 400
    assert "outside the supported range 210-1410 MHz" in r.json()["error"]
    r = api(fleet, "DELETE", f"/gpus/{uuid}/clocks")
    assert r.json()["changed"]["previous"] == 900
    assert gpu(fleet, "node-0", 0)["clock_locked_mhz"] is None
    assert state(fleet)["counters"]["downclocked"] == 1
    assert state(fleet)["counters"]["restored"] == 1


def test_fail_closes_the_port_and_restore_reopens_it(fleet: FleetSim) -> None:
    port = fleet.node_ports["node-1"]
    assert requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200
    r = api(fleet, "POST", "/nodes/node-1/fail")
    assert r.json() == {"changed": {"node": "node-1", "state": "failed"}}
    assert refuses(port)
    assert json.loads(fleet.sd_file.read_text())[1]["labels"] == {
        "node": "node-1",
        "pool": "default",
    }
    assert api(fleet, "POST", "/nodes/node-1/fail").json() == {"changed": {}}
    assert api(fleet, "POST", "/nodes/node-1/restore").json()["changed"]["state"] == "up"
    assert fleet.node_ports["node-1"] == port
    assert requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 200


def test_migrate_drains_and_reports_moves(fleet: FleetSim) -> None:
    api(fleet, "POST", f"/gpus/{gpu(fleet, 'node-0', 0)['uuid']}/reclaim")
    r = api(fleet, "POST", "/nodes/node-1/migrate").json()["changed"]
    assert r["moved"] == [{"job": "job-2", "from": "node-1", "to": "node-0"}]
    assert r["state"] == "drained" and r["requeued"] == []
    assert state(fleet)["counters"]["migrated"] == 1


def test_a_migrate_that_moved_no_job_is_not_counted_as_one(fleet: FleetSim) -> None:
    """Every GPU busy: node-1's job waits in the queue (requeued), it moved nowhere."""
    r = api(fleet, "POST", "/nodes/node-1/migrate").json()["changed"]
    assert r["moved"] == [] and r["requeued"] == ["job-2"], r
    counters = state(fleet)["counters"]
    assert (counters["migrated"], counters["requeued_by_migrate"]) == (0, 1)


def test_scale_in_removes_the_target_from_file_sd(fleet: FleetSim) -> None:
    api(fleet, "POST", "/pools/default/scale_out", {"nodes": 1})
    assert len(json.loads(fleet.sd_file.read_text())) == 5
    port = fleet.node_ports["node-4"]
    r = api(fleet, "POST", "/pools/default/scale_in", {"nodes": 1})
    assert r.json() == {"changed": {"pool": "default", "removed": ["node-4"]}}
    assert len(json.loads(fleet.sd_file.read_text())) == 4
    assert refuses(port)


def test_jobs_profile_burst_and_arrivals(fleet: FleetSim) -> None:
    free = gpu(fleet, "node-3", 3)
    assert free["job"] is None
    r = api(fleet, "POST", "/jobs", {"gpus": 1, "profile": "notebook", "project": "x",
                                     "gpu_uuids": [free["uuid"]]})  # fmt: skip
    job = r.json()["job"]
    assert job["state"] == "running" and job["node"] == "node-3"
    r = api(fleet, "POST", f"/jobs/{job['id']}/profile", {"profile": "training"})
    assert r.json() == {
        "changed": {"job": job["id"], "profile": "training", "previous": "notebook"}
    }
    r = api(fleet, "POST", "/pools/default/burst", {"count": 12, "gpus": 1, "duration_s": 60})
    assert r.json()["changed"]["queued"] == 12
    assert state(fleet)["queue"] == {"default": 12}
    text = requests.get(f"{fleet.control_url}/metrics", timeout=5).text
    assert 'gpuops_queue_pending_jobs{pool="default",reason="Resources"} 12.0' in text
    assert 'gpuops_queue_pending_jobs{pool="default",reason="JobHeldAdmin"} 0.0' in text
    r = api(fleet, "POST", "/arrivals", {"rate_per_min": 3})
    assert r.json() == {"changed": {"rate_per_min": 3.0, "previous": 0.0}}
    r = api(fleet, "POST", "/jobs", {"gpus": 2, "profile": "light", "project": "y"})
    assert r.json()["job"]["state"] == "queued"


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "error"),
    [
        ("POST", "/gpus/GPU-nope/reclaim", None, 404, "no GPU with uuid 'GPU-nope'"),
        ("POST", "/nodes/node-99/fail", None, 404, "no node named 'node-99'"),
        ("POST", "/pools/xl/scale_out", {"nodes": 1}, 404, "no pool named 'xl'"),
        ("POST", "/jobs/job-999/profile", {"profile": "light"}, 404, "no queued or running job"),
        ("POST", "/pools/default/scale_out", {"nodes": "two"}, 400, "'nodes' must be an integer"),
        ("POST", "/pools/default/scale_out", {"nodes": 0}, 400, "nodes must be within [1, 64]"),
        ("POST", "/pools/default/scale_out", [1], 400, "body must be a JSON object"),
        ("POST", "/jobs", {"gpus": 1, "profile": "gaming"}, 400, "profile 'gaming' is unknown"),
        ("POST", "/jobs", {"gpus": True}, 400, "'gpus' must be an integer"),
        ("POST", "/jobs", {"gpus": 1, "node": "node-0"}, 409, "node node-0 has 0 free GPUs"),
        ("POST", "/arrivals", {}, 400, "'rate_per_min' is required"),
        ("POST", "/arrivals", {"rate_per_min": -1}, 400, "rate_per_min must be a finite number"),
        ("POST", "/nodes/node-0/fail", {"decision_id": 7}, 400, "'decision_id' must be a string"),
        ("GET", "/nodes/node-0/fail", None, 405, "GET is not allowed"),
        ("GET", "/nothing", None, 404, "no route GET /api/v1/nothing"),
    ],
)
def test_bad_requests_say_why(
    fleet: FleetSim, method: str, path: str, body: Any, status: int, error: str
) -> None:
    r = api(fleet, method, path, body)
    assert r.status_code == status
    assert error in r.json()["error"]


def test_malformed_json_is_a_400(fleet: FleetSim) -> None:
    r = requests.post(f"{fleet.control_url}/api/v1/nodes/node-0/fail", data=b"{not json", timeout=5)
    assert r.status_code == 400
    assert r.json()["error"].startswith("body is not valid JSON")
