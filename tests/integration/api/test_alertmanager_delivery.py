"""A real Prometheus alerting rule → a real Alertmanager → the engine's webhook receiver →
action → audit; Alertmanager retries when the engine answers 5xx, and nothing acts twice."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuops.sources.promproc import AlertmanagerServer, PrometheusServer
from tests.integration.api.harness import Harness, running_api
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

POLICY = "drain-on-gpu-fell-off-bus"

PROMETHEUS = """\
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: [{rules}]
alerting:
  alertmanagers:
    - static_configs: [{{targets: ["127.0.0.1:{am_port}"]}}]
"""

ALERT_RULES = """\
groups:
  - name: gpu
    interval: 1s
    rules:
      - alert: GPUFellOffBus
        expr: vector(1)
        labels: {node: gpu-node-7, severity: critical}
        annotations: {summary: "XID 79 on gpu-node-7"}
"""


def alertmanager_config(url: str, auth: dict[str, Any]) -> str:
    config = {
        "route": {
            "receiver": "gpuops",
            "group_by": ["alertname", "node"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [
            {
                "name": "gpuops",
                "webhook_configs": [
                    {
                        "url": f"{url}/api/v1/alertmanager",
                        "send_resolved": True,
                        "http_config": auth,
                    }
                ],
            }
        ],
    }
    return json.dumps(config)  # JSON is YAML


class FailFirstDelivery:
    """The engine takes the first notification, but its answer is lost: Alertmanager sees a 500
    (as after a crash between queueing and answering) and must retry."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.failed = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != "/api/v1/alertmanager" or self.failed:
            await self.app(scope, receive, send)
            return
        self.failed += 1

        async def lose(message: Message) -> None:
            pass

        await self.app(scope, receive, lose)
        body = b'{"detail": "injected failure"}'
        headers = [(b"content-type", b"application/json"), (b"content-length", b"30")]
        await send({"type": "http.response.start", "status": 500, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _metric(api: Harness, result: str) -> float:
    registry = api.engine.metrics.registry  # the alert inbox is the engine's
    value = registry.get_sample_value("gpuops_api_alerts_total", {"result": result})
    return value or 0.0


def test_prometheus_alert_through_alertmanager_acts_once_despite_a_5xx(tmp_path: Path) -> None:
    injector: list[FailFirstDelivery] = []

    def wrap(app: ASGIApp) -> ASGIApp:
        injector.append(FailFirstDelivery(app))
        return injector[0]

    with running_api(tmp_path / "engine", wrap=wrap) as api:
        bearer = {"authorization": {"type": "Bearer", "credentials": api.tokens["alertmanager"]}}
        am = AlertmanagerServer(tmp_path / "am", alertmanager_config(api.url, bearer))
        am.start()
        try:
            prom = PrometheusServer(
                tmp_path / "prom", "", extra_args=["--rules.alert.resend-delay=1s"]
            )
            (prom.workdir / "alerts.yml").write_text(ALERT_RULES)
            prom.config_path.write_text(
                PROMETHEUS.format(rules=prom.workdir / "alerts.yml", am_port=am.port)
            )
            prom.start()
            try:
                wait_for(lambda: _metric(api, "duplicate") >= 1, 60, "Alertmanager's retry")
                api.settle()
            finally:
                prom.stop()
        finally:
            am.stop()
        assert injector[0].failed == 1
        assert _metric(api, "handled") == 1
        [outcome] = api.executed(POLICY)
        assert outcome.ok
        [(decision, _)] = [(d, o) for d, o in api.decisions if o is not None]
        assert decision.target.key == "node=gpu-node-7"
        audited = [
            d
            for d in api.audit()
            if d["event"]["dataset"] == "gpuops.decision" and d["rule"]["name"] == POLICY
        ]
        assert [d["event"]["outcome"] for d in audited] == ["unknown", "success"]  # intent first
        calls = [d for d in api.operations() if d["event"]["action"] == "receive_alerts"]
        assert {d["user"]["name"] for d in calls} == {"am"}
        # The engine answered both deliveries (the first answer was lost on the way back).
        assert len(calls) >= 2


def test_resolved_alert_with_basic_auth_runs_on_clear(tmp_path: Path) -> None:
    with running_api(tmp_path / "engine") as api:
        basic = {"basic_auth": {"username": "am", "password": api.tokens["alertmanager"]}}
        with AlertmanagerServer(tmp_path / "am", alertmanager_config(api.url, basic)) as am:
            starts = datetime.now(UTC).replace(microsecond=0)
            alert = {
                "labels": {"alertname": "GPUFellOffBus", "node": "gpu-node-3"},
                "startsAt": starts.isoformat(),
            }
            requests.post(f"{am.url}/api/v2/alerts", json=[alert], timeout=5).raise_for_status()
            wait_for(lambda: api.executed(POLICY), 30, "the firing alert's action")
            ended = {**alert, "endsAt": (starts + timedelta(seconds=1)).isoformat()}
            requests.post(f"{am.url}/api/v2/alerts", json=[ended], timeout=5).raise_for_status()
            wait_for(lambda: len(api.executed(POLICY)) == 2, 30, "the resolved alert's on_clear")
        api.settle()
        done = [(d.transition.value, d.action.type if d.action else "") for d, o in api.decisions]
        assert done == [("fire", "migrate"), ("resolve", "notify")]
