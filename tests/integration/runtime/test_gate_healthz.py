"""``/healthz`` of the running API is red, with the reason, while the audit spool cannot take an
action's intent, and green again once it can (the gate's promises without a server:
tests/unit/runtime/test_gate.py)."""

from __future__ import annotations

from collections.abc import Callable

import requests

from gpuops.api import ApiServer, create_app
from gpuops.settings import ApiSettings
from tests.unit.runtime.test_gate import World, full_disk, uuids, world  # noqa: F401


def test_healthz_is_red_with_the_reason_while_the_spool_is_unwritable(
    world: World,  # noqa: F811
    full_disk: Callable[[bool], None],  # noqa: F811
) -> None:
    engine = world.engine()
    server = ApiServer(create_app(engine, ApiSettings(), environ={}), "127.0.0.1:0", None, None)
    server.start()
    try:
        assert requests.get(f"{server.url}/healthz", timeout=10).status_code == 200
        full_disk(True)
        world.prom.results["idle"] = uuids(1)
        world.evaluate(engine, "reclaim")
        red = requests.get(f"{server.url}/healthz", timeout=10)
        assert red.status_code == 503
        assert red.json()["status"] == "unhealthy"
        assert "No space left on device" in red.json()["reason"]
        full_disk(False)
        engine.gate.reconcile()
        assert requests.get(f"{server.url}/healthz", timeout=10).status_code == 200
    finally:
        server.stop()
    assert engine.wait_idle(10)
    assert len(world.log.ran) == 1
