"""An alias bomb through ``/rules/validate`` and the reload watcher: refused at its line in
milliseconds, the running rules kept."""

from __future__ import annotations

from tests.integration.api.harness import Harness
from tests.unit.model.rules.test_yaml_limits import BOMB, REFUSED


def test_validate_endpoint_refuses_the_bomb(api: Harness) -> None:
    resp = api.call("developer", "POST", "/api/v1/rules/validate", data=BOMB)
    assert resp.status_code == 200
    body = resp.json()
    assert body["ok"] is False
    assert [e["text"] for e in body["errors"]] == [
        f"posted.yaml:7: {REFUSED}; the file is not used"
    ]


def test_the_reload_watcher_keeps_the_running_rules(api: Harness) -> None:
    running = [p.name for p in api.engine.rules.policies()]
    (api.tmp / "rules" / "bomb.yaml").write_text(BOMB)
    api.engine.check_reload()
    api.engine.check_reload()  # read the same twice: the reload is tried
    assert api.engine.rulebook.last_reload is not None
    assert not api.engine.rulebook.last_reload.ok
    assert [p.name for p in api.engine.rules.policies()] == running
    result = api.engine.reload()
    assert not result.ok
    assert result.errors == (
        f"{api.tmp / 'rules' / 'bomb.yaml'}:7: {REFUSED}; the file is not used",
    )
