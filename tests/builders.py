"""One way to build what the tests need: an ``Engine`` (``build_engine``), its configuration
(``engine_config``), an injected wall clock (``Clock``) and a tokens file with a user of every
role (``write_tokens``).

``build_engine`` is the engine of the unit tests (a fake ``MetricsSource`` from
``tests/fakes/prometheus.py``, executors of the test's own from ``tests/fakes/executors.py``,
a ``Clock``), of the integration and end-to-end tests (a real Prometheus: no ``source``, the
engine's own client for ``prometheus``) and of the benchmarks. Whatever a test needs beyond the
defaults is an argument: every field of ``EngineConfig`` as a keyword, and every argument of
``Engine`` itself. Whoever builds an engine stops it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpuops.actions.base import Executor
from gpuops.actions.registry import ExecutorFactory, ExecutorRegistry
from gpuops.actions.retry import RetryPolicy
from gpuops.api import hash_token
from gpuops.audit import AuditLog
from gpuops.runtime import Engine
from gpuops.runtime.gate import DecisionListener
from gpuops.runtime.metrics import EngineMetrics
from gpuops.settings import AuditConfig, EngineConfig, GuardrailSettings, PrometheusSettings
from gpuops.sources import MetricsSource

Rules = str | Mapping[str, str] | Sequence[Path]
"""Rule text (written to ``rules/p.yaml`` under the test's directory), rule texts by file name
(each written there), or the paths of rule files and directories to load as they are."""

Executors = Mapping[str, Executor | ExecutorFactory] | ExecutorRegistry
"""Executors by name: an executor (every engine built with it runs that one object) or a
factory of executors from their settings (an executor class); or a whole registry."""


class Clock:
    """Wall-clock seconds that a test sets (``now``) and moves (``advance``)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def write_rules(tmp: Path, rules: Rules | None) -> list[Path]:
    """The rule paths of ``rules`` (see ``Rules``), written under ``tmp/rules`` when they are
    text; None: ``tmp/rules`` as the test wrote it."""
    directory = tmp / "rules"
    if rules is None:
        return [directory]
    if isinstance(rules, str):
        rules = {"p.yaml": rules}
    if isinstance(rules, Mapping):
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in rules.items():
            (directory / name).write_text(text)
        return [directory]
    return list(rules)


def registry_of(executors: Executors | None) -> ExecutorRegistry | None:
    """The registry of ``executors`` (see ``Executors``); None: the engine's own, from the
    entry points."""
    if executors is None or isinstance(executors, ExecutorRegistry):
        return executors
    registry = ExecutorRegistry()
    for name, executor in executors.items():
        registry.register(name, _factory(executor))
    return registry


def _factory(executor: Executor | ExecutorFactory) -> ExecutorFactory:
    if isinstance(executor, type) or not isinstance(executor, Executor):
        return executor  # a class or another callable made of the settings
    return lambda settings: executor


def engine_config(
    tmp: Path,
    rules: Sequence[Path] | None = None,
    *,
    prometheus: str | PrometheusSettings | None = None,
    guardrails: GuardrailSettings | None = None,
    executor_settings: Mapping[str, Mapping[str, Any]] | None = None,
    **settings: Any,
) -> EngineConfig:
    """The configuration of a test's engine: the rules at ``rules`` (default ``tmp/rules``),
    the state file ``tmp/state.sqlite``, the audit spool ``tmp/audit``, no metrics listener;
    ``prometheus`` a URL or settings (default: the configuration's own); ``executor_settings``
    its ``executors`` (each executor's settings by name); any other field of ``EngineConfig``
    as a keyword."""
    fields: dict[str, Any] = {
        "rules": list(rules) if rules is not None else [tmp / "rules"],
        "state_file": tmp / "state.sqlite",
        "audit": AuditConfig(spool_dir=tmp / "audit"),
        "metrics_listen": None,
        "guardrails": guardrails or GuardrailSettings(),
        "executors": {name: dict(s) for name, s in (executor_settings or {}).items()},
    }
    if prometheus is not None:
        fields["prometheus"] = (
            PrometheusSettings(url=prometheus) if isinstance(prometheus, str) else prometheus
        )
    fields.update(settings)
    return EngineConfig(**fields)


def build_engine(
    tmp: Path,
    rules: Rules | None = None,
    *,
    source: MetricsSource | None = None,
    clock: Callable[[], float] = time.time,
    executors: Executors | None = None,
    executor_settings: Mapping[str, Mapping[str, Any]] | None = None,
    guardrails: GuardrailSettings | None = None,
    config: EngineConfig | None = None,
    reload: bool = True,
    monotonic: Callable[[], float] = time.monotonic,
    audit_log: AuditLog | None = None,
    metrics: EngineMetrics | None = None,
    listener: DecisionListener | None = None,
    action_workers: int = 4,
    action_retry: RetryPolicy | None = None,
    **settings: Any,
) -> Engine:
    """An engine on ``tmp`` (state file, audit spool, rules: ``engine_config``) with ``rules``
    (see ``Rules``), loaded strictly unless ``reload`` is False (``Engine.start`` loads them).

    ``source``: where its metrics come from (None: the engine's own client for the configured
    Prometheus); ``clock``: its wall clock (a ``Clock`` in unit tests); ``executors``: see
    ``Executors`` (None: the installed ones, by entry point), ``executor_settings`` their
    settings by name (the configuration's ``executors``); ``config``: a whole configuration
    instead of ``engine_config``'s; other keywords are ``EngineConfig`` fields (``audit``: its
    ``AuditConfig``). ``audit_log`` is the engine's ``AuditLog`` (None: its own, of the
    configuration's ``audit``); the rest are ``Engine``'s own arguments."""
    paths = write_rules(tmp, rules)
    if config is None:
        config = engine_config(
            tmp, paths, guardrails=guardrails, executor_settings=executor_settings, **settings
        )
    else:
        fields = guardrails is not None or executor_settings is not None or settings
        assert not fields, "a whole config, or its fields: not both"
    engine = Engine(
        config,
        clock=clock,
        monotonic=monotonic,
        executors=registry_of(executors),
        audit=audit_log,
        prometheus=source,
        metrics=metrics,
        listener=listener,
        action_workers=action_workers,
        action_retry=action_retry,
    )
    if reload:
        try:
            engine.reload(strict=True)
        except BaseException:
            engine.stop()
            raise
    return engine


USERS = {
    "admin": ("alice", ["admin"]),
    "developer": ("dave", ["developer"]),
    "auditor": ("audrey", ["auditor"]),
    "alertmanager": ("am", ["alertmanager"]),
}
"""A user of every role: role -> (user name, roles)."""


def write_tokens(path: Path, tokens: dict[str, str], roles: list[str] | None = None) -> None:
    """A tokens file at ``path`` with the user of each role in ``tokens`` (role -> token), or
    of ``roles`` only."""
    users = [
        {"name": USERS[role][0], "roles": USERS[role][1], "token_sha256": hash_token(token)}
        for role, token in tokens.items()
        if roles is None or role in roles
    ]
    path.write_text(yaml.safe_dump({"users": users}))
