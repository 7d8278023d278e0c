"""``gpuops rules check|export`` through click, without promtool (``--no-promql``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpuops.cli import cli
from gpuops.offline import promtool

ROOT = Path(__file__).resolve().parents[3]
INVALID = ROOT / "tests" / "fixtures" / "rules" / "invalid"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["rules", *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_check_valid_rules_exits_0() -> None:
    code, out, _ = run("check", "--no-promql", str(ROOT / "rules"))
    assert code == 0
    assert out == "OK: 4 policies in 2 groups from 2 files (schema, executors checked)\n"


def test_check_invalid_rules_prints_file_line_message_and_exits_1() -> None:
    path = INVALID / "many-mistakes.yaml"
    code, out, err = run("check", "--no-promql", str(path))
    assert code == 1
    expected = (
        (INVALID / "many-mistakes.expected").read_text().replace("many-mistakes.yaml", str(path))
    )
    assert out == expected
    assert err == "6 errors in 1 file\n"


def test_check_reports_errors_of_all_files(tmp_path: Path) -> None:
    code, out, err = run(
        "check", "--no-promql", str(INVALID / "unknown-key.yaml"), str(INVALID / "bad.yaml")
    )
    assert code == 1
    assert out.splitlines()[0].startswith(f"{INVALID / 'unknown-key.yaml'}:6: ")
    assert (
        out.splitlines()[1] == f"{INVALID / 'bad.yaml'}:0: cannot read: no such file or directory"
    )
    assert err == "2 errors in 2 files\n"


def test_check_says_clearly_when_promtool_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> str:
        raise promtool.PromtoolError("promtool not found on PATH, so PromQL was not checked")

    monkeypatch.setattr(promtool, "find_promtool", missing)
    code, _, err = run("check", str(ROOT / "rules"))
    assert code == 1
    assert err == "Error: promtool not found on PATH, so PromQL was not checked\n"


def test_export_writes_one_alerting_rule_per_policy(tmp_path: Path) -> None:
    out_file = tmp_path / "exported.yaml"
    code, _, err = run("export", str(ROOT / "rules"), "-o", str(out_file))
    assert code == 0
    assert err == f"wrote {out_file}\n"
    exported = yaml.safe_load(out_file.read_text())
    rules = {r["alert"]: r for g in exported["groups"] for r in g["rules"]}
    assert sorted(rules) == [
        "downclock-underused-gpus",
        "migrate-off-down-nodes",
        "reclaim-idle-gpus",
        "scale-out-on-queue",
    ]
    reclaim = rules["reclaim-idle-gpus"]
    assert reclaim["for"] == "10m"
    assert reclaim["labels"] == {
        "team": "platform",
        "severity": "info",
        "gpuops_policy": "reclaim-idle-gpus",
    }
    assert reclaim["annotations"]["summary"] == (
        "GPU {{ $labels.uuid }} on {{ $labels.node }} idle while allocated"
    )
    assert [g["interval"] for g in exported["groups"]] == ["15s", "30s"]


def test_export_to_stdout_skips_alertmanager_only_policies() -> None:
    code, out, _ = run(
        "export", str(ROOT / "tests" / "fixtures" / "rules" / "valid" / "minimal.yaml")
    )
    assert code == 0
    assert "# Not exported (triggered by Alertmanager only): drain-on-gpu-fell-off-bus\n" in out
    exported = yaml.safe_load(out)
    assert [r["alert"] for r in exported["groups"][0]["rules"]] == ["log-down-nodes"]


def test_export_of_invalid_rules_exits_1() -> None:
    code, out, _ = run("export", str(INVALID / "unknown-key.yaml"))
    assert code == 1
    assert "unknown key" in out


def test_rules_test_of_a_missing_file_names_it_and_starts_nothing(tmp_path: Path) -> None:
    # an unmatched glob (`rules/tests/*.yaml` in the wrong directory) reaches it literally
    missing = tmp_path / "tests" / "*.yaml"
    code, _, err = run("test", str(missing))
    assert code == 2
    assert f"'{missing}' does not exist" in err and "FileNotFoundError" not in err


def test_check_with_config_names_a_missing_or_unreadable_kubeconfig(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("groups: []\n")
    config = tmp_path / "engine.yaml"
    kubeconfig = tmp_path / "kubeconfig"
    config.write_text(
        f"rules: [{rules}]\n"
        "executors:\n"
        "  scheduler: {use: kubernetes}\n"
        f"  kubernetes: {{kubeconfig: {kubeconfig}, node_selector: gpu=true}}\n"
    )
    code, _, err = run("check", "--no-promql", "--config", str(config))
    assert code == 1
    assert err == f"Error: {config}: executors.kubernetes: kubeconfig {kubeconfig} does not exist\n"
    kubeconfig.write_text("clusters: [\n")
    code, _, err = run("check", "--no-promql", "--config", str(config))
    assert code == 1
    assert f"executors.kubernetes: kubeconfig {kubeconfig} cannot be read: " in err


def test_check_with_config_refuses_an_executor_its_settings_cannot_build(tmp_path: Path) -> None:
    # the kubernetes executor without the node selector that names the nodes it may touch, and
    # a fleet executor with a timeout that is no number: found before the engine starts
    rules = tmp_path / "rules.yaml"
    rules.write_text("groups: []\n")
    config = tmp_path / "engine.yaml"
    config.write_text(
        f"rules: [{rules}]\n"
        "executors:\n"
        "  scheduler: {use: kubernetes}\n"
        "  kubernetes: {in_cluster: true}\n"
        "  fleet: {url: http://127.0.0.1:9400, timeout_s: soon}\n"
    )
    code, _, err = run("check", "--no-promql", "--config", str(config))
    assert code == 1
    lines = err.removeprefix("Error: ").splitlines()
    assert len(lines) == 2, err
    assert lines[0].startswith(f"{config}: executors.kubernetes settings: node_selector")
    assert lines[1].startswith(f"{config}: executors.fleet settings: timeout_s")
    config.write_text(
        f"rules: [{rules}]\n"
        "executors:\n"
        "  scheduler: {use: kubernetes}\n"
        "  kubernetes: {in_cluster: true, node_selector: nvidia.com/gpu.present=true}\n"
    )
    code, out, err = run("check", "--no-promql", "--config", str(config))
    assert code == 0, err
    assert out.startswith("OK: 0 policies")
    # a file only the engine's host has (the node agent's token in its pod) is said, not refused
    token = tmp_path / "absent" / "token"
    config.write_text(
        f"rules: [{rules}]\n"
        "executors:\n"
        "  gpu-control: {use: nvml-agent}\n"
        f"  nvml-agent: {{token_file: {token}}}\n"
    )
    code, out, err = run("check", "--no-promql", "--config", str(config))
    assert code == 0, err
    assert "note: executors.nvml-agent settings: token_file: " in err and str(token) in err
    assert "not readable here" in err
