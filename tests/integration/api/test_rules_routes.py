"""``/api/v1/rules`` and ``/api/v1/rule-files``: list, show, validate (file:line), reload, write."""

from __future__ import annotations

import shutil

import pytest

from gpuops.actions.fleet import FleetExecutor
from gpuops.model.decisions import freeze
from gpuops.model.evaluation.state import PolicyState, Status, TargetState
from tests.integration.api.harness import RULES, Harness

NEW_FILE = """\
groups:
  - name: extra
    rules:
      - policy: log-down-nodes
        expr: up == 0
        action: {type: notify, executor: log}
"""


def test_list_and_show_policies(api: Harness) -> None:
    listed = api.call("auditor", "GET", "/api/v1/rules").json()
    names = [p["name"] for p in listed["policies"]]
    assert names == ["drain-on-gpu-fell-off-bus", "reclaim-with-approval"]
    shown = api.call("developer", "GET", "/api/v1/rules/reclaim-with-approval").json()
    assert shown["approval"] == "required"
    assert shown["trigger"] == {"alertname": "GPUIdle"}
    assert shown["source"] == "api-test.yaml:11"
    assert [p["source"] for p in listed["policies"]] == ["api-test.yaml:5", "api-test.yaml:11"]
    assert listed["files"] == ["api-test.yaml"]
    missing = api.call("developer", "GET", "/api/v1/rules/nope")
    assert missing.status_code == 404
    assert missing.json() == {"detail": "no policy named 'nope' is loaded"}


def test_validate_reports_file_line_errors(api: Harness) -> None:
    text = NEW_FILE.replace("executor: log", "executor: nowhere").replace("up == 0", "up ==")
    resp = api.call(
        "developer", "POST", "/api/v1/rules/validate", params={"filename": "mine.yaml"}, data=text
    )
    assert resp.status_code == 200
    body = resp.json()
    assert body["ok"] is False
    [error] = body["errors"]
    assert error["file"] == "mine.yaml" and error["line"] == 6
    assert error["text"].startswith("mine.yaml:6: ")
    assert "nowhere" in error["message"]


def test_validate_checks_promql_with_promtool_when_asked(api: Harness) -> None:
    text = NEW_FILE.replace("up == 0", "sum(up")
    schema_only = api.call("developer", "POST", "/api/v1/rules/validate", data=text).json()
    assert schema_only == {"ok": True, "policies": 1, "errors": [], "promql_checked": False}
    checked = api.call(
        "developer", "POST", "/api/v1/rules/validate", params={"promql": "true"}, data=text
    ).json()
    if not checked["promql_checked"]:  # no promtool on this machine: said so, not hidden
        assert "promtool" in checked["note"]
        return
    assert checked["ok"] is False
    assert checked["errors"][0]["text"].startswith("posted.yaml:5: ")


def test_validate_refuses_non_utf8(api: Harness) -> None:
    resp = api.call("developer", "POST", "/api/v1/rules/validate", data=b"\xff\xfe")
    assert resp.status_code == 400
    assert resp.json() == {"detail": "the body is not UTF-8 text"}


def test_reload_picks_up_files_and_keeps_rules_on_error(api: Harness) -> None:
    (api.tmp / "rules" / "extra.yaml").write_text(NEW_FILE)
    ok = api.call("admin", "POST", "/api/v1/rules/reload")
    assert ok.json() == {"ok": True, "policies": 3}
    (api.tmp / "rules" / "broken.yaml").write_text("groups: [")
    bad = api.call("admin", "POST", "/api/v1/rules/reload")
    assert bad.status_code == 422
    body = bad.json()
    assert "the running 3 policies stay in place" in body["detail"]
    assert body["errors"][0].startswith("broken.yaml:1: ")  # the file's name, not its path
    assert str(api.tmp) not in bad.text
    assert api.engine.rules.policy("log-down-nodes") is not None


def test_rule_files_list_show_and_write(api: Harness) -> None:
    assert api.call("auditor", "GET", "/api/v1/rule-files").json() == {"files": ["api-test.yaml"]}
    assert api.call("auditor", "GET", "/api/v1/rule-files/api-test.yaml").text == RULES
    put = api.call("admin", "PUT", "/api/v1/rule-files/extra.yaml", data=NEW_FILE)
    assert put.json() == {"ok": True, "policies": 3, "file": "extra.yaml"}
    assert (api.tmp / "rules" / "extra.yaml").read_text() == NEW_FILE
    assert api.engine.rules.policy("log-down-nodes") is not None


def test_writing_an_invalid_or_conflicting_file_changes_nothing(api: Harness) -> None:
    invalid = api.call("admin", "PUT", "/api/v1/rule-files/extra.yaml", data="groups: [")
    assert invalid.status_code == 422
    assert invalid.json()["errors"][0]["text"].startswith("extra.yaml:1: ")
    assert not (api.tmp / "rules" / "extra.yaml").exists()
    duplicate = NEW_FILE.replace("log-down-nodes", "drain-on-gpu-fell-off-bus")
    conflict = api.call("admin", "PUT", "/api/v1/rule-files/extra.yaml", data=duplicate)
    assert conflict.status_code == 422, conflict.text
    assert not (api.tmp / "rules" / "extra.yaml").exists()
    assert [p.name for p in api.engine.rules.policies()] == [
        "drain-on-gpu-fell-off-bus",
        "reclaim-with-approval",
    ]
    assert sorted(p.name for p in (api.tmp / "rules").iterdir()) == ["api-test.yaml"]


def test_validate_reports_unreadable_characters_as_a_line_error(api: Harness) -> None:
    resp = api.call(
        "developer", "POST", "/api/v1/rules/validate", data="groups:\n  - x\u009c\n".encode()
    )
    body = resp.json()
    assert body["ok"] is False
    assert body["errors"][0]["text"] == (
        "posted.yaml:2: unprintable character U+009C (YAML allows printable characters only; "
        "remove it)"
    )


def test_validate_checks_executor_verbs_as_the_engine_does(api: Harness) -> None:
    text = NEW_FILE.replace("type: notify, executor: log", "type: downclok, executor: fleet")
    body = api.call("developer", "POST", "/api/v1/rules/validate", data=text).json()
    assert body["ok"] is False
    assert FleetExecutor.verbs is not None and "downclock" in FleetExecutor.verbs
    assert [e["message"] for e in body["errors"]] == [
        "groups[0].rules[0].action.type: executor 'fleet' does not do 'downclok' (it does: "
        f"{', '.join(sorted(FleetExecutor.verbs))})"
    ]


def test_list_shows_each_policy_s_last_evaluation_and_the_last_reload(api: Harness) -> None:
    (api.tmp / "rules" / "extra.yaml").write_text(NEW_FILE)
    assert api.call("admin", "POST", "/api/v1/rules/reload").json()["ok"] is True
    before = api.call("auditor", "GET", "/api/v1/rules").json()
    assert before["reload"] == {"ok": True, "at": api.clock(), "errors": []}
    assert {p["name"]: p["last_evaluation"] for p in before["policies"]}["log-down-nodes"] is None
    policy = api.engine.rules.policy("log-down-nodes")
    assert policy is not None
    api.engine.cycle.evaluate_policy(policy)  # the harness' Prometheus does not answer
    (api.tmp / "rules" / "broken.yaml").write_text("groups: [")
    api.clock.advance(60)
    assert api.call("admin", "POST", "/api/v1/rules/reload").status_code == 422
    after = api.call("auditor", "GET", "/api/v1/rules").json()
    [seen] = [p["last_evaluation"] for p in after["policies"] if p["name"] == "log-down-nodes"]
    assert seen["at"] == api.clock() - 60 and seen["skipped"]
    assert after["reload"]["ok"] is False and after["reload"]["at"] == api.clock()
    # files named as in the rules directory, never by the engine host's paths
    assert after["reload"]["errors"][0].startswith("broken.yaml:1: ")
    assert after["files"] == ["api-test.yaml", "extra.yaml"]  # the running rules
    assert str(api.tmp) not in str(after)


BAD_PROMQL = NEW_FILE.replace("up == 0", "sum(up")


@pytest.mark.parametrize(
    ("case", "posted", "beside", "errors"),
    [
        (
            "yaml syntax",
            "groups: [",
            None,
            ["extra.yaml:1: "],
        ),
        (
            "schema",
            NEW_FILE.replace("expr: up == 0", "exprr: up == 0"),
            None,
            ["extra.yaml:"],
        ),
        (
            "rule check",
            NEW_FILE.replace("type: notify, executor: log", "type: downclok, executor: fleet"),
            None,
            ["extra.yaml:6: "],
        ),
        (
            "promql, checked at reload",
            BAD_PROMQL,
            None,
            [
                "extra.yaml:5: groups[0].rules[0].expr: invalid PromQL 'sum(up': ",
            ],
        ),
        (
            "another file's yaml",
            NEW_FILE,
            "groups: [",
            ["broken.yaml:1: "],
        ),
        (
            "duplicate policy across files",
            NEW_FILE.replace("log-down-nodes", "drain-on-gpu-fell-off-bus"),
            None,
            [
                "extra.yaml:4: groups[0].rules[0].policy: duplicate policy name "
                '"drain-on-gpu-fell-off-bus" (first defined at api-test.yaml:5; policy names '
                "must be unique across the rule set)"
            ],
        ),
    ],
)
def test_writing_a_rule_file_names_files_never_server_paths(
    api: Harness, case: str, posted: str, beside: str | None, errors: list[str]
) -> None:
    if case.startswith("promql") and shutil.which("promtool") is None:
        pytest.skip("no promtool: PromQL is not checked at reload")
    if beside is not None:
        (api.tmp / "rules" / "broken.yaml").write_text(beside)
    resp = api.call("admin", "PUT", "/api/v1/rule-files/extra.yaml", data=posted)
    assert resp.status_code == 422, resp.text
    shown = [e["text"] if isinstance(e, dict) else e for e in resp.json()["errors"]]
    assert len(shown) == len(errors), shown
    for text, start in zip(shown, errors, strict=True):
        assert text.startswith(start), text
    assert str(api.tmp) not in resp.text
    assert not (api.tmp / "rules" / "extra.yaml").exists()


def test_a_rule_file_that_cannot_be_written_is_answered_without_server_paths(
    api: Harness,
) -> None:
    (api.tmp / "rules" / "extra.yaml").mkdir()  # neither read nor replaced
    resp = api.call("admin", "PUT", "/api/v1/rule-files/extra.yaml", data=NEW_FILE)
    assert resp.status_code == 500, resp.text
    assert resp.json() == {
        "detail": "extra.yaml not written into the rules directory (Is a directory); "
        "nothing changed"
    }
    assert api.engine.rules.policy("log-down-nodes") is None


def test_a_policy_s_targets_say_when_each_may_act_next(api: Harness) -> None:
    (api.tmp / "rules" / "extra.yaml").write_text(
        NEW_FILE.replace("expr: up == 0", "expr: up == 0\n        for: 10m\n        cooldown: 1h")
    )
    assert api.call("admin", "POST", "/api/v1/rules/reload").json()["ok"] is True
    now = api.clock()
    down = TargetState(Status.PENDING, now - 120, now, 0.0, freeze({"instance": "n1"}))
    with api.engine.store.transaction() as db:  # what an evaluation of up == 0 leaves
        api.engine.store.save_policy_state(
            db, "log-down-nodes", PolicyState(freeze({"instance=n1": down}))
        )
    answer = api.call("auditor", "GET", "/api/v1/rules/log-down-nodes/targets")
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "policy": "log-down-nodes",
        "total": 1,
        "targets": [
            {
                "key": "instance=n1",
                "labels": {"instance": "n1"},
                "status": "pending",
                "since": now - 120,
                "value": 0.0,
                "next_at": now + 480,
                "waits_for": "for 10m",
            }
        ],
    }
    [listed] = [
        p
        for p in api.call("auditor", "GET", "/api/v1/rules").json()["policies"]
        if p["name"] == "log-down-nodes"
    ]
    assert (listed["expr"], listed["for_s"], listed["cooldown_s"]) == ("up == 0", 600, 3600)
    quiet = api.call("auditor", "GET", "/api/v1/rules/reclaim-with-approval/targets").json()
    assert quiet == {"policy": "reclaim-with-approval", "total": 0, "targets": []}
    missing = api.call("auditor", "GET", "/api/v1/rules/nope/targets")
    assert missing.status_code == 404
