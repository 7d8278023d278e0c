"""What the CLI shows a user of a running API: settled approvals in ``decisions list`` and
``explain``, times as times, the engine's dry-run in ``control status``, quota durations."""

from __future__ import annotations

import json
import re

from click.testing import CliRunner, Result

from gpuops.cli import cli
from tests.integration.api.harness import Harness

ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


def run(api: Harness, role: str, *args: str) -> Result:
    env = {"GPUOPS_URL": api.url, "GPUOPS_TOKEN": api.tokens[role]}
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def waiting(api: Harness, uuid: str) -> str:
    api.notify(api.alert("GPUIdle", node="n2", uuid=uuid))
    api.settle()
    listed = json.loads(
        run(api, "admin", "approvals", "list", "--json", "--status", "pending").stdout
    )
    (approval,) = [a for a in listed["approvals"] if a["target"] == f"node=n2,uuid={uuid}"]
    return str(approval["decision_id"])


def verdicts(api: Harness) -> dict[str, str]:
    """The VERDICT column by decision id (its words have spaces: cut at the column's edges)."""
    header, *rows = run(api, "auditor", "decisions", "list").stdout.splitlines()
    start, end = header.index("VERDICT"), header.index("STATE")
    return {line.split()[2]: line[start:end].strip() for line in rows}


def test_denied_and_expired_decisions_are_no_longer_awaiting_approval(api: Harness) -> None:
    denied, expired, pending = waiting(api, "GPU-D"), waiting(api, "GPU-E"), None
    assert run(api, "admin", "approvals", "deny", denied, "--reason", "busy").exit_code == 0
    api.clock.now += api.engine.config.guardrails.approval_ttl + 1
    pending = waiting(api, "GPU-P")  # asked after the others expired
    assert verdicts(api) == {  # in words, as `explain` says them
        denied: "denied",
        expired: "not approved in time",
        pending: "waits for an admin's approval",
    }
    only_waiting = json.loads(
        run(api, "auditor", "decisions", "list", "--verdict", "awaiting_approval", "--json").stdout
    )
    assert [d["id"] for d in only_waiting["decisions"]] == [pending]
    explained = run(api, "auditor", "decisions", "explain", denied).stdout
    assert "guardrails: denied: denied by alice" in explained
    assert re.search(rf"^approval: denied by alice at {ISO}$", explained, re.M), explained


def test_explain_of_a_granted_decision_says_who_granted_it(api: Harness) -> None:
    decision_id = waiting(api, "GPU-G")
    before = run(api, "auditor", "decisions", "explain", decision_id).stdout
    assert "waiting for an admin" in before
    assert re.search(rf"^approval: pending, expires {ISO}$", before, re.M), before
    assert run(api, "admin", "approvals", "grant", decision_id, "--reason", "ok").exit_code == 0
    api.settle()
    after = run(api, "auditor", "decisions", "explain", decision_id).stdout
    assert "waiting for an admin" not in after
    assert "guardrails: runs: granted by alice" in after
    assert re.search(rf"^approval: granted by alice at {ISO}$", after, re.M), after


def test_explain_prints_pending_since_as_a_time(api: Harness) -> None:
    decision_id = waiting(api, "GPU-T")
    row = json.loads(run(api, "auditor", "decisions", "explain", decision_id, "--json").stdout)
    assert row["evidence"]["pending_since"]  # a number in the API ...
    because = run(api, "auditor", "decisions", "explain", decision_id).stdout.splitlines()[1]
    assert re.search(rf"\(pending since {ISO}\)$", because), because  # ... a time for people


def test_control_status_shows_the_engine_dry_run(api: Harness) -> None:
    assert "dry_run: False" in run(api, "auditor", "control", "status").stdout
    guardrails = api.engine.config.guardrails.model_copy(update={"dry_run": True})
    api.engine.config = api.engine.config.model_copy(update={"guardrails": guardrails})
    assert "dry_run: True" in run(api, "auditor", "control", "status").stdout


def test_quota_list_shows_durations_in_prometheus_syntax(api: Harness) -> None:
    for duration in ("1m", "8h", "90m"):
        args = ("quota", "request", "--project", "nlp", "--gpus", "1", "--duration", duration)
        assert run(api, "developer", *args).exit_code == 0
    table = run(api, "auditor", "quota", "list").stdout.splitlines()
    assert table[0].split()[3] == "DURATION"
    assert sorted(line.split()[3] for line in table[1:]) == ["1h30m", "1m", "8h"]
