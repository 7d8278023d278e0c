"""Fleet files: the shipped examples load, and each bad input names file:line and key."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuops.cli import cli
from gpuops.sim.fleet.cluster import Cluster
from gpuops.sim.fleet.config import HarmLimits
from gpuops.sim.fleet.fleetfile import FleetFileError, load_fleet, parse_fleet

EXAMPLES = Path(__file__).parents[4] / "examples" / "fleets"

GOOD = """\
name: t
pools:
  - {name: a, model: A100, nodes: 2, gpus_per_node: 4}
projects:
  - {name: p, reserved: {a: 4}}
priority_classes:
  - {name: high, priority: 100}
job_classes:
  - name: train
    project: p
    priority_class: high
    rate_per_hour: 2
    duration: {median: 1h}
"""


@pytest.mark.parametrize("name", ["case-study", "helios-earth", "demo", "hpc", "inference"])
def test_shipped_fleets_load_and_run(name: str) -> None:
    config = load_fleet(EXAMPLES / f"{name}.yaml")
    cluster = Cluster(config)
    for _ in range(40):
        cluster.advance(90.0)
    assert cluster.time == pytest.approx(3600.0)
    assert sum(len(n.gpus) for n in cluster.nodes.values()) > 0


def test_case_study_reserves_the_seeds_gpus() -> None:
    config = load_fleet(EXAMPLES / "case-study.yaml")
    reserved = {p.name: dict(p.reserved) for p in config.reservations}
    assert reserved["ai-rnd"]["a100"] == 20
    assert reserved["data-analysis"]["v100"] == 10
    models = {p.model for p in config.pools}
    assert {"A100", "H100", "V100", "T4", "RTXA6000"} <= models
    assert config.tariff.price(2.0) < config.tariff.price(19.0)


def test_demo_fleet_file_matches_the_demo_workload() -> None:
    config = load_fleet(EXAMPLES / "demo.yaml")
    state = Cluster(config).state()
    held = [sum(1 for g in n["gpus"] if g["job"]) for n in state["nodes"]]  # type: ignore[attr-defined]
    assert held == [4, 4, 4, 3]


def test_good_file_parses_durations_and_defaults() -> None:
    config = parse_fleet(GOOD, "t.yaml")
    assert config.job_classes[0].duration_median_s == 3600.0
    assert config.reservations[0].reserved == (("a", 4),)
    assert config.scheduler.move_interval_s == 3600.0
    moved = parse_fleet(GOOD + "scheduler: {move_interval: 30m}\n", "t.yaml")
    assert moved.scheduler.move_interval_s == 1800.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD.replace("model: A100", "model: A200"), "t.yaml:3: pools.0.model: 'A200' is unknown"),
        (
            GOOD.replace("gpus_per_node: 4}", "gpus_per_node: 4, price_per_gpu_hour: -1}"),
            "t.yaml:3: pools.0.price_per_gpu_hour: Input should be greater than or equal to 0",
        ),
        (
            GOOD.replace("reserved: {a: 4}", "reserved: {b: 4}"),
            "t.yaml:5: projects.0.reserved.b: no pool 'b'",
        ),
        (
            GOOD.replace("reserved: {a: 4}", "reserved: {a: 9}"),
            "t.yaml:5: projects.0.reserved.a: project 'p' reserves 9 GPUs of pool 'a', which has 8",
        ),
        (
            GOOD.replace(
                "  - {name: p, reserved: {a: 4}}",
                "  - {name: p, reserved: {a: 4}}\n  - {name: q, reserved: {a: 5}}",
            ),
            "t.yaml:6: projects.1.reserved.a: projects 'p' (4), 'q' (5) reserve 9 GPUs of pool "
            "'a', which has 8",
        ),
        (
            GOOD.replace(
                "gpus_per_node: 4}",
                "gpus_per_node: 4}\n"
                "  - {name: c, model: H100, nodes: 0, cloud: true, max_nodes: 1}",
            ).replace("reserved: {a: 4}", "reserved: {a: 4, c: 8}"),
            "t.yaml:6: projects.0.reserved.c: project 'p' reserves 8 GPUs of pool 'c', which "
            "max_nodes caps at 4 (1 nodes of 4)",
        ),
        (
            GOOD.replace("priority: 100}", "priority: 100, models: [H100], fallback: false}"),
            "t.yaml:11: job_classes.0.priority_class: job class 'train': priority class 'high' "
            "takes only H100 (fallback: false) and no pool has them (pools have A100)",
        ),
        (
            GOOD.replace(
                "gpus_per_node: 4}",
                "gpus_per_node: 4}\n  - {name: b, model: T4, nodes: 1, gpus_per_node: 8}",
            ).replace(
                "rate_per_hour: 2", "rate_per_hour: 2\n    gpus: {1: 1, 8: 1}\n    memory_gib: 40"
            ),
            "t.yaml:10: job_classes.0: job class 'train': no pool has nodes of 8 GPUs with 40 GiB "
            "each (priority class 'high')",
        ),
        (
            GOOD.replace("rate_per_hour: 2", "rate_per_hour: 2\n    slowdown_objective: 0.5"),
            "t.yaml:13: job_classes.0.slowdown_objective: Input should be greater than or equal "
            "to 1",
        ),
        (
            GOOD.replace("rate_per_hour: 2", "rate_per_hour: 2\n    memory_gib: 100"),
            "t.yaml:13: job_classes.0.memory_gib: job class 'train': 100 GiB fits no pool's GPUs",
        ),
        (
            GOOD.replace("priority_class: high", "priority_class: urgent"),
            "t.yaml:11: job_classes.0.priority_class: 'urgent' is not one of high",
        ),
        (
            GOOD.replace("rate_per_hour: 2", "rate_per_hour: 2\n    colour: red"),
            "t.yaml:13: job_classes.0.colour: unknown key",
        ),
        (
            GOOD.replace("{median: 1h}", "{median: soon}"),
            "t.yaml:13: job_classes.0.duration.median: 'soon' is not a duration",
        ),
        (
            GOOD.replace("rate_per_hour: 2", "rate_per_hour: 2\n    rate_per_hour: 3"),
            't.yaml:13: duplicate key "rate_per_hour" (check lines 12 and 13)',
        ),
        (GOOD.replace("    project: p", "\tproject: p"), "t.yaml:10: tab character in indentation"),
        (
            GOOD.replace("rate_per_hour: 2", "rate_per_hour: 2\n    gpus: {16: 1}"),
            "t.yaml:13: job_classes.0.gpus: job class 'train': [16] GPUs exceed every node "
            "(4 GPUs)",
        ),
        (
            GOOD.replace("gpus_per_node: 4}", "gpus_per_node: 4, max_nodes: 1}"),
            "t.yaml:3: pools.0.max_nodes: max_nodes 1 is below the 2 nodes the pool starts with",
        ),
        (
            GOOD.replace("model: A100", "model: V100").replace(
                "gpus_per_node: 4}", "gpus_per_node: 4, sharing: {mode: mig, slices: 7}}"
            ),
            "t.yaml:3: pools.0.sharing.mode: mig needs one of A100, H100; V100 has no MIG",
        ),
        (
            GOOD.replace("gpus_per_node: 4}", "gpus_per_node: 4, sharing: {mode: mig, slices: 9}}"),
            "t.yaml:3: pools.0.sharing.slices: slices must be within [2, 7] for mig, got 9",
        ),
        (
            GOOD.replace("gpus_per_node: 4}", "gpus_per_node: 4, sharing: {mode: mps, slices: 2}}"),
            "t.yaml:3: pools.0.sharing.mode: 'mps' is not a sharing mode; use one of mig, "
            "time-slicing",
        ),
        (
            GOOD.replace("gpus_per_node: 4}", "gpus_per_node: 4, boot: later}"),
            "t.yaml:3: pools.0.boot: 'later' is not a duration",
        ),
        (
            GOOD.replace(
                "gpus_per_node: 4}",
                "gpus_per_node: 4,\n     host: {idle_watts: 800, peak_watts: 600}}",
            ),
            "t.yaml:4: pools.0.host.peak_watts: 600 is below idle_watts 800",
        ),
        (
            GOOD.replace("gpus_per_node: 4}", "gpus_per_node: 4, host: {idle_watts: -5}}"),
            "t.yaml:3: pools.0.host.idle_watts: Input should be greater than or equal to 0",
        ),
        (
            GOOD.replace("gpus_per_node: 4}", "gpus_per_node: 4, host: {idle_w: 500}}"),
            "t.yaml:3: pools.0.host.idle_w: unknown key",
        ),
        (
            GOOD + "scheduler: {restart: 5m, move_interval: -1h}\n",
            "t.yaml:14: scheduler.move_interval: '-1h' is not a duration",
        ),
        (
            GOOD + "harm_limits: {jct_increase: 0.2, over_objective: 1.5}\n",
            "t.yaml:14: harm_limits.over_objective: Input should be less than or equal to 1",
        ),
        (
            GOOD + "harm_limits:\n  non_preemptible_stops: -1\n",
            "t.yaml:15: harm_limits.non_preemptible_stops: Input should be greater than or "
            "equal to 0",
        ),
        (
            GOOD + "harm_limits: {jct: 0.2}\n",
            "t.yaml:14: harm_limits.jct: unknown key",
        ),
        ("pools: [", "t.yaml:1: YAML syntax error"),
        (
            GOOD + "initial_jobs:\n  - {gpus: 4, node: node-1}\n  - {gpus: 1, node: node-1}\n",
            "t.yaml:16: initial_jobs.1.gpus: node-1 has 4 GPUs; initial jobs ask for 5 there",
        ),
        (
            GOOD + "initial_jobs:\n  - {gpus: 1, node: node-7}\n",
            "t.yaml:15: initial_jobs.0.node: no node 'node-7' (node-0 .. node-1)",
        ),
    ],
)
def test_bad_fleet_files_name_line_and_key(text: str, message: str) -> None:
    with pytest.raises(FleetFileError) as info:
        parse_fleet(text, "t.yaml")
    assert message in str(info.value)


def test_cli_reports_a_bad_fleet_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("nodes: 2", "nodes: -1"))
    result = CliRunner().invoke(cli, ["fleet", "sim", "--fleet", str(bad)])
    assert result.exit_code != 0
    assert f"{bad}:3: pools.0.nodes: Input should be greater than or equal to 0" in result.output


@pytest.mark.parametrize("command", [["fleet", "run"], ["whatif", "--rules", "rules"]])
def test_commands_refuse_a_class_no_pool_takes_at_load(command: list[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("priority: 100}", "priority: 100, models: [T4], fallback: false}"))
    result = CliRunner().invoke(cli, [*command, "--fleet", str(bad), "--hours", "1"])
    assert result.exit_code == 1
    assert (
        f"{bad}:11: job_classes.0.priority_class: job class 'train': priority class 'high' "
        "takes only T4 (fallback: false)"
    ) in result.output


def test_harm_limits_are_read_with_their_defaults() -> None:
    assert parse_fleet(GOOD, "t.yaml").harm_limits == HarmLimits(0.10, 0.05, 0)
    given = parse_fleet(GOOD + "harm_limits: {jct_increase: 0.25, non_preemptible_stops: 2}\n")
    assert given.harm_limits == HarmLimits(0.25, 0.05, 2)
