"""``gpuops exporter nvml``: its options. A real process serving a fake scenario:
tests/integration/exporters/test_nvml_cli.py."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from gpuops.cli import cli
from gpuops.cli.exporter import FAKE_SCENARIOS, _pusher
from gpuops.exporters.nvml.push import HealthPusher
from gpuops.exporters.nvml.scenarios import SCENARIOS


def test_fake_scenario_names_match_the_scenarios() -> None:
    assert set(FAKE_SCENARIOS) == set(SCENARIOS)


def test_every_option_has_help() -> None:
    result = CliRunner().invoke(cli, ["exporter", "nvml", "--help"])
    assert result.exit_code == 0
    for option in (
        "--port",
        "--host",
        "--fake-nvml",
        "--agent",
        "--agent-token-file",
        "--xid-poll-ms",
        "--label",
    ):
        assert option in result.output
    assert "[default: 9835" in result.output


def test_agent_needs_a_token_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["exporter", "nvml", "--agent", "--fake-nvml", "mig-a100"])
    assert result.exit_code == 2
    assert "--agent needs --agent-token-file (the bearer token)" in result.output
    empty = tmp_path / "token"
    empty.write_text("", encoding="utf-8")
    result = CliRunner().invoke(
        cli, ["exporter", "nvml", "--agent", "--agent-token-file", str(empty)]
    )
    assert result.exit_code == 2
    assert "is empty" in result.output


def test_a_bad_node_label_is_refused_naming_it() -> None:
    for given, says in (
        ("rack", "--label 'rack': give NAME=VALUE"),
        ("rack-1=r1", "--label 'rack-1=r1': give NAME=VALUE"),
        ("pool=a", "--label 'pool=a': pool is a label the engine sets itself"),
        ("pod=p1", "--label 'pod=p1': pod is a label an executor reads to choose what it acts"),
        ("rack=r/1", "--label 'rack=r/1': the value is not a label value"),
        (f"rack={'r' * 64}", "the value is 64 characters long (at most 63)"),
    ):
        result = CliRunner().invoke(
            cli, ["exporter", "nvml", "--fake-nvml", "mig-a100", "--label", given]
        )
        assert result.exit_code == 2, given
        assert says in result.output
    twice = ["--label", "rack=r1", "--label", "rack=r2"]
    result = CliRunner().invoke(cli, ["exporter", "nvml", "--fake-nvml", "mig-a100", *twice])
    assert result.exit_code == 2
    assert "--label rack is given twice" in result.output
    result = CliRunner().invoke(
        cli, ["exporter", "nvml", "--fake-nvml", "mig-a100", "--pool", "a100 prod"]
    )
    assert result.exit_code == 2
    assert "--pool 'a100 prod': the pool is not a label value" in result.output
    env = {"GPUOPS_NODE_LABELS": "rack=r1 zone"}  # space-separated, as a DaemonSet sets it
    result = CliRunner().invoke(cli, ["exporter", "nvml", "--fake-nvml", "mig-a100"], env=env)
    assert result.exit_code == 2
    assert "--label 'zone': give NAME=VALUE" in result.output


def test_the_pushers_queue_is_kept_under_the_agents_state_directory(tmp_path: Path) -> None:
    token = tmp_path / "push-token"
    token.write_text("push-token\n", encoding="utf-8")
    push = _pusher("https://engine:9843", token, "n1", state_dir=tmp_path / "state")
    assert isinstance(push, HealthPusher) and push.outbox is not None
    assert push.outbox.directory == tmp_path / "state" / "health-events"
    assert (tmp_path / "state" / "health-events").is_dir()
    boot = tmp_path / "boot_id"
    boot.write_text("4f1c-boot\n", encoding="utf-8")
    tagged = _pusher(
        "https://engine:9843", token, "n1", state_dir=tmp_path / "tagged", boot_id_file=boot
    )
    assert isinstance(tagged, HealthPusher)
    tagged.xid("GPU-1", 79)  # queued on disk, tagged with the boot it was seen in
    [queued] = (tmp_path / "tagged" / "health-events").glob("*.json")
    assert json.loads(queued.read_text(encoding="utf-8"))["boot_id"] == "4f1c-boot"
    unread = _pusher(
        "https://engine:9843",
        token,
        "n1",
        state_dir=tmp_path / "unread",
        boot_id_file=tmp_path / "no-such-boot-id",
    )
    assert isinstance(unread, HealthPusher)
    unread.lost("GPU-1")  # sent without a boot, as an older agent's: it still goes
    [queued] = (tmp_path / "unread" / "health-events").glob("*.json")
    assert "boot_id" not in json.loads(queued.read_text(encoding="utf-8"))
