"""The node agent's HTTP endpoint over the fake NVML: auth, validation, NoPermission, metrics,
idempotency by decision id."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import requests

from gpuops.exporters.nvml import scenarios
from gpuops.exporters.nvml.server import ExporterServer

TOKEN = "s3cret-agent-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
UUID0 = "GPU-00005100-0000-4a1b-9c2d-000000000000"


def post(
    server: ExporterServer, path: str, body: dict[str, Any], **headers: str
) -> requests.Response:
    return requests.post(
        f"http://127.0.0.1:{server.port}{path}", json=body, headers={**AUTH, **headers}, timeout=5
    )


def metrics(server: ExporterServer) -> str:
    return requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5).text


def test_metrics_and_healthz_are_served(serve: Callable[..., ExporterServer]) -> None:
    server = serve(scenarios.healthy_h100(2))
    resp = requests.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5)
    assert resp.status_code == 200
    assert resp.headers["Content-Type"].startswith("text/plain; version=")
    assert f'nvml_gpu_up{{gpu="0",uuid="{UUID0}"}} 1.0' in resp.text
    assert requests.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5).text == "ok\n"


def test_agent_is_off_by_default(serve: Callable[..., ExporterServer]) -> None:
    server = serve(scenarios.healthy_h100(1))
    resp = post(server, f"/api/v1/gpus/{UUID0}/clocks", {"max_clock_mhz": 1100})
    assert resp.status_code == 404
    assert resp.json() == {"error": "the node agent is off (start the exporter with --agent)"}


def test_agent_requires_the_bearer_token(serve: Callable[..., ExporterServer]) -> None:
    fake = scenarios.healthy_h100(1)
    server = serve(fake, TOKEN)
    for headers in ({"Authorization": "Bearer wrong"}, {"Authorization": ""}):
        resp = post(server, f"/api/v1/gpus/{UUID0}/clocks", {"max_clock_mhz": 1100}, **headers)
        assert resp.status_code == 401
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert fake.gpus[0].locked_clocks is None


def test_lock_and_reset_clocks(serve: Callable[..., ExporterServer]) -> None:
    fake = scenarios.healthy_h100(2)
    server = serve(fake, TOKEN)
    resp = post(
        server, f"/api/v1/gpus/{UUID0}/clocks", {"max_clock_mhz": 1095, "decision_id": "d1"}
    )
    assert resp.status_code == 200, resp.text
    assert resp.json() == {
        "action": "lock_clocks",
        "gpu": 0,
        "uuid": UUID0,
        "min_clock_mhz": 345,
        "max_clock_mhz": 1095,
        "replayed": False,
    }
    assert fake.gpus[0].locked_clocks == (345, 1095)
    text = metrics(server)
    assert f'nvml_gpu_clock_locked_hertz{{bound="max",gpu="0",uuid="{UUID0}"}} 1.095e+09' in text
    assert f'nvml_gpu_clock_locked_hertz{{bound="min",gpu="0",uuid="{UUID0}"}} 3.45e+08' in text
    assert f'nvml_gpu_clock_hertz{{clock="graphics",gpu="0",uuid="{UUID0}"}} 1.095e+09' in text
    assert 'nvml_agent_changes_total{action="lock_clocks",result="changed"} 1.0' in text

    resp = post(server, "/api/v1/gpus/0/clocks/reset", {"decision_id": "d2"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["previous_clocks_mhz"] == [345, 1095]
    assert fake.gpus[0].locked_clocks is None
    assert "nvml_gpu_clock_locked_hertz{" not in metrics(server)


def test_same_decision_id_changes_once(serve: Callable[..., ExporterServer]) -> None:
    fake = scenarios.healthy_h100(1)
    server = serve(fake, TOKEN)
    first = post(
        server, "/api/v1/gpus/0/clocks", {"max_clock_mhz": 1200}, **{"Idempotency-Key": "d7"}
    )
    assert first.status_code == 200 and first.json()["replayed"] is False
    fake.gpus[0].locked_clocks = None  # someone reset the clocks by hand meanwhile
    again = post(
        server, "/api/v1/gpus/0/clocks", {"max_clock_mhz": 1200}, **{"Idempotency-Key": "d7"}
    )
    assert again.status_code == 200 and again.json()["replayed"] is True
    assert fake.gpus[0].locked_clocks is None  # no second effect
    other = post(server, "/api/v1/gpus/0/clocks/reset", {"decision_id": "d7"})
    assert other.status_code == 409
    assert other.json()["error"] == (
        "decision d7 was already used for lock_clocks on GPU 0 (lowest-1200 MHz), "
        "not reset_clocks on GPU 0"
    )
    changed = post(
        server, "/api/v1/gpus/0/clocks", {"max_clock_mhz": 1100}, **{"Idempotency-Key": "d7"}
    )
    assert changed.status_code == 409  # same id, other values: not a replay


def test_values_outside_the_supported_range_are_refused(
    serve: Callable[..., ExporterServer],
) -> None:
    fake = scenarios.healthy_h100(1)
    server = serve(fake, TOKEN)
    resp = post(server, "/api/v1/gpus/0/clocks", {"max_clock_mhz": 2500})
    assert resp.status_code == 400
    assert resp.json()["error"] == (
        f"GPU 0 ({UUID0}) supports graphics clocks 345-1980 MHz; asked for 345-2500 MHz"
    )
    resp = post(server, "/api/v1/gpus/0/clocks", {"max_clock_mhz": 900, "min_clock_mhz": 1200})
    assert resp.json()["error"] == "min_clock_mhz 1200 is above max_clock_mhz 900"
    resp = post(server, "/api/v1/gpus/0/clocks", {"max_clock_mhz": "fast"})
    assert (resp.status_code, resp.json()["error"]) == (
        400,
        "max_clock_mhz must be an integer (MHz)",
    )
    resp = post(server, "/api/v1/gpus/0/power-limit", {"watts": 900})
    assert resp.status_code == 400
    assert (
        resp.json()["error"] == f"GPU 0 ({UUID0}) accepts power limits 200-700 W; asked for 900 W"
    )
    resp = post(server, "/api/v1/gpus/GPU-nope/clocks", {"max_clock_mhz": 1100})
    assert (resp.status_code, resp.json()["error"]) == (
        404,
        "no GPU with uuid or index 'GPU-nope' on this node",
    )
    assert fake.gpus[0].locked_clocks is None
    assert 'nvml_agent_changes_total{action="lock_clocks",result="refused"} 2.0' in metrics(server)


def test_power_limit_is_set_in_watts(serve: Callable[..., ExporterServer]) -> None:
    fake = scenarios.healthy_h100(1)
    server = serve(fake, TOKEN)
    resp = post(server, "/api/v1/gpus/0/power-limit", {"watts": 450.5})
    assert resp.status_code == 200, resp.text
    assert resp.json()["power_limit_watts"] == 450.5
    assert fake.gpus[0].power_limit_mw == 450_500
    assert f'nvml_gpu_power_limit_watts{{gpu="0",uuid="{UUID0}"}} 450.5' in metrics(server)


def test_gpu_listing_shows_ranges(serve: Callable[..., ExporterServer]) -> None:
    server = serve(scenarios.healthy_h100(1), TOKEN)
    resp = requests.get(f"http://127.0.0.1:{server.port}/api/v1/gpus", headers=AUTH, timeout=5)
    assert resp.json() == {
        "gpus": [
            {
                "gpu": 0,
                "uuid": UUID0,
                "name": "NVIDIA H100 80GB HBM3",
                "graphics_clock_range_mhz": [345, 1980],
                "power_limit_range_watts": [200.0, 700.0],
                "locked_clocks_mhz": None,
            }
        ]
    }


def test_no_permission_is_a_403_saying_root_is_needed(serve: Callable[..., ExporterServer]) -> None:
    fake = scenarios.no_permission()
    server = serve(fake, TOKEN)
    resp = post(server, "/api/v1/gpus/0/clocks", {"max_clock_mhz": 1100, "decision_id": "d9"})
    assert resp.status_code == 403
    assert resp.json()["error"] == (
        f"nvmlDeviceSetGpuLockedClocks on GPU 0 ({UUID0}) needs root: NVML answered Insufficient "
        "Permissions; run the exporter as root to use the node agent"
    )
    assert fake.gpus[0].locked_clocks is None
    assert post(server, "/api/v1/gpus/0/power-limit", {"watts": 300}).status_code == 403
    # a refused decision is not remembered: it may be retried once the agent runs as root
    fake.no_permission = False
    again = post(server, "/api/v1/gpus/0/clocks", {"max_clock_mhz": 1100, "decision_id": "d9"})
    assert again.status_code == 200 and again.json()["replayed"] is False


def test_lost_gpu_and_missing_library(serve: Callable[..., ExporterServer]) -> None:
    fake = scenarios.healthy_h100(2)
    server = serve(fake, TOKEN)
    fake.gpus[1].lost = True
    resp = post(server, "/api/v1/gpus/1/clocks", {"max_clock_mhz": 1100})
    assert resp.status_code == 410
    missing = serve(scenarios.library_missing(), TOKEN)
    resp = post(missing, "/api/v1/gpus/0/clocks", {"max_clock_mhz": 1100})
    assert resp.status_code == 503
    assert resp.json()["error"] == "NVML is not available on this node (LibraryNotFound)"
