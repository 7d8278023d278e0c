"""Backtests step the live evaluation over range-query results (a scripted client here; the
real Prometheus and real data are in tests/integration/offline/test_backtest_helios.py)."""

from __future__ import annotations

from dataclasses import replace

from gpuops.model.decisions import ActionSpec, Sample, freeze
from gpuops.model.rules.model import Policy
from gpuops.offline.backtest import run_backtest
from tests.fakes.prometheus import FakeSource

DAY = 86400.0
START = 1_767_225_600.0  # 2026-01-01T00:00:00Z


class RangeClient(FakeSource):
    """Every step of every range query has one sample with ``pool=p`` (the condition holds)."""

    def query_range(
        self, expr: str, start: float, end: float, step_s: float
    ) -> dict[float, tuple[Sample, ...]]:
        steps = int((end - start) // step_s) + 1
        return {
            start + i * step_s: (Sample(freeze({"pool": "p"}), 20.0, start + i * step_s),)
            for i in range(steps)
        }


POLICY = Policy(
    name="release-batch",
    group="energy",
    expr="x > 0",
    action=ActionSpec("release_batch", "log"),
    target=("pool",),
    repeat_interval_s=300,
    mode="enforce",
)


def test_unscheduled_policy_fires_then_repeats() -> None:
    (result,) = run_backtest([POLICY], RangeClient(), START, START + 3600, 60).results
    fires = [d.at - START for d in result.decisions]
    assert fires == [0, 300, 600, 900, 1200, 1500, 1800, 2100, 2400, 2700, 3000, 3300, 3600]


def test_scheduled_policy_is_evaluated_only_at_its_cron_times() -> None:
    nightly = replace(POLICY, schedule="0 22 * * *", repeat_interval_s=None)  # 22:00 only
    (result,) = run_backtest([nightly], RangeClient(), START, START + 2 * DAY, 60).results
    assert [(d.at - START) / 3600 for d in result.decisions] == [22.0]  # once: still firing at 46h
    assert result.firing_steps == 2  # the steps evaluated while firing: 22:00 of each day
