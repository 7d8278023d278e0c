"""A real engine (``tests.builders.build_engine``) behind a real API server on a free loopback
port, for the API's integration tests and the browser tests: users of every role, an injected
clock, the audit spool to read back."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from starlette.types import ASGIApp

from gpuops.api import ApiServer, create_app, hash_token
from gpuops.api.context import ApiContext
from gpuops.audit.spool import read_spool
from gpuops.model.decisions import Decision, Outcome
from gpuops.runtime import Engine
from gpuops.settings import ApiSettings, GuardrailSettings, QuotaSettings
from gpuops.sources.interface import MetricsSource
from tests.builders import USERS, Clock, build_engine, write_tokens

RULES = """\
groups:
  - name: api-test
    interval: 1h
    rules:
      - policy: drain-on-gpu-fell-off-bus
        trigger: {alertmanager: {alertname: GPUFellOffBus}}
        target: [node]
        action: {type: migrate, executor: log}
        on_clear: {type: notify, executor: log}
        mode: enforce
      - policy: reclaim-with-approval
        trigger: {alertmanager: {alertname: GPUIdle}}
        target: [node, uuid]
        action: {type: reclaim, executor: log}
        mode: enforce
        approval: required
"""


@dataclass
class Harness:
    tmp: Path
    engine: Engine
    server: ApiServer
    context: ApiContext
    tokens: dict[str, str]
    clock: Clock
    session: requests.Session = field(default_factory=requests.Session)
    decisions: list[tuple[Decision, Outcome | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def tokens_file(self) -> Path:
        return self.tmp / "tokens.yaml"

    def call(self, role: str | None, method: str, path: str, **kw: Any) -> requests.Response:
        headers = dict(kw.pop("headers", {}))
        if role is not None:
            headers["Authorization"] = f"Bearer {self.tokens[role]}"
        # a new connection per call: a kept-alive one that the server closes after its idle
        # timeout (uvicorn: 5 s) while the request is sent fails with "Remote end closed
        # connection" on a loaded machine
        headers.setdefault("Connection", "close")
        kw.setdefault("timeout", 30)
        return self.session.request(method, f"{self.url}{path}", headers=headers, **kw)

    def audit(self) -> list[dict[str, Any]]:
        return list(read_spool(self.tmp / "audit"))

    def operations(self) -> list[dict[str, Any]]:
        return [d for d in self.audit() if d["event"]["dataset"] == "gpuops.audit"]

    def alert(self, name: str, status: str = "firing", **labels: str) -> dict[str, Any]:
        all_labels = {"alertname": name, **labels}
        return {
            "status": status,
            "labels": all_labels,
            "annotations": {},
            "startsAt": "2030-01-01T00:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z",
            "generatorURL": "",
            "fingerprint": hash_token(repr(sorted(all_labels.items())))[:16],
        }

    def notify(self, *alerts: dict[str, Any], role: str = "alertmanager") -> requests.Response:
        status = "firing" if any(a["status"] == "firing" for a in alerts) else "resolved"
        payload = {
            "version": "4",
            "groupKey": "{}:{}",
            "truncatedAlerts": 0,
            "status": status,
            "receiver": "gpuops",
            "groupLabels": {},
            "commonLabels": {},
            "commonAnnotations": {},
            "externalURL": "http://alertmanager",
            "alerts": list(alerts),
        }
        return self.call(role, "POST", "/api/v1/alertmanager", json=payload)

    def settle(self) -> None:
        """Wait until queued alerts are handled and their actions ran."""
        assert self.context.alerts.wait_idle(60)  # bounds for a loaded 2-core machine
        assert self.engine.wait_idle(60)

    def record(self, decision: Decision, outcome: Outcome | None) -> None:
        with self.lock:
            self.decisions.append((decision, outcome))

    def executed(self, policy: str) -> list[Outcome]:
        with self.lock:
            return [o for d, o in self.decisions if d.policy == policy and o is not None]


@contextmanager
def running_api(
    tmp: Path,
    *,
    rules: str = RULES,
    quota: QuotaSettings | None = None,
    executors: dict[str, dict[str, Any]] | None = None,
    api: dict[str, Any] | None = None,
    wrap: Callable[[ASGIApp], ASGIApp] | None = None,
    guardrails: GuardrailSettings | None = None,
    prometheus: str | None = None,
    source: MetricsSource | None = None,
    health: dict[str, Any] | None = None,
) -> Iterator[Harness]:
    """An engine with ``rules`` and its API on a free port; ``wrap`` puts ASGI middleware of
    the test's own in front (fault injection); ``prometheus``: the URL its queries go to, or
    ``source``: what answers them (a scripted Prometheus); ``health``: the configuration's
    ``health`` section."""
    tmp.mkdir(parents=True, exist_ok=True)
    tokens = {role: f"{role}-{secrets.token_urlsafe(24)}" for role in USERS}
    write_tokens(tmp / "tokens.yaml", tokens)
    settings = ApiSettings(
        tokens_file=tmp / "tokens.yaml",
        quota=quota or QuotaSettings(check_interval=3600),
        **(api or {}),
    )
    clock = Clock(time.time())
    holder: list[Harness] = []
    engine = build_engine(
        tmp,
        {"api-test.yaml": rules},
        clock=clock,
        listener=lambda d, o: holder[0].record(d, o),
        executor_settings=executors or {},  # the installed executors, so configured
        guardrails=guardrails,
        api=settings,
        **({"prometheus": prometheus} if prometheus else {}),
        **({"health": health} if health else {}),
        source=source,
    )
    try:
        engine.alerts.start()  # the engine's own thread (``Engine.start`` would schedule too)
        app = create_app(engine, settings, environ={})
        server = ApiServer(
            wrap(app) if wrap else app,
            "127.0.0.1:0",
            settings.tls_cert_file,
            settings.tls_key_file,
        )
        harness = Harness(tmp, engine, server, app.state.api, tokens, clock)
        holder.append(harness)
        server.start()
        try:
            yield harness
        finally:
            harness.session.close()
            server.stop()
    finally:
        engine.stop()
