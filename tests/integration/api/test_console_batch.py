"""The console's batch operation pages through the running API, without a browser: the list
and one operation told in words, the buttons only for the roles the API lets act, and each
form refused without its permission or its CSRF token, through the API route's function (the
same 409 and words). In a browser: tests/browser/test_console_batch.py."""

from __future__ import annotations

import re
from pathlib import Path

import requests

from gpuops.model.batch.operation import FleetNode
from gpuops.model.batch.opfile import parse_operation
from tests.integration.api.harness import Harness, running_api

OPERATION = """\
operation: restart
targets: {nodes: [n1, n2, n3]}
quarantine: none
step:
  command:
    - sh
    - -c
    - 'test "$1" != n2 || { echo "no driver for $1" >&2; exit 3; }'
    - step
    - '{{ $labels.node }}'
max_parallel: 2
max_unavailable: 2
failure_threshold: 2
enforce: true
"""


class Fleet:
    def nodes(self) -> list[FleetNode]:
        return [FleetNode(f"n{i}", pool="p", gpus=8) for i in range(1, 4)]


def signed_in(api: Harness, role: str) -> tuple[requests.Session, str]:
    """A browser-like session of ``role`` and its CSRF token."""
    session = requests.Session()
    page = session.get(f"{api.url}/login", timeout=10)
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, page.text
    data = {"token": api.tokens[role], "csrf": found.group(1), "next": "/batch"}
    answer = session.post(f"{api.url}/login", data=data, timeout=10)
    assert answer.status_code == 200, answer.text
    csrf = re.search(r'name="csrf" value="([^"]+)"', answer.text)
    assert csrf, answer.text
    return session, csrf.group(1)


def test_batch_pages_tell_each_node_and_only_admins_act(tmp_path: Path) -> None:
    with running_api(tmp_path) as api:
        runner = api.engine.batches
        batch = runner.start(
            parse_operation(OPERATION, "op.yaml"), OPERATION, Fleet(), None, by="carol"
        )
        runner.run(batch, Fleet())

        auditor, auditor_csrf = signed_in(api, "auditor")
        listed = auditor.get(f"{api.url}/batch", timeout=10).text
        assert f'href="/batch/{batch}"' in listed and "by carol" in listed
        assert "2 done, 1 failed" in listed and "<td>done (failed: n2)</td>" in listed
        assert "n2 failed at step: " in listed and "left in service" in listed
        one = auditor.get(f"{api.url}/batch/{batch}", timeout=10)
        assert one.status_code == 200 and 'http-equiv="refresh"' not in one.text
        watched = auditor.get(f"{api.url}/batch/{batch}?refresh=10", timeout=10)
        assert '<meta http-equiv="refresh" content="10">' in watched.text
        odd = auditor.get(f"{api.url}/batch?refresh=7", timeout=10)
        assert odd.status_code == 422 and "refresh: 7 is not one of 0, 10, 30, 60" in odd.text
        assert "done in 2 waves: 2 done, 1 failed." in one.text
        assert "n1 done in wave 0: step" in one.text
        assert "no driver for n2" in one.text
        decision = re.search(r'href="/decisions/([^"]+)">step</a>: done after 1 attempt', one.text)
        assert decision, one.text
        explained = auditor.get(f"{api.url}/decisions/{decision.group(1)}", timeout=10)
        assert explained.status_code == 200 and "batch_step" in explained.text
        assert f'a step of batch operation <a href="/batch/{batch}">' in explained.text
        assert "no longer loaded" not in explained.text
        failed = re.search(r'href="/decisions/([^"]+)">step</a>: failed for good', one.text)
        assert failed, one.text
        not_here = api.call("admin", "POST", f"/api/v1/decisions/{failed.group(1)}/retry")
        assert not_here.status_code == 409 and "retry its node in the operation" in not_here.text
        assert "Retry n2" not in one.text and "Cancel the operation" not in one.text
        assert "Resume the operation" not in one.text
        assert "needs the permission engine:control" in one.text
        refused = auditor.post(
            f"{api.url}/batch/{batch}/retry/n2", data={"csrf": auditor_csrf}, timeout=10
        )
        assert refused.status_code == 403 and "engine:control" in refused.text
        assert runner.nodes(batch)["n2"].status == "failed"  # nothing done

        admin, csrf = signed_in(api, "admin")
        page = admin.get(f"{api.url}/batch/{batch}", timeout=10).text
        assert "Retry n2" in page and "Cancel the operation" in page
        assert "Approve the operation" not in page  # it does not wait for one
        forged = admin.post(f"{api.url}/batch/{batch}/retry/n2", data={"csrf": "x"}, timeout=10)
        assert forged.status_code == 403 and "CSRF" in forged.text
        retried = admin.post(f"{api.url}/batch/{batch}/retry/n2", data={"csrf": csrf}, timeout=10)
        assert retried.status_code == 200, retried.text
        assert "n2 is back in the queue of" in retried.text
        assert "is paused: resume it to run the node" in retried.text
        again = admin.post(f"{api.url}/batch/{batch}/retry/n2", data={"csrf": csrf}, timeout=10)
        assert again.status_code == 409 and "only a failed node is retried" in again.text
        assert "Resume the operation" in admin.get(f"{api.url}/batch/{batch}", timeout=10).text
        unconfirmed = admin.post(f"{api.url}/batch/{batch}/cancel", data={"csrf": csrf}, timeout=10)
        assert unconfirmed.status_code == 422 and runner.record(batch).status == "paused"
        resumed = admin.post(f"{api.url}/batch/{batch}/resume", data={"csrf": csrf}, timeout=10)
        assert resumed.status_code == 200, resumed.text
        assert f"{batch} is running: the engine goes on from where it stopped" in resumed.text
        assert runner.record(batch).status == "running"
        cancelled = admin.post(
            f"{api.url}/batch/{batch}/cancel", data={"csrf": csrf, "confirm": "yes"}, timeout=10
        )
        assert cancelled.status_code == 200 and "is cancelled" in cancelled.text
        assert runner.record(batch).status == "cancelled"
        audit = [d.get("event", {}).get("action") for d in api.operations()]
        assert {"retry_batch_node", "resume_batch", "cancel_batch"} <= set(audit)
