"""The gate's lanes: a webhook receiver that is slow (answers after the timeout) or failing
(answers 500) delays only its own actions, and a healthy receiver's action runs within one
evaluation interval of its decision; lanes named from label values are capped.

Real HTTP receivers on 127.0.0.1 port 0 (``tests.fakes.receiver``) and the real webhook
executor; for the cap, an executor of the test's own that names a lane per target and blocks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpuops.actions.retry import RetryPolicy
from gpuops.actions.webhook import WebhookExecutor
from gpuops.model.decisions import Decision, OutcomeStatus
from gpuops.runtime.gate import LANES_PER_EXECUTOR
from tests.builders import build_engine
from tests.fakes.prometheus import FakePrometheus
from tests.fakes.receiver import Receiver, Reply
from tests.waiting import wait_for

INTERVAL_S = 5.0
"""The policies' evaluation interval: a healthy receiver's action must run within it."""
TIMEOUT_S = 1.0
"""The webhook timeout (the slow receiver answers after 3 of them)."""
RETRY = RetryPolicy(attempts=3, backoff_s=0.5)
"""Three tries, as the engine's default: a slow action holds its worker for about 4.5 s."""


def _policy(name: str, url: str) -> str:
    return f"""
      - policy: {name}
        expr: {name}
        for: 0s
        target: [uuid]
        action:
          type: notify
          executor: webhook
          params: {{url: "{url}/hook/{{{{ $labels.uuid }}}}", timeout_s: {TIMEOUT_S}}}
        mode: enforce"""


class Laned:
    """Names a lane per target (its ``uuid``, as a host templated from labels would); blocks
    while ``gate`` is clear. Registered as ``log`` (rules name only known executors)."""

    name = "log"
    verbs: frozenset[str] | None = None

    def __init__(self) -> None:
        self.ran: list[Decision] = []
        self.gate = threading.Event()
        self._lock = threading.Lock()

    def lane(self, decision: Decision) -> str:
        return decision.target.labels["uuid"]

    def run(self, decision: Decision) -> Mapping[str, Any]:
        with self._lock:
            self.ran.append(decision)
        assert self.gate.wait(30), "test executor never released"
        return {}


class World:
    def __init__(self, tmp: Path) -> None:
        self.slow, self.failing, self.healthy = Receiver(), Receiver(), Receiver()
        self.slow.script(Reply(delay=3 * TIMEOUT_S))
        self.failing.script(Reply(status=500, body=b"receiver broken"))
        self.laned = Laned()
        self.prom = FakePrometheus()
        self.outcomes: dict[str, OutcomeStatus] = {}
        rules = (
            f"groups:\n  - name: g\n    interval: {INTERVAL_S:g}s\n    rules:"
            + _policy("slow", self.slow.url)
            + _policy("failing", self.failing.url)
            + _policy("healthy", self.healthy.url)
            + """
      - policy: per-gpu
        expr: gpus
        for: 0s
        target: [uuid]
        action: {type: notify, executor: log}
        mode: enforce
"""
        )
        self.engine = build_engine(
            tmp,
            rules,
            source=self.prom,
            clock=lambda: 2_000_000.0,
            executors={"webhook": WebhookExecutor, "log": self.laned},
            action_workers=4,
            action_retry=RETRY,
            listener=self._heard,
        )

    def _heard(self, decision: Decision, outcome: Any) -> None:
        if outcome is not None:
            self.outcomes[decision.id] = outcome.status

    def evaluate(self, policy: str, targets: int) -> list[Decision]:
        self.prom.results[policy if policy != "per-gpu" else "gpus"] = [
            {"uuid": f"GPU-{i:02d}"} for i in range(targets)
        ]
        found = self.engine.rules.policy(policy)
        assert found is not None
        return self.engine.evaluate_policy(found)

    def close(self) -> None:
        self.engine.set_control("kill_switch", True, "test")  # no further tries, queue held
        self.laned.gate.set()
        self.engine.stop()
        for receiver in (self.slow, self.failing, self.healthy):
            receiver.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.close()


def test_a_slow_and_a_failing_receiver_do_not_delay_a_healthy_one(world: World) -> None:
    """8 targets on a receiver answering after 3 timeouts (3 tries each), one on a receiver
    answering 500, then one on a healthy receiver: its action runs at once. Sharing one pool
    of 4 workers with them, it would wait behind two waves of slow actions (about 9 s)."""
    assert len(world.evaluate("slow", 8)) == 8
    assert len(world.evaluate("failing", 1)) == 1
    wait_for(lambda: len(world.slow.received) >= 4, 10, "4 slow requests holding workers")
    decided = time.monotonic()
    (healthy,) = world.evaluate("healthy", 1)
    wait_for(
        lambda: world.outcomes.get(healthy.id),
        INTERVAL_S,
        "the healthy receiver's action within one evaluation interval",
    )
    assert time.monotonic() - decided < INTERVAL_S
    assert world.outcomes[healthy.id] is OutcomeStatus.SUCCESS
    assert [r.path for r in world.healthy.received] == ["/hook/GPU-00"]
    # nor are the failing receiver's tries held up by the slow one
    wait_for(lambda: len(world.failing.received) == 3, INTERVAL_S, "the 500 receiver's 3 tries")


def test_lanes_are_capped_and_idle_ones_make_room(world: World) -> None:
    """Lanes named from label values (one per target here) get workers of their own up to the
    cap; the other lanes share one more pool of 4; once idle, a lane makes room for a new one."""

    def threads() -> int:
        return sum(t.name.startswith("gpuops-log-") for t in threading.enumerate())

    targets = LANES_PER_EXECUTOR + 8
    assert len(world.evaluate("per-gpu", targets)) == targets
    running = LANES_PER_EXECUTOR + 4  # a worker per own lane, the shared pool's 4
    wait_for(lambda: len(world.laned.ran) == running, 10, "an action per lane running")
    assert threads() == running  # all blocked: 4 actions wait in the shared pool
    world.laned.gate.set()
    assert world.engine.wait_idle(10)
    assert len(world.laned.ran) == targets
    world.laned.gate.clear()
    assert len(world.evaluate("per-gpu", targets + LANES_PER_EXECUTOR)) == LANES_PER_EXECUTOR
    wait_for(lambda: len(world.laned.ran) == targets + LANES_PER_EXECUTOR, 10, "16 new lanes")
    wait_for(lambda: threads() == running, 10, "the replaced lanes' threads ending")
