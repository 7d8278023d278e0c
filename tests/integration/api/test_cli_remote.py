"""``gpuops decisions|approvals|quota|control|rules …|token`` against a running engine API."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner, Result

from gpuops.cli import cli
from gpuops.model.decisions import freeze
from gpuops.model.evaluation.state import PolicyState, Status, TargetState
from tests.integration.api.harness import Harness


def run(api: Harness, role: str | None, *args: str) -> Result:
    env = {"GPUOPS_URL": api.url}
    if role:
        env["GPUOPS_TOKEN"] = api.tokens[role]
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_decisions_list_and_explain(api: Harness) -> None:
    api.notify(api.alert("GPUFellOffBus", node="n1"))
    api.settle()
    table = run(api, "auditor", "decisions", "list")
    assert table.exit_code == 0, table.output
    header, row = table.stdout.splitlines()
    assert header.split() == [
        "AT", "ID", "POLICY", "TRANSITION", "TARGET", "ACTION", "VERDICT", "STATE", "EFFECT"
    ]  # fmt: skip
    assert "drain-on-gpu-fell-off-bus" in row
    assert row.split()[5:9] == ["node=n1", "migrate", "runs", "done"]
    assert row.endswith("recorded in the log only: nothing changed")
    listed = json.loads(run(api, "auditor", "decisions", "list", "--json", "--since", "1h").stdout)
    decision_id = listed["decisions"][0]["id"]
    explained = run(api, "auditor", "decisions", "explain", decision_id)
    assert explained.stdout.startswith(
        "policy drain-on-gpu-fell-off-bus decided to migrate on node=n1"
    )


def test_approvals_grant_as_admin_only(api: Harness) -> None:
    api.notify(api.alert("GPUIdle", node="n2", uuid="GPU-2"))
    api.settle()
    listed = json.loads(run(api, "developer", "approvals", "list", "--json").stdout)
    decision_id = listed["approvals"][0]["decision_id"]
    refused = run(api, "developer", "approvals", "grant", decision_id, "--reason", "idle")
    assert refused.exit_code == 1
    assert "403 Forbidden: forbidden: user 'dave'" in refused.stderr
    unsaid = run(api, "admin", "approvals", "grant", decision_id)
    assert unsaid.exit_code == 2 and "Missing option '--reason'" in unsaid.stderr
    blank = run(api, "admin", "approvals", "grant", decision_id, "--reason", " ")
    assert blank.exit_code == 2
    assert "Invalid value for '--reason': say why: the reason is audited" in blank.stderr
    granted = run(api, "admin", "approvals", "grant", decision_id, "--reason", "notebook idle")
    assert granted.exit_code == 0 and " reclaim  runs " in granted.stdout, granted.stdout
    (audited,) = [d for d in api.operations() if d["event"]["action"] == "grant_approval"][-1:]
    assert audited["user"]["name"] == "alice"
    assert audited["message"].endswith("-> 200 (notebook idle)")
    assert audited["gpuops"]["operation"]["details"]["note"] == "notebook idle"


def test_approvals_deny_says_why_in_the_audit(api: Harness) -> None:
    api.notify(api.alert("GPUIdle", node="n5", uuid="GPU-5"))
    api.settle()
    listed = json.loads(run(api, "admin", "approvals", "list", "--json").stdout)
    (decision_id,) = [a["decision_id"] for a in listed["approvals"] if "n5" in a["target"]]
    denied = run(api, "admin", "approvals", "deny", decision_id, "--reason", "job starts now")
    assert denied.exit_code == 0, denied.output
    audited = [d for d in api.operations() if d["event"]["action"] == "deny_approval"][-1]
    assert audited["message"].endswith("-> 200 (job starts now)")


def test_quota_request_list_approve(api: Harness) -> None:
    filed = run(
        api,
        "developer",
        "quota",
        "request",
        "--project",
        "nlp",
        "--gpus",
        "3",
        "--duration",
        "2h",
        "--json",
    )
    assert filed.exit_code == 0, filed.output
    request_id = json.loads(filed.stdout)["id"]
    approved = run(api, "admin", "quota", "approve", request_id)
    assert approved.exit_code == 0 and "active" in approved.stdout
    table = run(api, "auditor", "quota", "list", "--status", "active").stdout
    assert request_id in table and "nlp" in table
    projects = run(api, "auditor", "quota", "projects")
    assert projects.exit_code == 0, projects.output
    assert projects.stdout.splitlines()[1].split() == ["nlp", "—", "3", "—", "unknown", "0"]
    assert projects.stderr.splitlines()[-1].startswith("usage not known: ")


def test_control_commands(api: Harness) -> None:
    assert "kill_switch: True" in run(api, "admin", "control", "kill-switch", "on").stdout
    assert api.engine.kill_switch_on()
    assert "paused: True" in run(api, "admin", "control", "pause").stdout
    status = json.loads(run(api, "auditor", "control", "status", "--json").stdout)
    assert status["paused"] is True and status["kill_switch"] is True
    run(api, "admin", "control", "resume")
    run(api, "admin", "control", "kill-switch", "off")
    assert not api.engine.paused() and not api.engine.kill_switch_on()


def test_rules_remote_commands(api: Harness, tmp_path_factory: pytest.TempPathFactory) -> None:
    listed = run(api, "auditor", "rules", "list")
    assert "reclaim-with-approval" in listed.stdout
    now = api.clock()
    idle = TargetState(Status.FIRING, now - 60, now, 1.0, freeze({"node": "n2", "uuid": "G"}))
    with api.engine.store.transaction() as db:  # what a fire leaves
        api.engine.store.save_policy_state(
            db, "reclaim-with-approval", PolicyState(freeze({"node=n2,uuid=G": idle}))
        )
    targets = run(api, "auditor", "rules", "targets", "reclaim-with-approval").stdout
    row = targets.splitlines()[1]
    assert row.startswith("node=n2,uuid=G  firing") and "after it clears  fired; acts" in row
    assert run(api, "admin", "rules", "reload").stdout == "ok: True\npolicies: 2\n"
    bad = tmp_path_factory.mktemp("r") / "bad.yaml"
    bad.write_text("groups:\n  - name: g\n    rules:\n      - policy: p\n")
    checked = run(api, "developer", "rules", "validate-remote", str(bad))
    assert checked.exit_code == 1
    assert checked.stdout.splitlines()[0].startswith("bad.yaml:4: ")


def test_errors_are_messages_with_exit_1(api: Harness) -> None:
    no_token = run(api, None, "decisions", "list")
    assert no_token.exit_code == 1
    assert "401 Unauthorized: no credentials" in no_token.stderr
    unreachable = CliRunner().invoke(
        cli, ["control", "status", "--url", "http://127.0.0.1:9"], env={"GPUOPS_TOKEN": "x"}
    )
    assert unreachable.exit_code == 1
    assert unreachable.stderr == (
        "Error: cannot reach the engine API at http://127.0.0.1:9: connection refused "
        "(is the engine running? GPUOPS_URL or --url names it)\n"
    )


def test_a_user_added_with_token_new_is_let_in_without_a_reload(api: Harness) -> None:
    added = run(
        api,
        None,
        *("token", "new", "--name", "newcomer", "--role", "auditor"),
        *("--tokens-file", str(api.tokens_file)),
    )
    assert added.exit_code == 0, added.output
    env = {"GPUOPS_URL": api.url, "GPUOPS_TOKEN": added.stdout.strip()}
    listed = CliRunner().invoke(cli, ["decisions", "list", "--json"], env=env)
    assert listed.exit_code == 0, listed.output  # 401 until the file is read again
    assert json.loads(listed.stdout)["decisions"] == []
    # the read is audited as the design says (docs/audit.md): counted under the new user's name
    metrics = api.call(None, "GET", "/metrics").text
    assert 'gpuops_audit_reads_total{route="list_decisions",user="newcomer",via="api"} 1.0' in (
        metrics
    )
