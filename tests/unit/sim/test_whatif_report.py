"""The what-if comparison: the case study's targets judged from the two runs' figures, and the
table naming each figure off vs on."""

from __future__ import annotations

from dataclasses import replace

from gpuops.sim.fleet.report import ClassFigures, PoolFigures, RunReport
from gpuops.sim.whatif import RunResult, Whatif
from gpuops.sim.whatif.report import table, targets, to_json

OFF = RunReport(
    fleet="f",
    hours=24.0,
    gpus_mean=46.0,
    utilization_powered=0.40,
    utilization_allocated=0.55,
    allocation_ratio=0.72,
    jobs_completed=100,
    jobs_queued_at_end=10,
    jct_mean_s=4 * 3600.0,
    jct_p95_s=9 * 3600.0,
    wait_mean_s=3600.0,
    preemptions=20,
    reclaims=0,
    reclaimed_gpu_hours=0.0,
    energy_kwh=150.0,
    energy_cost=100.0,
    currency="CNY",
    work_gpu_hours=700.0,
    kwh_per_work_gpu_hour=150 / 700,
    completed_gpu_hours=600.0,
    kwh_per_completed_gpu_hour=0.25,
    downclock_loss=0.0,
    classes={"high": ClassFigures(50, 3 * 3600.0, 6 * 3600.0, 1800.0, 3600.0)},
)


def compare(**on: object) -> Whatif:
    run = RunResult(OFF, (), 1.0, {}, {})
    return Whatif("f", 24.0, 42, ("rules",), run, replace(run, report=replace(OFF, **on)))  # type: ignore[arg-type]


def test_targets_met_when_every_figure_is_reached() -> None:
    w = compare(
        utilization_powered=0.76,
        jct_mean_s=2.7 * 3600.0,
        kwh_per_completed_gpu_hour=0.22,
        downclock_loss=0.02,
    )
    assert [t.met for t in targets(w)] == [True, True, True, True]


def test_each_target_fails_on_its_own_figure() -> None:
    w = compare(
        utilization_powered=0.69,  # +29 points and under 75 %
        jct_mean_s=2.9 * 3600.0,  # -27.5 %
        kwh_per_completed_gpu_hour=0.2251,  # -9.96 %
        downclock_loss=0.031,
    )
    assert [t.met for t in targets(w)] == [False, False, False, False]
    w = compare(utilization_powered=0.80, jct_mean_s=None)
    met = {t.name: t.met for t in targets(w)}
    assert met["utilization over powered GPUs"] and not met["mean job completion time"]


def test_table_and_json_show_off_on_and_change() -> None:
    w = compare(
        utilization_powered=0.58,
        energy_kwh=120.0,
        consolidations=3,
        pools={"v100": PoolFigures(100.0, 0.3, 80.0, 0.375)},
    )
    text = table(w)
    assert "  nodes consolidated                           0           3           -" in text
    assert "  v100 powered GPU-h                           -       100.0           -" in text
    assert "  v100 util (allocated)                        -       37.5%           -" in text
    assert "  utilization over powered GPUs            40.0%       58.0%    +18.0 pt" in text
    assert "  energy (kWh)                             150.0       120.0      -20.0%" in text
    assert "NOT met utilization over powered GPUs >= 75 % and >= 30 points above off" in text
    doc = to_json(w)
    assert doc["on"]["report"]["energy_kwh"] == 120.0
    assert [t["met"] for t in doc["targets"]] == [False, False, False, True]


def test_conclusion_says_what_was_gained_what_it_cost_and_who_paid() -> None:
    w = compare(
        utilization_powered=0.60,
        jct_mean_s=3 * 3600.0,
        culled=4,
        classes={"high": ClassFigures(50, 3.6 * 3600.0, 6 * 3600.0, 1800.0, 3600.0, culled=4)},
    )
    text = table(w).split("conclusion:")[1]
    assert "raised utilization over powered GPUs from 40.0% to 60.0% (+20.0 points" in text
    assert "Jobs took 25.0% less time" in text
    assert "4 notebook sessions culled" in text
    assert "priority class high (mean completion 3.00 h to 3.60 h, +20.0%; 4 sessions culled)" in (
        " ".join(text.split())
    )
    calm = table(compare(utilization_powered=0.5)).split("conclusion:")[1]
    assert "no priority class or project saw its mean completion time rise" in " ".join(
        calm.split()
    )


def test_table_and_json_show_culls_preemptions_and_restarts_per_class() -> None:
    w = compare(
        classes={
            "high": ClassFigures(
                48, 3 * 3600.0, 6 * 3600.0, 1800.0, 3600.0, culled=2, preemptions=5, restarts=7
            )
        }
    )
    text = table(w)
    assert "  high culled                                  0           2           -" in text
    assert "  high preemptions                             0           5           -" in text
    assert "  high restarts                                0           7           -" in text
    doc = to_json(w)
    assert doc["on"]["report"]["classes"]["high"]["preemptions"] == 5
    assert doc["on"]["report"]["classes"]["high"]["restarts"] == 7
    assert doc["off"]["report"]["classes"]["high"]["restarts"] == 0
