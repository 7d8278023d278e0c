"""``gpuops.actions.base``: the one function that turns what executors raise into Outcomes (with
retries and backoff through an injected sleep and clock), and the registry of executors."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from gpuops.actions.base import Executor, PermanentError, TemporaryError, execute, lane
from gpuops.actions.registry import ExecutorRegistry
from gpuops.actions.retry import RetryPolicy
from gpuops.model.decisions import Decision, OutcomeStatus
from tests.unit.actions.support import make_decision


class Scripted:
    """An executor that raises or returns the scripted results in order."""

    name = "scripted"

    def __init__(self, *results: Mapping[str, Any] | Exception, verbs: set[str] | None = None):
        self.results = list(results)
        self.verbs = frozenset(verbs) if verbs is not None else None
        self.calls: list[str] = []

    def run(self, decision: Decision) -> Mapping[str, Any]:
        self.calls.append(decision.id)
        result = self.results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result


def no_sleep(seconds: float) -> None:
    raise AssertionError(f"must not sleep (asked for {seconds} s)")


def ticking(step: float = 1.0) -> Iterator[float]:
    t = 0.0
    while True:
        yield t
        t += step


def test_success_carries_what_changed_in_one_attempt() -> None:
    clock = ticking(0.25)
    outcome = execute(
        Scripted({"reclaimed": "GPU-1"}), make_decision(), sleep=no_sleep, clock=lambda: next(clock)
    )
    assert outcome.status is OutcomeStatus.SUCCESS
    assert outcome.ok
    assert dict(outcome.changed) == {"reclaimed": "GPU-1"}
    assert outcome.attempts == 1
    assert outcome.duration_s == 0.25
    assert outcome.error is None


def test_temporary_errors_are_retried_with_doubling_backoff() -> None:
    waits: list[float] = []
    ex = Scripted(TemporaryError("503"), TemporaryError("503"), TemporaryError("503"), {"ok": 1})
    outcome = execute(ex, make_decision(), RetryPolicy(attempts=4, backoff_s=0.5), waits.append)
    assert outcome.ok
    assert outcome.attempts == 4
    assert waits == [0.5, 1.0, 2.0]
    assert ex.calls == [make_decision().id] * 4


def test_backoff_and_the_errors_own_delay_are_capped() -> None:
    waits: list[float] = []
    ex = Scripted(TemporaryError("busy", delay=30.0), TemporaryError("x"), TemporaryError("y"), {})
    retry = RetryPolicy(attempts=4, backoff_s=2.0, max_backoff_s=5.0)
    assert execute(ex, make_decision(), retry, waits.append).ok
    assert waits == [5.0, 4.0, 5.0]  # the delay asked for, capped; then 2*2, then 2*4 capped


def test_temporary_errors_fail_after_the_last_attempt() -> None:
    waits: list[float] = []
    ex = Scripted(*(TemporaryError(f"timeout {i}") for i in range(3)))
    outcome = execute(ex, make_decision(), RetryPolicy(attempts=3, backoff_s=1.0), waits.append)
    assert outcome.status is OutcomeStatus.FAILURE
    assert outcome.attempts == 3
    assert outcome.error == "timeout 2"
    assert waits == [1.0, 2.0]


def test_permanent_errors_are_not_retried() -> None:
    ex = Scripted(PermanentError("400 bad request"), {"never": True})
    outcome = execute(ex, make_decision(), sleep=no_sleep)
    assert outcome.status is OutcomeStatus.FAILURE
    assert outcome.attempts == 1
    assert outcome.error == "400 bad request"
    assert len(ex.calls) == 1


def test_an_unexpected_exception_becomes_a_failure_with_its_type() -> None:
    outcome = execute(Scripted(KeyError("uuid")), make_decision(), sleep=no_sleep)
    assert outcome.status is OutcomeStatus.FAILURE
    assert outcome.attempts == 1
    assert outcome.error == "KeyError: 'uuid'"


def test_errors_are_capped() -> None:
    outcome = execute(Scripted(PermanentError("x" * 5000)), make_decision(), sleep=no_sleep)
    assert outcome.error == "x" * 1024


def test_an_unsupported_verb_fails_without_running() -> None:
    ex = Scripted(AssertionError("must not run"), verbs={"reclaim", "downclock"})
    outcome = execute(ex, make_decision("migrate"), sleep=no_sleep)
    assert outcome.status is OutcomeStatus.FAILURE
    assert outcome.attempts == 0
    assert outcome.error == (
        "executor 'scripted' does not support action 'migrate' (supported: downclock, reclaim)"
    )
    assert ex.calls == []


def test_entry_points_register_the_built_in_executors() -> None:
    registry = ExecutorRegistry.from_entry_points()
    assert {"log", "fleet", "nvml-agent", "webhook", "command"} <= set(registry.names())
    for name in ("log", "fleet", "nvml-agent", "webhook", "command"):
        created = registry.create(name)
        assert isinstance(created, Executor)
        assert created.name == name


def test_unknown_executor_names_the_known_ones() -> None:
    registry = ExecutorRegistry()
    with pytest.raises(KeyError) as empty:
        registry.create("webhook")
    assert empty.value.args[0] == "unknown executor 'webhook' (known: none)"
    registry.register("log", lambda settings: Scripted())
    registry.register("fleet", lambda settings: Scripted())
    with pytest.raises(KeyError) as unknown:
        registry.create("webhok")
    assert unknown.value.args[0] == "unknown executor 'webhok' (known: fleet, log)"


def test_registry_passes_settings_to_the_factory() -> None:
    seen: list[Mapping[str, Any]] = []

    def factory(settings: Mapping[str, Any]) -> Executor:
        seen.append(settings)
        return Scripted()

    registry = ExecutorRegistry()
    registry.register("scripted", factory)
    registry.create("scripted", {"url": "http://x"})
    registry.create("scripted")
    assert seen == [{"url": "http://x"}, {}]


class Laned(Scripted):
    def __init__(self, named: Any) -> None:
        super().__init__()
        self.named = named

    def lane(self, decision: Decision) -> Any:
        if isinstance(self.named, Exception):
            raise self.named
        return self.named


def test_the_lane_is_what_the_executor_names_or_its_own(caplog: pytest.LogCaptureFixture) -> None:
    decision = make_decision()
    assert lane(Scripted(), decision) == ""  # no lane method: one lane for the executor
    assert lane(Laned("https://hooks.example.com:443"), decision) == "https://hooks.example.com:443"
    assert lane(Laned(None), decision) == ""
    assert lane(Laned(KeyError("url")), decision) == ""  # a bug there: the action still runs
    assert f"executor scripted: lane of decision {decision.id} failed" in caplog.text
