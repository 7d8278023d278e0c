"""State integrity where a process or a server is the point: ``gpuops engine run`` on a missing
or damaged state file exits 1 saying what to run, without a traceback, and ``/healthz`` of the
running API names the policy whose row cannot be decoded (degraded, not down). The rest, in the
process: tests/unit/store/test_state_integrity.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from gpuops.api import ApiServer, create_app
from gpuops.settings import ApiSettings
from tests.unit.store.test_state_integrity import (  # noqa: F401
    MISSING,
    TARGETS,
    World,
    break_row,
    world,
)


def test_engine_run_on_a_missing_state_file_exits_1_saying_what_to_run(
    world: World,  # noqa: F811
) -> None:
    world.ran_once_and_stopped()
    world.state.unlink()
    gpuops = Path(sys.executable).with_name("gpuops")
    run = subprocess.run(
        [str(gpuops), "engine", "run", "--config", str(world.config_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1
    assert "Traceback" not in run.stderr + run.stdout
    assert run.stderr.endswith(
        "\nError: "
        + MISSING.format(state=world.state, spool=world.spool)
        + f"\nnothing was changed; with this configuration: `gpuops state reset --config"
        f" {world.config_file}` (docs/state.md)\n"
    ), run.stderr
    assert not world.state.exists()


def test_engine_run_on_garbage_exits_1_naming_the_file_without_a_traceback(
    world: World,  # noqa: F811
) -> None:
    world.state.write_bytes(os.urandom(4096).replace(b"SQLite", b"xxxxxx"))
    gpuops = Path(sys.executable).with_name("gpuops")
    run = subprocess.run(
        [str(gpuops), "engine", "run", "--config", str(world.config_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1
    assert run.stderr.startswith(f"Error: {world.state}: not a gpuops state database ("), run.stderr
    assert "gpuops state reset --config" in run.stderr
    assert "Traceback" not in run.stderr + run.stdout


def test_a_bad_row_skips_only_its_policy_audited_counted_and_named_by_healthz(
    world: World,  # noqa: F811
) -> None:
    world.ran_once_and_stopped()
    break_row(world, "reclaim")
    engine = world.engine()
    server = ApiServer(create_app(engine, ApiSettings(), environ={}), "127.0.0.1:0", None, None)
    server.start()
    try:
        world.now += 7200  # past the cooldown: a reset state would re-fire
        assert world.evaluate(engine, "reclaim") == []
        world.prom.results["cool"] = TARGETS[:1]
        assert [d.verdict for d in world.evaluate(engine, "downclock")] == ["execute"]
        health = requests.get(f"{server.url}/healthz", timeout=10)
    finally:
        server.stop()
    assert len(world.log.ran) == 4  # the 3 reclaims before, the downclock now
    (skipped,) = [d for d in world.docs() if d["event"]["action"] == "skipped_evaluation"]
    assert skipped["rule"]["name"] == "reclaim"
    assert skipped["gpuops"]["reason"] == "bad state"
    reason = skipped["error"]["message"]
    assert reason.startswith(f"{world.state}: policy_state row of 'reclaim' cannot be decoded (")
    assert engine.metrics.registry.get_sample_value(
        "gpuops_engine_state_errors_total", {"policy": "reclaim"}
    ) == pytest.approx(1)
    assert health.status_code == 200
    assert health.json()["status"] == "degraded"
    assert health.json()["degraded"] == {"reclaim": reason}
