"""Harm limits: each policy whose cost on a what-if passes a limit is flagged by name, in the
table, the conclusion and the JSON, and `gpuops whatif --fail-on-harm` exits 3."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuops.cli import cli
from gpuops.cli import whatif as whatif_cli
from gpuops.sim.fleet.config import FleetConfig, HarmLimits
from gpuops.sim.fleet.report import ClassFigures
from gpuops.sim.whatif import RunResult, Whatif
from gpuops.sim.whatif.attribution import Attribution
from gpuops.sim.whatif.conclusion import conclusion, conclusion_over_seeds
from gpuops.sim.whatif.harm import NO_POLICY, Flag, flags
from gpuops.sim.whatif.report import table, to_json
from tests.unit.sim.test_whatif_report import OFF as REPORT

REPO = Path(__file__).parents[3]
H = 3600.0


def figures(jct_h: float, over: float | None = None) -> ClassFigures:
    return ClassFigures(10, jct_h * H, 2 * jct_h * H, 0.1 * H, 0.2 * H, over_objective=over)


OFF = replace(REPORT, classes={"batch": figures(2.0), "serving": figures(1.0, over=0.01)})


def compare(
    classes: dict[str, ClassFigures],
    attribution: Attribution,
    limits: HarmLimits | None = None,
    seed: int = 42,
) -> Whatif:
    off = RunResult(OFF, (), 1.0, {}, {})
    on = replace(off, report=replace(OFF, classes=classes), attribution=attribution)
    return Whatif("f", 24.0, seed, ("rules",), off, on, limits or HarmLimits(), ("serving",))


HARMFUL = Attribution(
    stops=(
        ("", "serving", "preempted", 4),  # the fleet's own scheduler: not a policy's
        ("lend-idle-reserved-gpus", "batch", "preempted", 9),  # batch may be preempted
        ("reclaim-idle-gpus", "serving", "culled", 2),
        ("reclaim-idle-gpus", "serving", "restarted", 1),
    ),
    acted={
        "batch": ("hold-batch-until-off-peak",),
        "serving": ("pack-underused-gpus", "power-down-idle-nodes", "reclaim-idle-gpus"),
    },
    slowed={"serving": ("pack-underused-gpus",)},
)


def test_each_limit_flags_the_policies_behind_it() -> None:
    w = compare({"batch": figures(2.3), "serving": figures(1.0, over=0.2)}, HARMFUL)
    found = {(f.policy, f.priority_class, f.limit) for f in flags(w)}
    assert found == {
        # batch's mean completion +15 % > 10 %: the policy that acted on batch's jobs
        ("hold-batch-until-off-peak", "batch", "jct_increase"),
        # serving over its objective 20 % > 5 %: the policy that slowed it, not the others
        ("pack-underused-gpus", "serving", "over_objective"),
        # serving is preemptible: false: the policy that stopped 3 of its jobs
        ("reclaim-idle-gpus", "serving", "non_preemptible_stops"),
    }
    stops = next(f for f in flags(w) if f.limit == "non_preemptible_stops")
    assert stops.text == (
        "stopped 3 jobs of priority class serving, which the fleet file marks preemptible: "
        "false (culled 2, restarted 1; limit 0)"
    )


def test_a_class_that_completes_fewer_jobs_is_flagged_though_its_mean_is_not() -> None:
    """Jobs held and never started are in no mean completion time: the count shows them."""
    fewer = replace(figures(2.0), completed=6)  # 10 without the policies, as fast
    w = compare({"batch": fewer, "serving": figures(1.0)}, HARMFUL)
    assert [(f.policy, f.priority_class, f.limit, f.text) for f in flags(w)] == [
        (
            "hold-batch-until-off-peak",
            "batch",
            "completed_decrease",
            "priority class batch completed 6 jobs against 10 without the policies (-40.0%; "
            "limit -10%)",
        ),
        ("reclaim-idle-gpus", "serving", "non_preemptible_stops", flags(w)[1].text),
    ]
    # one job fewer is within any seed's noise, whatever share it is
    one = compare({"batch": replace(figures(2.0), completed=9), "serving": figures(1.0)}, HARMFUL)
    assert "completed_decrease" not in {f.limit for f in flags(one)}


def test_within_the_limits_nothing_is_flagged() -> None:
    # +9.5 %, over the objective no longer than allowed, stops within their limit
    w = compare(
        {"batch": figures(2.19), "serving": figures(1.0, over=0.05)},
        HARMFUL,
        HarmLimits(jct_increase=0.10, over_objective=0.05, non_preemptible_stops=3),
    )
    assert flags(w) == []
    assert "Harm limits: no policy passed one" in "\n".join(conclusion(w))


def test_a_class_worse_off_with_no_policy_on_its_jobs_is_flagged_as_such() -> None:
    w = compare({"batch": figures(2.0), "serving": figures(1.5)}, Attribution())
    assert flags(w) == [
        Flag(
            NO_POLICY,
            "serving",
            "jct_increase",
            "the mean completion time of priority class serving +50.0% (limit +10%)",
        )
    ]
    assert "FLAG no policy acted on its jobs: the mean completion time" in table(w)


def test_the_report_names_each_flagged_policy_in_words() -> None:
    w = compare({"batch": figures(2.0), "serving": figures(1.0, over=0.2)}, HARMFUL)
    text = table(w)
    assert (
        "  FLAG pack-underused-gpus: the sessions of priority class serving answered slower "
        "than their objective 20.0% of their time (limit 5%; 1.0% without the policies)"
    ) in text
    words = " ".join(line.strip() for line in conclusion(w))
    assert "Harm limits passed: pack-underused-gpus: the sessions of priority class" in words
    assert "reclaim-idle-gpus: stopped 3 jobs of priority class serving" in words
    doc = to_json(w)
    assert doc["harm_limits"] == {
        "jct_increase": 0.1,
        "over_objective": 0.05,
        "non_preemptible_stops": 0,
        "completed_decrease": 0.1,
    }
    assert {f["policy"] for f in doc["harm"]} == {"pack-underused-gpus", "reclaim-idle-gpus"}


def test_over_seeds_each_flag_says_on_which_seeds() -> None:
    harmful = compare({"batch": figures(2.0), "serving": figures(1.0)}, HARMFUL, seed=42)
    calm = compare({"batch": figures(2.0), "serving": figures(1.0)}, Attribution(), seed=43)
    words = " ".join(line.strip() for line in conclusion_over_seeds([harmful, calm]))
    assert (
        "Harm limits passed: reclaim-idle-gpus: priority class serving, jobs stopped though "
        "not preemptible, on 1 of 2 seeds (42)."
    ) in words


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> list[FleetConfig]:
    """`gpuops whatif` with its runs replaced by one harmful what-if (the runs are
    tests/integration's); the configs it was asked to run."""
    seen: list[FleetConfig] = []

    def fake(config: FleetConfig, *args: object, **kw: object) -> Whatif:
        seen.append(config)
        w = compare({"batch": figures(2.0), "serving": figures(1.0)}, HARMFUL)
        return replace(w, limits=config.harm_limits)

    monkeypatch.setattr(whatif_cli, "run_whatif", fake)
    return seen


def _whatif(*args: str) -> tuple[int, str]:
    fleet = str(REPO / "examples" / "fleets" / "demo.yaml")
    result = CliRunner().invoke(
        cli, ["whatif", "--fleet", fleet, "--rules", str(REPO / "rules" / "fleet"), *args]
    )
    return result.exit_code, result.output


def test_fail_on_harm_exits_3_after_the_report(ran: list[FleetConfig]) -> None:
    code, out = _whatif("--fail-on-harm")
    assert code == whatif_cli.HARM_EXIT == 3
    assert "FLAG reclaim-idle-gpus: stopped 3 jobs of priority class serving" in out
    assert _whatif()[0] == 0  # flagged, but not asked to fail


def test_harm_limit_overrides_the_fleet_files(ran: list[FleetConfig]) -> None:
    code, out = _whatif("--fail-on-harm", "--harm-limit", "non_preemptible_stops=3")
    assert code == 0, out
    assert ran[-1].harm_limits == HarmLimits(0.10, 0.05, 3)
    _whatif("--harm-limit", "completed_decrease=0.25")
    assert ran[-1].harm_limits.completed_decrease == 0.25


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("over_objective=1.5", "'over_objective=1.5': over_objective must be within [0, 1]"),
        (
            "completed_decrease=2",
            "'completed_decrease=2': completed_decrease must be within [0, 1]",
        ),
        ("stops=1", "'stops=1': expected KEY=VALUE with KEY one of jct_increase"),
        (
            "non_preemptible_stops=0.5",
            "'non_preemptible_stops=0.5': non_preemptible_stops must be a whole number",
        ),
    ],
)
def test_a_bad_harm_limit_names_the_flag(ran: list[FleetConfig], value: str, message: str) -> None:
    code, out = _whatif("--harm-limit", value)
    assert code == 2
    assert "Invalid value for --harm-limit: " + message in " ".join(out.split())
    assert not ran
