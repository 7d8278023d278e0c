"""The what-if over several seeds: each figure's median and range, the change taken seed by
seed, and the seeds `--seeds` names."""

from __future__ import annotations

from dataclasses import replace

import click
import pytest

from gpuops.cli.whatif import seed_list
from gpuops.sim.faults import FaultRates
from gpuops.sim.reliability import FaultPlan, ReliabilityFigures
from gpuops.sim.whatif import Whatif
from gpuops.sim.whatif.report import duration
from gpuops.sim.whatif.spread import Spread, _cell, figures, table, to_json_spread
from tests.unit.sim.test_whatif_report import OFF, compare


def seeded(seed: int, off_util: float, on_util: float, jct_on_h: float) -> Whatif:
    w = compare(utilization_powered=on_util, jct_mean_s=jct_on_h * 3600.0)
    return replace(
        w, seed=seed, off=replace(w.off, report=replace(OFF, utilization_powered=off_util))
    )


RUNS = [
    seeded(1, 0.40, 0.70, 3.0),  # +30 pt, JCT -25 %
    seeded(2, 0.30, 0.40, 4.4),  # +10 pt, JCT +10 %
    seeded(3, 0.50, 0.70, 2.0),  # +20 pt, JCT -50 %
]


def test_spread_is_median_and_range_of_the_known_values() -> None:
    assert Spread.of([3.0, None, 1.0, 2.0]) == Spread(2.0, 1.0, 3.0, 3)
    assert Spread.of([None, None]) is None


def test_changes_are_taken_seed_by_seed() -> None:
    by_name = {f.label: f for f in figures(RUNS)}
    util = by_name["utilization over powered GPUs"]
    assert util.off == Spread(0.40, 0.30, 0.50, 3)
    assert util.on == Spread(0.70, 0.40, 0.70, 3)
    assert util.change is not None
    assert (util.change.median, util.change.low, util.change.high) == pytest.approx(
        (0.20, 0.10, 0.30)
    )
    jct = by_name["JCT mean, culled sessions whole"].change
    assert jct is not None
    assert (jct.median, jct.low, jct.high) == pytest.approx((-0.25, -0.50, 0.10))
    high = by_name["high JCT mean"]
    assert high.off == Spread(3 * 3600.0, 3 * 3600.0, 3 * 3600.0, 3)


def test_table_shows_median_and_range_per_figure() -> None:
    text = table(RUNS)
    assert "3 seeds (1, 2, 3)" in text
    line = next(x for x in text.splitlines() if "utilization over powered GPUs" in x)
    assert "40.0% [30.0%, 50.0%]" in line
    assert "70.0% [40.0%, 70.0%]" in line
    assert "+20.0 pt [+10.0, +30.0]" in line
    jct = next(x for x in text.splitlines() if "JCT mean, culled sessions whole" in x)
    assert "4.00 h" in jct and "3.00 h [2.00, 4.40]" in jct and "-25.0% [-50.0%, +10.0%]" in jct


def test_json_holds_the_spreads_and_every_seed() -> None:
    doc = to_json_spread(RUNS)
    assert doc["seeds"] == [1, 2, 3]
    util = next(f for f in doc["figures"] if f["name"] == "utilization over powered GPUs")
    assert util["change_in"] == "points"
    assert util["off"] == {"median": 0.40, "min": 0.30, "max": 0.50, "seeds": 3}
    assert [r["seed"] for r in doc["runs"]] == [1, 2, 3]


@pytest.mark.parametrize(
    ("text", "first", "given", "seeds"),
    [
        (None, 42, False, [42]),
        ("5", 42, False, [42, 43, 44, 45, 46]),
        ("3", 7, True, [7, 8, 9]),
        ("5, 11,42", 42, False, [5, 11, 42]),
    ],
)
def test_seed_list(text: str | None, first: int, given: bool, seeds: list[int]) -> None:
    assert seed_list(text, first, given) == seeds


@pytest.mark.parametrize(
    ("text", "given", "message"),
    [
        ("five", False, "'five' is neither a count nor a comma-separated list of seeds"),
        ("0", False, "a count of seeds must be within [1, 100], got 0"),
        ("1,2", True, "a list of seeds and --seed together"),
        ("1,1", False, "seed repeated in '1,1'"),
    ],
)
def test_seed_list_refuses(text: str, given: bool, message: str) -> None:
    with pytest.raises(click.BadParameter) as info:
        seed_list(text, 42, given)
    assert message in str(info.value)


def test_conclusion_over_seeds_gives_each_claim_its_seeds() -> None:
    text = " ".join(table(RUNS).split("conclusion:")[1].split())
    assert (
        "Utilization over powered GPUs: +20.0 pt (median; +10.0 pt to +30.0 pt), up on 3 of 3"
        in text
    )
    assert "Mean completion time: -25.0% (median; -50.0% to +10.0%), up on 1 of 3 seeds." in text


def test_a_change_over_fewer_seeds_says_how_many() -> None:
    runs = [*RUNS[:2], seeded(3, 0.0, 0.70, 2.0)]
    runs[2] = replace(runs[2], off=replace(runs[2].off, report=replace(OFF, jct_mean_s=0.0)))
    line = next(x for x in table(runs).splitlines() if "JCT mean, culled sessions whole" in x)
    assert line.endswith("(2 seeds)")


def test_culls_preemptions_and_restarts_per_class_are_spread_over_the_seeds() -> None:
    runs = [
        replace(
            w,
            on=replace(
                w.on,
                report=replace(
                    w.on.report,
                    classes={
                        "high": replace(
                            OFF.classes["high"], culled=n, preemptions=2 * n, restarts=n + 1
                        )
                    },
                ),
            ),
        )
        for w, n in zip(RUNS, (1, 4, 2), strict=True)
    ]
    by_name = {f.label: f for f in figures(runs)}
    assert by_name["high culled"].on == Spread(2, 1, 4, 3)
    assert by_name["high preemptions"].on == Spread(4, 2, 8, 3)
    assert by_name["high restarts"].off == Spread(0, 0, 0, 3)
    assert by_name["high restarts"].on == Spread(3, 2, 5, 3)
    line = next(x for x in table(runs).splitlines() if "high preemptions" in x)
    assert line.split() == ["high", "preemptions", "0", "4", "[2,", "8]", "-"]
    doc = to_json_spread(runs)
    restarts = next(f for f in doc["figures"] if f["name"] == "high restarts")
    assert restarts["on"] == {"median": 3, "min": 2, "max": 5, "seeds": 3}


def _reliability(crash_h: float, to_quarantine: tuple[float, ...]) -> ReliabilityFigures:
    return ReliabilityFigures(
        faults=3,
        floods=1,
        flood_events=16,
        job_crashes=9,
        crash_gpu_hours=crash_h,
        drain_gpu_hours=1.0,
        out_gpu_hours=20.0,
        faulty_gpu_hours=2.0,
        capacity_gpu_hours=1000.0,
        held_gpu_hours=700.0,
        quarantines_true=3,
        quarantines_false=0,
        resets=1,
        reboots=2,
        hand_overs=1,
        person_repairs=1,
        to_quarantine_s=to_quarantine,
        to_healthy_s=(600.0, 90000.0),
        unhealed=1,
    )


def _faulted(seed: int, off_crash_h: float, on_crash_h: float) -> Whatif:
    plain = seeded(seed, 0.4, 0.4, 4.0)
    plan = FaultPlan(FaultRates(300.0))
    off = replace(plain.off, reliability=_reliability(off_crash_h, (14400.0,)))
    on = replace(plain.on, reliability=_reliability(on_crash_h, (7.0, 14.0)))
    return replace(plain, off=off, on=on, faults=plan)


def test_the_reliability_section_gives_each_figure_over_the_seeds_with_its_units() -> None:
    runs = [_faulted(1, 40.0, 4.0), _faulted(2, 60.0, 5.0), _faulted(3, 50.0, 6.0)]
    text = table(runs)
    assert "GPU faults that raise an XID at the llama3 rate x 300" in text
    assert "the ladder's window of remediations 33.6 min (7 days / 300)" in text
    crash = next(line for line in text.splitlines() if "work lost to crashes" in line)
    assert "50.0 [40.0, 60.0]" in crash and "5.0 [4.0, 6.0]" in crash
    assert "-90.0% [-91.7%, -88.0%]" in crash  # seed by seed: 4/40, 5/60, 6/50
    healthy = next(line for line in text.splitlines() if "time to healthy service, p95" in line)
    assert "25.0 h" in healthy
    doc = to_json_spread(runs)
    assert doc["faults"]["scale"] == 300.0
    names = [f["name"] for f in doc["reliability"]]
    assert "useful GPU time, share of fleet" in names and "quarantines, false" in names
    assert table([seeded(1, 0.4, 0.4, 4.0)]).find("reliability") == -1  # none without faults


def test_a_range_in_another_unit_than_its_median_keeps_its_unit() -> None:
    cell = _cell(Spread(300.0, 7.0, 7200.0, 3), duration)
    assert cell == "5.0 min [7 s, 2.0 h]"
