"""The engine config file: relative paths resolved, every mistake reported as file:line: key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuops.settings import ConfigError, load_config

REPO = Path(__file__).resolve().parents[3]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "engine.yaml"
    path.write_text(text)
    return path


def test_shipped_example_loads_and_resolves_paths_against_the_file() -> None:
    config = load_config(REPO / "config" / "engine.yaml")
    assert [p.resolve() for p in config.rules] == [REPO / "rules"]
    assert config.state_file.resolve() == REPO / "var" / "gpuops-state.sqlite"
    assert config.prometheus.timeout == 10.0
    assert config.api.listen == "127.0.0.1:9843"  # loopback: where `gpuops decisions` looks
    assert config.api.tokens_file is not None
    assert config.api.tokens_file.resolve() == REPO / "var" / "api-tokens.yaml"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "prometheus:\n  url: http://x\n  timout: 5s\n",
            "engine.yaml:3: prometheus.timout: unknown key (allowed: max_pending_gap, "
            "max_sample_age, scrape_interval, timeout, url)",
        ),
        (
            "guardrails:\n  approval_ttl: forever\n",
            "engine.yaml:2: guardrails.approval_ttl: invalid duration 'forever'",
        ),
        (
            "prometheus:\n  url: a\n  url: b\n",
            'engine.yaml:3: duplicate key "url" (check lines 2 and 3)',
        ),
        ("- just\n- a list\n", "engine.yaml:1: the configuration must be a mapping of settings"),
        (
            "guardrails:\n  global_max_per_hour: -1\n",
            "engine.yaml:2: guardrails.global_max_per_hour: Input should be greater than or "
            "equal to 0",
        ),
        (
            "state:\n  url: postgresql://gpuops:hunter2@db/gpuops\n",
            "engine.yaml:2: state.url: holds a password: put it in state.password_file or the"
            " environment variable named by state.password_env, not in the URL",
        ),
        (
            "state:\n  url: mysql://db/gpuops\n",
            "engine.yaml:2: state.url: must be a postgresql://USER@HOST:PORT/DATABASE URL",
        ),
        (
            "state:\n  lease: 3s\n  renew_interval: 2s\n",
            "engine.yaml:1: state: renew_interval (2s) must be at most a third of the lease (3s):"
            " a leader renews a few times before it may lapse",
        ),
        (
            "audit:\n  spool_dir: a\n  max_spool_bytes: 1000\n",
            "engine.yaml:3: audit.max_spool_bytes: Input should be greater than or equal to"
            " 1048576",
        ),
        (
            "audit:\n  full_policy: drop_newest\n",
            "engine.yaml:2: audit.full_policy: Input should be 'fail_closed' or 'drop_oldest'",
        ),
    ],
    ids=[
        "unknown-key",
        "bad-duration",
        "duplicate-key",
        "not-a-mapping",
        "negative-budget",
        "password-in-state-url",
        "not-postgres",
        "renewal-too-slow",
        "spool-too-small",
        "unknown-full-policy",
    ],
)
def test_mistakes_name_file_line_and_key(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    assert str(caught.value) == f"{tmp_path}/{expected}"


def test_the_spool_limit_and_full_policy_reach_the_audit_settings(tmp_path: Path) -> None:
    text = "audit:\n  spool_dir: a\n  max_spool_bytes: 2097152\n  full_policy: drop_oldest\n"
    settings = load_config(write(tmp_path, text)).audit.settings()
    assert (settings.max_spool_bytes, settings.full_policy) == (2097152, "drop_oldest")
    assert settings.spool_dir == tmp_path / "a"
    default = load_config(write(tmp_path, "{}\n")).audit.settings()
    assert (default.max_spool_bytes, default.full_policy) == (280 * 1024 * 1024, "fail_closed")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "health:\n  ladder:\n    steps: [reboot, reboot]\n",
            "engine.yaml:3: health.ladder.steps: a step is named twice: reboot",
        ),
        (
            "health:\n  ladder:\n    steps: [reset_gpu, replace]\n",
            "engine.yaml:3: health.ladder.steps.1: Input should be 'reset_gpu' or 'reboot'",
        ),
        (
            "health:\n  ladder:\n    validation: {command: [], timeout: 5m}\n",
            "engine.yaml:3: health.ladder.validation.command: List should have at least 1 item"
            " after validation, not 0",
        ),
        (
            "health:\n  ladder:\n    pacing:\n      cooldown: 20m\n",
            "engine.yaml:3: health.ladder.pacing: cooldown (1200s) is above max_cooldown (600s)",
        ),
        (
            "health:\n  ladder:\n    pacing:\n      domains: [pool, rack-id, pool]\n",
            "engine.yaml:4: health.ladder.pacing.domains: not a label name: 'rack-id'",
        ),
        (
            "health:\n  ladder:\n    pacing:\n      domains: [rack, rack]\n",
            "engine.yaml:4: health.ladder.pacing.domains: a domain is named twice: rack",
        ),
        (
            "health:\n  ladder:\n    pacing:\n      domains: [pool, pod, node]\n",
            "engine.yaml:4: health.ladder.pacing.domains: pod, node: a failure domain is a label"
            " the node agent sends, never one the GpuFault alert sets itself or an executor"
            " reads to choose what it acts on (alertname, class, container, gpu, instance, job,"
            " namespace, node, pod, priority_class, profile, quota_request, reason, remedy,"
            " uuid, xid)",
        ),
        (
            "executors:\n  nvml-agent: {url: 'http://{rack}:9835'}\n"
            "health:\n  ladder:\n    pacing:\n      domains: [pool, rack]\n",
            "engine.yaml:3: health: ladder.pacing.domains: rack is read by"
            " executors.nvml-agent.url: a failure"
            " domain is a label the node agent sends, never one an executor reads",
        ),
        (
            "health:\n  ladder:\n    reboot:\n      executor: command\n"
            "      params: {argv: [reboot-rack, '{{ $labels.zone }}']}\n"
            "    pacing:\n      domains: [pool, zone]\n",
            "engine.yaml:1: health: ladder.pacing.domains: zone is read by"
            " health.ladder.reboot.params.argv[1]: a failure domain is a label the node agent"
            " sends, never one an executor reads",
        ),
        (
            "health:\n  ladder:\n    pacing:\n      max_fraction: 0.1\n",
            "engine.yaml:3: health.ladder.pacing: max_fraction needs unavailable (the PromQL that"
            " tells which nodes are out of service)",
        ),
        (
            "health:\n  ladder:\n    pacing:\n      max_fraction: 0.1\n"
            "      unavailable: 'max by (node'\n",
            "engine.yaml:5: health.ladder.pacing.unavailable: not PromQL: unclosed left"
            " parenthesis",
        ),
        (
            "health:\n  profiles: {a100: repair}\n",
            "engine.yaml:2: health.profiles.a100: Input should be 'observe', 'quarantine' or"
            " 'full'",
        ),
        (
            "health:\n  ladder:\n    reboot: {executor: kubernetes}\n",
            "engine.yaml:3: health.ladder.reboot: executor kubernetes does not do reboot (the"
            " built-in executors that do: fleet, nvml-agent, slurm; or command, an executor of"
            " your own)",
        ),
    ],
    ids=[
        "step-twice",
        "unknown-step",
        "no-check",
        "cooldown-above-max",
        "domain-not-a-label",
        "domain-twice",
        "domain-an-executor-reads",
        "domain-a-url-template-reads",
        "domain-a-ladder-step-reads",
        "bound-without-query",
        "bad-promql",
        "unknown-profile",
        "reboot-by-an-executor-that-cannot",
    ],
)
def test_ladder_mistakes_name_the_field(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    assert str(caught.value) == f"{tmp_path}/{expected}"


def test_a_kubernetes_ladder_reboots_and_checks_through_the_node_agent(tmp_path: Path) -> None:
    text = (
        "health:\n  ladder:\n    reboot: {executor: nvml-agent}\n"
        "    validation: {executor: nvml-agent}\n"
    )
    ladder = load_config(write(tmp_path, text)).health.ladder
    assert (ladder.reboot.executor, ladder.validation.executor) == ("nvml-agent", "nvml-agent")
