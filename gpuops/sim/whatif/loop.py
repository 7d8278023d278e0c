"""The policy loop of the policies-on run: the engine without its scheduler, every group and
cron policy evaluated at the virtual instants its schedule says, the actions finished before
the loop returns (lockstep).

Driven by ``gpuops.sim.whatif.runs`` (``run_on``): the fleet runs to ``t``, then
``PolicyLoop.evaluate(t)``. ``group_queries`` says what a group's cycle asks first (the
runtime's cycle names it as what the what-if prefetches).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime

from apscheduler.triggers.cron import CronTrigger

from gpuops.model.rules.model import Group, Policy, cron_time
from gpuops.runtime import Engine
from gpuops.runtime.cycle import age_selectors
from gpuops.sim.fleet.virtual import Meter
from gpuops.sim.whatif.errors import WhatifError
from gpuops.sim.whatif.lockstep import LockstepPrometheus
from gpuops.sources.promql import stale_expr

APPROVALS_EVERY_S = 30.0
"""How often (virtual seconds) pending approvals are checked for expiry, as the engine does."""

ACTION_WORKERS = 1
"""Actions the gate runs at once per executor in the "on" run: one, so that an instant's
actions reach the fleet in the order they were decided (a seed gives the same run)."""

ACTION_TIMEOUT_S = 60.0
"""Real seconds the loop waits for the actions of one evaluation instant to finish."""


class VirtualClock:
    """Seconds since the epoch at virtual second ``t`` of a run that starts at ``start_s``;
    the engine's wall and monotonic clock in the "on" run."""

    def __init__(self, start_s: float) -> None:
        self.start_s = start_s
        self.t = 0.0

    def __call__(self) -> float:
        return self.start_s + self.t


class PolicyLoop:
    """The engine without its scheduler: every group and cron policy evaluated at the virtual
    instants its schedule says, the actions finished before the loop returns."""

    def __init__(
        self, engine: Engine, clock: VirtualClock, prometheus: LockstepPrometheus | None = None
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.prometheus = prometheus
        """Prefetches each due group's queries (None: the cycle asks them one by one)."""
        self._crons: dict[str, tuple[Group, CronTrigger, float]] = {}
        self._approvals_at = 0.0
        self._ladder_at = 0.0
        self.evaluate_time = Meter()
        """The evaluation instants (wall) and the groups' cycles (CPU of their threads)."""
        self.gate_time = Meter()
        """Waiting for the gate's actions (wall)."""

    def bound(self, group: Group) -> float:
        """The freshness bound of ``group`` (seconds), as the engine's cycle reads it."""
        settings = self.engine.config.prometheus
        return settings.freshness(group.interval_s, group.max_sample_age_s).max_sample_age_s

    def open(self) -> None:
        """What ``Engine.start`` does before it schedules: check the stored guardrail state,
        load the rules (errors are fatal), start the audit, reconcile and resume."""
        e = self.engine
        e.store.guardrail_state()
        e.reload(strict=True)
        e.audit.start()
        e.gate.resume()
        e.alerts.start()  # alerts the health inbox raises (the reliability what-if)
        for group in e.rules.groups:
            for policy in group.policies:
                if policy.schedule is None or policy.expr is None:
                    continue
                trigger = CronTrigger.from_crontab(policy.schedule, timezone=UTC)
                one = replace(group, policies=(policy,))
                self._crons[policy.name] = (one, trigger, self._next_cron(trigger, -1.0))

    def step_s(self) -> float:
        """The evaluation step: the greatest common divisor of the groups' intervals (whole
        seconds), at most a minute (cron times are whole minutes)."""
        step = 60
        for group in self.engine.rules.groups:
            step = math.gcd(step, max(1, round(group.interval_s)))
        return float(step)

    def _next_cron(self, trigger: CronTrigger, after_t: float) -> float:
        """The virtual second of ``trigger``'s first time after virtual second ``after_t``."""
        now = datetime.fromtimestamp(self.clock.start_s + after_t + 1e-3, UTC)
        fire = trigger.get_next_fire_time(None, now)
        return math.inf if fire is None else fire.timestamp() - self.clock.start_s

    def evaluate(self, t: float) -> None:
        """Evaluate, at virtual second ``t``, every group and cron policy due then; wait for
        the actions they started."""
        self.clock.t = t
        e = self.engine
        started = time.perf_counter()
        runs: list[tuple[Group, bool]] = []
        for group in e.rules.groups:
            if round(t) % max(1, round(group.interval_s)) == 0:
                runs.append((group, False))
        for name, (group, trigger, at) in list(self._crons.items()):
            if at <= t:
                runs.append((group, True))
                self._crons[name] = (group, trigger, self._next_cron(trigger, t))
        if self.prometheus is not None:
            self.prometheus.forget()
            now = self.clock()
            probes: dict[float, list[tuple[tuple[str, ...], float]]] = {}
            for group, scheduled in runs:
                at = cron_time(now) if scheduled else now
                probe = (age_selectors(_due(group, scheduled)), self.bound(group))
                probes.setdefault(at, []).append(probe)
            for at, selectors in probes.items():
                self.prometheus.prefetch_ages(selectors, at)
            for group, scheduled in runs:
                at = cron_time(now) if scheduled else now
                exprs = [p.expr for p in _due(group, scheduled) if p.expr is not None]
                self.prometheus.prefetch(exprs, at)
        # One group at a time, in name order, each group's actions finished before the next
        # group runs (the engine's gate runs one action at a time per executor here:
        # ``ACTION_WORKERS``): the actions of one instant reach the fleet in the same order
        # on every run, so a seed gives the same "on" run. A live engine runs groups side by
        # side; their queries were asked together above, and every group still decides on
        # the samples up to ``t`` (nothing is written to Prometheus until the next step).
        runs.sort(key=lambda run: (run[1], run[0].name))
        cpu = 0.0
        gate_s = 0.0
        for group, scheduled in runs:
            cpu += self._timed(group, scheduled)
            waiting = time.perf_counter()
            idle = e.wait_idle(ACTION_TIMEOUT_S)
            gate_s += time.perf_counter() - waiting
            if not idle:
                raise WhatifError(
                    f"actions decided at virtual second {t:.0f} did not finish within "
                    f"{ACTION_TIMEOUT_S:.0f} s"
                )
        if t >= self._approvals_at:
            e.expire_approvals()
            self._approvals_at = t + APPROVALS_EVERY_S
        if t >= self._ladder_at:  # the remediation ladder's look at its nodes
            e.ladder.tick()
            self._ladder_at = t + e.config.health.ladder.interval
        waiting = time.perf_counter()
        self.evaluate_time.add(waiting - started - gate_s, cpu)
        idle = e.wait_idle(ACTION_TIMEOUT_S)
        self.gate_time.add(time.perf_counter() - waiting + gate_s, math.nan)
        if not idle:
            raise WhatifError(
                f"actions decided at virtual second {t:.0f} did not finish within "
                f"{ACTION_TIMEOUT_S:.0f} s"
            )

    def _timed(self, group: Group, scheduled: bool) -> float:
        """Evaluate ``group``; returns the CPU seconds of this thread it took."""
        started = time.thread_time()
        self.engine.evaluate_group(group, scheduled)
        return time.thread_time() - started

    def close(self) -> None:
        self.engine.stop()


def group_queries(group: Group, scheduled: bool, bound_s: float) -> Iterator[str]:
    """What the engine's cycle asks first in a run of ``group``: the stale-series probe of
    its policies (``gpuops.runtime.cycle.age_selectors`` with the group's freshness bound
    ``bound_s``, as ``Cycle._prefetch_ages`` asks it) and each policy's expression (a clear
    expression only while firing, so not here): prefetched by the what-if, answered from
    there when the cycle asks."""
    policies = _due(group, scheduled)
    probe = stale_expr(age_selectors(policies), bound_s)
    if probe is not None:
        yield probe
    for policy in policies:
        assert policy.expr is not None
        yield policy.expr


def _due(group: Group, scheduled: bool) -> list[Policy]:
    """The policies of ``group`` a run of it evaluates (cron ones, or the others)."""
    return [
        p for p in group.policies if p.expr is not None and (p.schedule is not None) == scheduled
    ]
