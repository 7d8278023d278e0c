"""The ``webhook`` executor against a real HTTP receiver on a loopback port: the body, the
bearer token, the HMAC signature checked by the receiver, retries through ``execute``."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuops.actions.base import PermanentError, TemporaryError, execute
from gpuops.actions.retry import RetryPolicy
from gpuops.actions.webhook import WebhookExecutor, signature
from gpuops.model.decisions import OutcomeStatus
from tests.fakes.receiver import Receiver, Reply
from tests.unit.actions.support import make_decision

Serve = Callable[..., Receiver]
TOKEN = "tok-3f9a-never-logged"
SECRET = "hmac-key-7c1e"


def webhook(url: str, **settings: Any) -> WebhookExecutor:
    return WebhookExecutor({"url": url + "/hooks/gpuops", **settings})


def test_posts_the_decision_as_json(receiver: Serve) -> None:
    r = receiver()
    decision = make_decision(
        "open_ticket",
        params={
            "queue": "gpu-{{ $labels.node }}",
            "value": "{{ $value }}",
            "priority": 2,
            "headers": {"X-Team": "platform"},
        },
        node="n1",
        uuid="GPU-1",
    )
    changed = webhook(r.url).run(decision)
    assert changed == {"status": 200, "url": r.url + "/hooks/gpuops"}
    (got,) = r.received
    assert got.path == "/hooks/gpuops"
    assert got.headers["Content-Type"] == "application/json"
    assert got.headers["X-Gpuops-Decision-Id"] == decision.id
    assert got.headers["X-Team"] == "platform"
    assert "Authorization" not in got.headers
    assert "X-Gpuops-Signature" not in got.headers
    assert json.loads(got.body) == {
        "id": decision.id,
        "policy": "reclaim-idle-gpus",
        "group": "gpu-efficiency",
        "target": {"key": "node=n1,uuid=GPU-1", "labels": {"node": "n1", "uuid": "GPU-1"}},
        "transition": "fire",
        "action": {
            "type": "open_ticket",
            "params": {"queue": "gpu-n1", "value": "0.05", "priority": 2},
        },
        "evidence": {
            "expr": "max_over_time(nvml_gpu_utilization_ratio[30m]) < 0.2",
            "value": 0.05,
            "pending_since": 0.0,
            "observed_at": 1800.0,
        },
        "reason": "",
        "labels": {"team": "platform"},
        "annotations": {"summary": "GPU-1 idle"},
        "at": 1800.0,
    }


def test_bearer_token_is_sent_and_never_logged(
    receiver: Serve, caplog: pytest.LogCaptureFixture
) -> None:
    r = receiver()
    r.script(Reply(503, b"down"), Reply(200))
    ex = webhook(r.url, token=TOKEN)
    with caplog.at_level(logging.DEBUG):
        outcome = execute(ex, make_decision(), sleep=lambda s: None)
    assert outcome.ok
    assert [g.headers["Authorization"] for g in r.received] == [f"Bearer {TOKEN}"] * 2
    assert caplog.records  # the retry and the success were logged...
    assert TOKEN not in caplog.text  # ...without the token
    assert TOKEN not in repr(ex.settings)
    assert TOKEN not in str(dict(outcome.changed))


def test_token_file_is_read_for_each_request(receiver: Serve, tmp_path: Path) -> None:
    r = receiver()
    path = tmp_path / "token"
    path.write_text("first\n", encoding="utf-8")
    ex = webhook(r.url, token_file=str(path))
    ex.run(make_decision())
    path.write_text("rotated\n", encoding="utf-8")
    ex.run(make_decision())
    assert [g.headers["Authorization"] for g in r.received] == ["Bearer first", "Bearer rotated"]
    path.unlink()
    unreadable = r"executors.webhook settings: token_file: '.*token' cannot be read: No"
    with pytest.raises(PermanentError, match=unreadable):
        ex.run(make_decision())


def test_hmac_signature_over_the_exact_body_checks_out_at_the_receiver(
    receiver: Serve, tmp_path: Path
) -> None:
    r = receiver(secret=SECRET.encode())
    webhook(r.url, hmac_secret=SECRET).run(make_decision())
    (tmp_path / "key").write_text(SECRET + "\n", encoding="utf-8")
    webhook(r.url, hmac_secret_file=str(tmp_path / "key")).run(make_decision())
    webhook(r.url, hmac_secret="another key").run(make_decision())
    assert [g.signature_ok for g in r.received] == [True, True, False]
    got = r.received[0]
    assert got.headers["X-Gpuops-Signature"] == signature(SECRET.encode(), got.body)
    assert got.headers["X-Gpuops-Signature"].startswith("sha256=")


def test_503_is_retried_with_the_same_id_then_succeeds(receiver: Serve) -> None:
    r = receiver(secret=SECRET.encode())
    r.script(Reply(503, b"overloaded"), Reply(502), Reply(200))
    waits: list[float] = []
    ex = webhook(r.url, hmac_secret=SECRET)
    outcome = execute(ex, make_decision(), RetryPolicy(attempts=3, backoff_s=0.5), waits.append)
    assert outcome.status is OutcomeStatus.SUCCESS
    assert outcome.attempts == 3
    assert dict(outcome.changed) == {"status": 200, "url": r.url + "/hooks/gpuops"}
    assert waits == [0.5, 1.0]
    assert len({g.body for g in r.received}) == 1
    assert {g.headers["X-Gpuops-Decision-Id"] for g in r.received} == {make_decision().id}
    assert all(g.signature_ok for g in r.received)


def test_400_is_not_retried_and_reports_a_capped_body(receiver: Serve) -> None:
    r = receiver()
    r.script(Reply(400, b"E" * 1000))
    outcome = execute(webhook(r.url), make_decision(), sleep=lambda s: pytest.fail("slept"))
    assert outcome.status is OutcomeStatus.FAILURE
    assert outcome.attempts == 1
    assert outcome.error == f"webhook {r.url}/hooks/gpuops answered 400: " + "E" * 256
    assert len(r.received) == 1


def test_429_honours_retry_after(receiver: Serve) -> None:
    r = receiver()
    r.script(
        Reply(429, headers={"Retry-After": "7"}),
        Reply(503, headers={"Retry-After": "2"}),
        Reply(200),
    )
    waits: list[float] = []
    retry = RetryPolicy(attempts=3, backoff_s=0.5, max_backoff_s=60.0)
    assert execute(webhook(r.url), make_decision(), retry, waits.append).ok
    assert waits == [7.0, 2.0]


def test_a_hung_receiver_times_out_as_temporary(receiver: Serve) -> None:
    r = receiver()
    r.script(Reply(hold=True))
    with pytest.raises(TemporaryError) as exc:
        webhook(r.url, timeout_s=0.2).run(make_decision())
    assert str(exc.value) == f"webhook {r.url}/hooks/gpuops timed out after 0.2 s"


def test_a_refused_connection_is_temporary() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(TemporaryError, match=rf"webhook http://127.0.0.1:{port}/x unreachable"):
        WebhookExecutor({"url": f"http://127.0.0.1:{port}/x"}).run(make_decision())


def test_redirects_are_not_followed(receiver: Serve) -> None:
    r = receiver()
    r.script(Reply(307, b"", headers={"Location": "http://elsewhere.invalid/"}))
    with pytest.raises(PermanentError) as exc:
        webhook(r.url, token=TOKEN).run(make_decision())
    assert str(exc.value) == (
        f"webhook {r.url}/hooks/gpuops answered 307 (redirect to http://elsewhere.invalid/): "
    )
    assert len(r.received) == 1


def test_url_templating_cannot_escape_its_path_segment(receiver: Serve) -> None:
    r = receiver()
    ex = WebhookExecutor({"url": "http://unused.invalid/"})
    params = {"url": r.url + "/nodes/{{ $labels.node }}/drain"}
    changed = ex.run(make_decision(params=params, node="n1/../admin?all=1#x"))
    assert r.received[0].path == "/nodes/n1%2F..%2Fadmin%3Fall%3D1%23x/drain"
    assert changed["url"] == r.url + "/nodes/n1%2F..%2Fadmin%3Fall%3D1%23x/drain"


def test_credentials_in_the_url_are_not_reported(receiver: Serve) -> None:
    r = receiver()
    r.script(Reply(404, b"no such hook"))
    url = r.url.replace("http://", "http://user:pa55@") + "/h"
    with pytest.raises(PermanentError) as exc:
        WebhookExecutor({"url": url}).run(make_decision())
    assert str(exc.value) == f"webhook {r.url}/h answered 404: no such hook"
    assert r.received[0].headers["Authorization"].startswith("Basic ")
