"""``/api/v1/batch``: operations and their nodes as stored, cancel, retry of a failed node,
with the engine's permissions (reading: engine:read; cancel and retry: engine:control)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from gpuops.cli import cli
from gpuops.model.batch.operation import FleetNode
from gpuops.model.batch.opfile import parse_operation
from tests.integration.api.harness import Harness

OPERATION = """\
operation: restart
targets: {nodes: [n1, n2, n3]}
quarantine: none
step: {command: [sh, -c, 'test "$1" != n2', step, '{{ $labels.node }}']}
canary: 1
max_parallel: 2
max_unavailable: 2
failure_threshold: 2
enforce: true
"""


class Fleet:
    def nodes(self) -> list[FleetNode]:
        return [FleetNode(f"n{i}", pool="p", gpus=8) for i in range(1, 5)]


def test_batch_routes(api: Harness, tmp_path: Path) -> None:
    runner = api.engine.batches
    batch = runner.start(
        parse_operation(OPERATION, "op.yaml"), OPERATION, Fleet(), None, by="carol"
    )
    runner.run(batch, Fleet())

    listed = api.call("developer", "GET", "/api/v1/batch")
    assert listed.status_code == 200
    [one] = listed.json()
    assert (one["id"], one["status"], one["why"]) == (batch, "done", "failed: n2")
    assert one["started_by"] == "carol"
    nodes = {n["name"]: n for n in one["nodes"]}
    assert nodes["n1"] == {
        "name": "n1",
        "status": "done",
        "wave": 0,
        "done": ["step"],
        "error": "",
        "was_out": False,
    }
    assert nodes["n2"]["status"] == "failed" and nodes["n2"]["error"].startswith("step: ")

    assert api.call("developer", "POST", f"/api/v1/batch/{batch}/retry/n2").status_code == 403
    retried = api.call("admin", "POST", f"/api/v1/batch/{batch}/retry/n2")
    assert retried.status_code == 200 and retried.json()["status"] == "paused"
    refused = api.call("admin", "POST", f"/api/v1/batch/{batch}/retry/n1")
    assert refused.status_code == 409
    assert "only a failed node is retried" in refused.text

    cancelled = api.call("admin", "POST", f"/api/v1/batch/{batch}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert api.call("admin", "POST", f"/api/v1/batch/{batch}/cancel").status_code == 409
    waiting = runner.start(
        parse_operation(OPERATION + "approval: true\n", "op.yaml"),
        OPERATION,
        Fleet(),
        None,
    )
    assert api.call("developer", "GET", f"/api/v1/batch/{waiting}").json()["status"] == (
        "awaiting_approval"
    )
    assert runner.run(waiting, Fleet()).status == "awaiting_approval"  # nothing ran
    assert api.call("developer", "POST", f"/api/v1/batch/{waiting}/approve").status_code == 403
    approved = api.call("admin", "POST", f"/api/v1/batch/{waiting}/approve")
    assert approved.status_code == 200 and approved.json()["why"] == "approved by alice"
    assert api.call("admin", "POST", f"/api/v1/batch/{waiting}/approve").status_code == 409
    assert any(
        d.policy == f"batch/{waiting}" and d.reason == f"batch {waiting} approved by alice"
        for d, _ in api.decisions
    )

    assert api.call("admin", "POST", f"/api/v1/batch/{waiting}/cancel").status_code == 200
    own = runner.start(
        parse_operation(OPERATION + "approval: true\n", "op.yaml"),
        OPERATION,
        Fleet(),
        None,
        by="alice",
    )
    mine = api.call("admin", "POST", f"/api/v1/batch/{own}/approve")  # alice started it
    assert mine.status_code == 409 and "was started by alice: another person" in mine.text
    assert runner.record(own).status == "awaiting_approval"  # nothing ran

    missing = api.call("developer", "GET", "/api/v1/batch/nope")
    assert missing.status_code == 404 and "no batch operation 'nope'" in missing.text


def test_start_refused_naming_the_field_and_without_a_fleet(api: Harness) -> None:
    body = {"operation": OPERATION, "file": "restart.yaml", "folder": "/"}
    assert api.call("developer", "POST", "/api/v1/batch", json=body).status_code == 403
    bad = OPERATION.replace("max_parallel: 2", "max_parallel: 0").replace("step:", "stepp:")
    refused = api.call("admin", "POST", "/api/v1/batch", json={**body, "operation": bad})
    assert refused.status_code == 422
    assert refused.json() == {
        "detail": "3 problems: nothing runs",
        "errors": [
            'restart.yaml:4: stepp: unknown key "stepp", did you mean "step"? (allowed: approval,'
            " canary, enforce, failure_threshold, max_parallel, max_unavailable, on_stop,"
            " operation, quarantine, reboot, skip_label, step, targets, timing, validate)",
            "restart.yaml:1: step: missing: the step each node runs (ansible or command)",
            "restart.yaml:6: max_parallel: expected a whole number of at least 1, found 0"
            " (integer)",
        ],
    }
    no_fleet = api.call("admin", "POST", "/api/v1/batch", json=body)
    assert no_fleet.status_code == 409
    assert no_fleet.json()["detail"] == (
        "the engine has no fleet for batch operations: set batch.nodes (a nodes file) or"
        " batch.slurm: true in its configuration (docs/batch.md)"
    )
    relative = api.call("admin", "POST", "/api/v1/batch", json={**body, "folder": "ops"})
    assert relative.status_code == 422
    assert relative.json()["errors"] == ["restart.yaml:1: folder: 'ops' is not an absolute path"]
    assert api.call("admin", "POST", "/api/v1/batch/nope/resume").status_code == 404


def test_the_command_line_asks_the_engine(api: Harness, tmp_path: Path) -> None:
    runner = api.engine.batches
    batch = runner.start(parse_operation(OPERATION, "op.yaml"), OPERATION, Fleet(), None)
    runner.run(batch, Fleet())

    def gpuops(*args: str, role: str = "admin") -> tuple[int, str]:
        options = ["--url", api.url, "--token", api.tokens[role]]
        result = CliRunner().invoke(cli, ["batch", *args, *options])
        return result.exit_code, result.output

    code, said = gpuops("status", role="developer")
    assert code == 0 and said.splitlines() == [
        f"batch {batch}: done (failed: n2); 2 waves; 2 done, 1 failed",
        "  n2: failed: step: command 'sh' exited 1",
    ]
    code, said = gpuops("retry", batch, "n2", role="developer")
    assert code == 1 and "403" in said
    code, said = gpuops("retry", batch, "n2")
    assert code == 0 and said == f"n2 of batch {batch} queued again: gpuops batch resume {batch}\n"
    code, said = gpuops("cancel", batch)
    assert code == 0 and said.startswith(f"batch {batch}: cancelled (cancelled); 2 waves;")
    code, said = gpuops("resume", batch)
    assert code == 1 and f"409 Conflict: batch operation {batch} is cancelled" in said
    (tmp_path / "op.yaml").write_text(OPERATION)
    (tmp_path / "nodes.yaml").write_text("nodes: [{name: n1}]\n")
    code, said = gpuops("run", str(tmp_path / "op.yaml"), "--nodes", str(tmp_path / "nodes.yaml"))
    assert code == 2 and "--nodes and --slurm name the fleet of a run in this process" in said
