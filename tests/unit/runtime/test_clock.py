"""Clock: a wall-clock step back of 1 h must not stop group evaluations for an hour (as a
scheduler timing its jobs by wall clock, APScheduler 3's, would), and a step is audited.

The scheduler (``gpuops.runtime.clock``) with both clocks injected and stepped, one check at a
time; then a started engine whose wall clock steps back 1 h while its scheduler thread runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apscheduler.triggers.cron import CronTrigger

from gpuops.audit.spool import read_spool
from gpuops.model.decisions import Sample
from gpuops.runtime import Engine
from gpuops.runtime.clock import STEP_BOUND_S, Scheduler, first_run_in, group_offset
from gpuops.settings import ApiSettings, QuotaSettings
from tests.builders import build_engine
from tests.fakes.prometheus import FakeSource
from tests.waiting import wait_for

T0 = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC: a whole minute


class Clocks:
    """A wall clock and a monotonic clock that tick together; ``step`` moves only the wall."""

    def __init__(self) -> None:
        self.mono = 1000.0
        self.offset = T0 - self.mono

    def wall(self) -> float:
        return self.mono + self.offset

    def monotonic(self) -> float:
        return self.mono

    def step(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


def scheduler(clocks: Clocks, steps: list[float]) -> Scheduler:
    return Scheduler(
        wall=clocks.wall, monotonic=clocks.monotonic, on_step=steps.append, submit=lambda f: f()
    )


def run_for(s: Scheduler, clocks: Clocks, seconds: float, tick: float = 0.5) -> None:
    """Let ``seconds`` of (both) clocks pass, checking every ``tick`` as the thread does."""
    for _ in range(round(seconds / tick)):
        clocks.mono += tick
        s.run_pending()


@pytest.mark.parametrize("step", [-3600.0, +3600.0])
def test_interval_jobs_run_on_monotonic_time_through_a_step(clocks: Clocks, step: float) -> None:
    steps: list[float] = []
    s = scheduler(clocks, steps)
    runs: list[float] = []
    s.add_interval("group:g", lambda: runs.append(clocks.mono), 10.0)
    s.run_pending()
    run_for(s, clocks, 30)
    assert runs == [1000.0, 1010.0, 1020.0, 1030.0]
    clocks.step(step)
    run_for(s, clocks, 30)
    assert runs == [1000.0 + 10 * i for i in range(7)]  # no stall, no burst
    assert steps == [step]  # seen once


def test_slewing_is_not_a_step(clocks: Clocks) -> None:
    steps: list[float] = []
    s = scheduler(clocks, steps)
    s.run_pending()
    for _ in range(100):  # 100 s, each second 0.9 × the bound
        clocks.step(STEP_BOUND_S * 0.9)
        run_for(s, clocks, 1, tick=1)
    clocks.step(STEP_BOUND_S * 1.1)
    run_for(s, clocks, 1, tick=1)
    assert steps == [pytest.approx(STEP_BOUND_S * 1.1)]


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        # back: before, the next run stayed at T0 + 180 on the wall clock, an hour away
        (-3600.0, [T0 + 60, T0 + 120, T0 - 3600 + 180, T0 - 3600 + 240]),
        # forward: 180 cron minutes "missed", none run: the next minute of the new wall time
        (3 * 3600.0, [T0 + 60, T0 + 120, T0 + 3 * 3600 + 180, T0 + 3 * 3600 + 240]),
    ],
)
def test_cron_is_re_anchored_to_the_next_minute_of_the_new_wall_time(
    clocks: Clocks, step: float, expected: list[float]
) -> None:
    steps: list[float] = []
    s = scheduler(clocks, steps)
    runs: list[float] = []
    s.add_cron(
        "schedule:p", lambda: runs.append(clocks.wall()), CronTrigger.from_crontab("* * * * *")
    )
    run_for(s, clocks, 120)
    clocks.step(step)
    run_for(s, clocks, 120)
    assert runs == expected
    assert steps == [step]


def test_a_running_job_is_not_started_twice_and_its_runs_coalesce(clocks: Clocks) -> None:
    started: list[float] = []
    queued: list[object] = []
    s = Scheduler(wall=clocks.wall, monotonic=clocks.monotonic, submit=queued.append)
    s.add_interval("slow", lambda: started.append(clocks.mono), 1.0)
    s.run_pending()
    run_for(s, clocks, 5)  # the first run has not finished: nothing else is started
    assert len(queued) == 1
    queued.pop()()  # type: ignore[operator]
    run_for(s, clocks, 1)
    assert len(queued) == 1
    job = s.get_job("slow")
    assert job is not None and job.due == clocks.mono + 1.0  # on its grid, missed runs dropped


# --- a started engine -------------------------------------------------------------------------

RULES = """
groups:
  - name: g
    interval: 1s
    rules:
      - policy: idle
        expr: idle
        for: 0s
        target: [uuid]
        action: {type: reclaim, executor: log}
        mode: dry-run
"""


class Prometheus(FakeSource):
    def __init__(self) -> None:
        self.at: list[float] = []
        self.lock = threading.Lock()

    def query(self, expr: str, at: float | None = None) -> tuple[Sample, ...]:
        with self.lock:
            self.at.append(at or 0.0)
        return ()


class SteppedWall:
    """The real time plus an offset the test steps."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[tuple[Engine, Prometheus, SteppedWall]]:
    prom, wall = Prometheus(), SteppedWall()
    engine = build_engine(
        tmp_path,
        RULES,
        source=prom,
        clock=wall,
        executors={},
        reload=False,  # Engine.start loads them
        reload_check_interval=1.0,
        api=ApiSettings(quota=QuotaSettings(executor="log", check_interval=1.0)),
    )
    yield engine, prom, wall
    engine.stop()


def test_a_step_back_of_an_hour_keeps_the_engine_evaluating(
    engine: tuple[Engine, Prometheus, SteppedWall], tmp_path: Path
) -> None:
    eng, prom, wall = engine
    ticks = {"quota": 0, "reload": 0}
    quota_tick, reload = eng.quota.tick, eng.rulebook.check_reload

    def count(name: str, func: object) -> object:
        def counted() -> None:
            ticks[name] += 1
            func()  # type: ignore[operator]

        return counted

    eng.quota.tick = count("quota", quota_tick)  # type: ignore[method-assign]
    eng.rulebook.check_reload = count("reload", reload)  # type: ignore[method-assign]
    eng.start()
    wait_for(lambda: len(prom.at) >= 2, what="evaluations before the step")
    wall.offset = -3600.4
    stepped_at = len(prom.at)
    before = dict(ticks)
    wait_for(lambda: len(prom.at) >= stepped_at + 3, what="evaluations after the step")
    wait_for(lambda: all(ticks[k] > before[k] for k in ticks), what="quota and reload ticks")

    steps = [d for d in read_spool(tmp_path / "audit") if d["event"]["action"] == "clock_step"]
    assert len(steps) == 1
    assert steps[0]["gpuops"]["clock"] == {
        "step_seconds": pytest.approx(-3600.4, abs=0.5),
        "direction": "backward",
    }
    value = eng.metrics.registry.get_sample_value(
        "gpuops_engine_clock_steps_total", {"direction": "backward"}
    )
    assert value == 1.0
    after = prom.at[stepped_at + 1 :]  # the first run after the step may be on either grid
    # evaluation times are grid times of the new wall clock: one interval apart, near it
    assert all(
        b - a == pytest.approx(1.0, abs=1e-6) for a, b in zip(after, after[1:], strict=False)
    )
    assert all(abs(at - wall()) < 30 for at in after)


def test_a_job_replaced_while_it_runs_is_not_started_beside_it(clocks: Clocks) -> None:
    """A rule reload replaces the group's job (due at once) while its evaluation runs."""
    queued: list[object] = []
    s = Scheduler(wall=clocks.wall, monotonic=clocks.monotonic, submit=queued.append)
    s.add_interval("group:g", lambda: None, 1.0)
    s.run_pending()
    s.add_interval("group:g", lambda: None, 1.0)
    s.run_pending()
    assert len(queued) == 1
    queued.pop()()  # type: ignore[operator]
    clocks.mono += 1.0
    s.run_pending()
    assert len(queued) == 1


def test_groups_run_at_their_own_phase_like_prometheus_spreads_them() -> None:
    """Groups do not all start at the engine's start, at once: each runs at a phase given by
    a hash of its name, the same after a restart."""
    names = [f"group-{i}" for i in range(40)]
    phases = [group_offset(name, 30.0) for name in names]
    assert all(0 <= p < 30 for p in phases)
    assert phases == [group_offset(name, 30.0) for name in names]  # stable
    assert len({int(p) for p in phases}) >= 15  # spread over the interval
    for wall in (T0, T0 + 7.25, T0 + 29.9):
        first = first_run_in("group-3", 30.0, wall)
        assert 0 <= first < 30
        assert (wall + first) % 30 == pytest.approx(group_offset("group-3", 30.0), abs=1e-6)
