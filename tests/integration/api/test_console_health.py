"""The console's GPU health page through the running API, without a browser: the clear form
refused without engine:control or its CSRF token (nothing cleared), and a node that needs no
human refused with the API route's 409 and words. In a browser:
tests/browser/test_console_health.py."""

from __future__ import annotations

import json
from pathlib import Path

from gpuops.model.health.ladder import Repair, Stage
from tests.integration.api.harness import running_api
from tests.integration.api.test_console_batch import signed_in


def test_clearing_needs_engine_control_and_its_csrf_token(tmp_path: Path) -> None:
    with running_api(tmp_path) as api:
        human = Repair(node="n7", stage=Stage.NEEDS_HUMAN, since=1.0, why="reboot failed")
        api.engine.store.save_repair("n7", "needs_human", json.dumps(human.as_dict()), 1.0)
        auditor, auditor_csrf = signed_in(api, "auditor")
        page = auditor.get(f"{api.url}/health", timeout=10)
        assert page.status_code == 200 and "n7 needs a human: reboot failed" in page.text
        refused = auditor.post(
            f"{api.url}/health/n7/clear", data={"csrf": auditor_csrf}, timeout=10
        )
        assert refused.status_code == 403 and "engine:control" in refused.text
        admin, csrf = signed_in(api, "admin")
        forged = admin.post(f"{api.url}/health/n7/clear", data={"csrf": "x"}, timeout=10)
        assert forged.status_code == 403 and "CSRF" in forged.text
        still = api.engine.ladder.repair("n7")
        assert still is not None and still.stage is Stage.NEEDS_HUMAN  # nothing cleared
        cleared = admin.post(f"{api.url}/health/n7/clear", data={"csrf": csrf}, timeout=10)
        assert cleared.status_code == 200 and "n7 is cleared" in cleared.text
        again = admin.post(f"{api.url}/health/n7/clear", data={"csrf": csrf}, timeout=10)
        assert again.status_code == 409
        stranger = admin.post(f"{api.url}/health/n9/clear", data={"csrf": csrf}, timeout=10)
        assert stranger.status_code == 409 and "not on the remediation ladder" in stranger.text
        audit = [d.get("event", {}).get("action") for d in api.operations()]
        assert "clear_health_node" in audit
