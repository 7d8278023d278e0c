"""docker-compose.yml, the Dockerfile and deploy/: the compose file against the compose
specification, every host path they name exists, the engine config loads, the one-shot
services run scripts that are in the image. The scripts run, and amtool's check:
tests/integration/deploy/test_compose.py.

Docker cannot run here: the stack is checked by schema and by its pieces, not by starting it.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gpuops.settings import load_config

REPO = Path(__file__).resolve().parents[3]
COMPOSE_FILE = REPO / "docker-compose.yml"
COMPOSE_SPEC = REPO / "tests" / "reference" / "compose-spec.json"  # source: its README
DOCKERFILE = REPO / "Dockerfile"
ENGINE_CONFIG = REPO / "deploy" / "engine" / "engine.yaml"


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return doc


def services() -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = compose()["services"]
    return result


def with_defaults(text: str) -> str:
    """``text`` with each ``${VAR-default}`` as compose reads it when VAR is unset."""
    return re.sub(r"\$\{\w+-([^}]*)\}", r"\1", text)


def schema_errors(doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(json.loads(COMPOSE_SPEC.read_text()))
    return [
        f"{'/'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in validator.iter_errors(doc)
    ]


def test_compose_file_validates_against_the_compose_specification() -> None:
    assert schema_errors(compose()) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("services", "engine", "restart_policy"), "always"),  # not a service key
        (("services", "engine", "depends_on", "fleet", "condition"), "service_ready"),
        (("services", "grafana", "ports"), "3000"),  # a list, not a string
    ],
)
def test_a_broken_compose_file_fails_the_schema(path: tuple[str, ...], value: Any) -> None:
    doc = copy.deepcopy(compose())
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert schema_errors(doc), f"setting {'.'.join(path)} = {value!r} went unnoticed"


def test_the_stack_has_every_service_of_the_design() -> None:
    assert {
        "prometheus",
        "alertmanager",
        "grafana",
        "elasticsearch",
        "kibana",
        "fleet",
        "engine",
        "setup",
        "nvml-exporter",
    } <= services().keys()


def test_every_bind_mounted_host_path_exists() -> None:
    checked = 0
    for name, service in services().items():
        for volume in service.get("volumes", []):
            source = volume["source"] if isinstance(volume, dict) else volume.split(":")[0]
            source = with_defaults(source)
            if source.startswith((".", "/")):
                assert (REPO / source).resolve().exists(), f"{name}: {source} is not in the repo"
                checked += 1
    assert checked >= 6


def test_named_volumes_are_declared() -> None:
    declared = set(compose()["volumes"])
    for name, service in services().items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in declared, f"{name}: volume {source} is not declared"


def test_depends_on_waits_for_health_where_there_is_a_healthcheck() -> None:
    all_services = services()
    for name, service in all_services.items():
        for dep, cond in service.get("depends_on", {}).items():
            assert dep in all_services, f"{name} depends on unknown {dep}"
            if "healthcheck" in all_services[dep]:
                assert cond["condition"] == "service_healthy", f"{name} -> {dep}"
            else:
                assert cond["condition"] == "service_completed_successfully", f"{name} -> {dep}"


def test_elastic_stack_pins_one_8x_version_matching_the_client_major() -> None:
    es = services()["elasticsearch"]["image"]
    kibana = services()["kibana"]["image"]
    es_version = es.rsplit(":", 1)[1]
    assert kibana.rsplit(":", 1)[1] == es_version
    assert re.fullmatch(r"8\.\d+\.\d+", es_version), es_version
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'"elasticsearch>=8[^"]*<9"', pyproject), "client is not pinned to 8.x"
    env = services()["elasticsearch"]["environment"]
    assert env["discovery.type"] == "single-node"
    assert env["xpack.security.enabled"] == "false"
    assert "mem_limit" in services()["elasticsearch"]


def test_services_run_the_real_cli() -> None:
    """Every gpuops command of the compose file names a real subcommand and only its options."""
    import click

    from gpuops.cli import cli

    for name in ("fleet", "engine", "nvml-exporter"):
        argv = [a.split("=")[0] for a in services()[name]["command"]]
        command: click.Command = cli
        for word in (a for a in argv if not a.startswith("-")):
            if isinstance(command, click.Group):
                found = command.get_command(click.Context(command), word)
                command = found if found is not None else command
        assert not isinstance(command, click.Group), f"{name}: {argv} names no command"
        options = {opt for param in command.params for opt in param.opts}
        for option in (a for a in argv if a.startswith("-")):
            assert option in options, f"{name}: {option} is not an option of {command.name}"


def test_nvml_exporter_is_a_gpu_profile_with_a_device_reservation() -> None:
    exporter = services()["nvml-exporter"]
    assert exporter["profiles"] == ["gpu"]
    devices = exporter["deploy"]["resources"]["reservations"]["devices"]
    assert devices and devices[0]["capabilities"] == ["gpu"]
    others = {n: s.get("profiles") for n, s in services().items() if n != "nvml-exporter"}
    assert {n: p for n, p in others.items() if p} == {
        "postgres": ["ha"],
        "engine-standby": ["ha"],
    }


def test_engine_config_of_the_stack_loads() -> None:
    config = load_config(ENGINE_CONFIG)
    assert config.prometheus.url == "http://prometheus:9090"
    assert config.audit.elasticsearch_url == "http://elasticsearch:9200"
    assert config.executors["fleet"]["url"] == "http://fleet:9400"
    assert config.metrics_listen == "0.0.0.0:9842"
    assert config.rules == [Path("/app/rules")]
    engine = services()["engine"]
    assert engine["command"] == ["engine", "run", "--config", "/etc/gpuops/engine.yaml"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in engine["volumes"]}
    assert with_defaults(mounts["/etc/gpuops/engine.yaml"]) == "./deploy/engine/engine.yaml"
    # state, spool and kill switch on the named volume, the tokens file on the secrets volume
    state = mounts["/var/lib/gpuops/state"]
    assert state in compose()["volumes"]
    for path in (config.state_file, config.audit.spool_dir, config.guardrails.kill_switch_file):
        assert str(path).startswith("/var/lib/gpuops/state/")
    assert str(config.api.tokens_file).startswith("/etc/gpuops/secrets/")


def test_ha_profile_runs_two_replicas_on_postgres_with_their_own_spools() -> None:
    """docs/ha.md: with the profile and GPUOPS_ENGINE_CONFIG=engine-ha.yaml, ``engine`` and
    ``engine-standby`` read one config naming the ``postgres`` service, the password from the
    tokens service's ``db-secret`` volume, each its own state volume for its spool."""
    config = load_config(REPO / "deploy" / "engine" / "engine-ha.yaml")
    assert config.state.url == "postgresql://gpuops@postgres:5432/gpuops"
    assert str(config.state.password_file).startswith("/etc/gpuops/db/")
    assert str(config.audit.spool_dir).startswith("/var/lib/gpuops/state/")
    engine, standby = services()["engine"], services()["engine-standby"]
    assert (
        engine["volumes"][0].split(":")[0] == "./deploy/engine/${GPUOPS_ENGINE_CONFIG-engine.yaml}"
    )
    assert standby["volumes"][0].split(":")[0] == "./deploy/engine/engine-ha.yaml"
    for service in (engine, standby):
        mounts = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}
        assert mounts["/etc/gpuops/db"] == "db-secret"
    assert {v.split(":")[1]: v.split(":")[0] for v in engine["volumes"]}[
        "/var/lib/gpuops/state"
    ] != {v.split(":")[1]: v.split(":")[0] for v in standby["volumes"]}["/var/lib/gpuops/state"]
    postgres = services()["postgres"]
    assert postgres["environment"]["POSTGRES_PASSWORD_FILE"].startswith("/run/gpuops/")
    assert "db-secret:/run/gpuops:ro" in postgres["volumes"]


def test_dockerfile_copies_paths_that_exist_and_the_code_needs() -> None:
    text = DOCKERFILE.read_text()
    sources = [
        src
        for line in text.splitlines()
        if line.startswith("COPY ") and "--from" not in line
        for src in line.split()[1:-1]
    ]
    assert sources
    for src in sources:
        assert (REPO / src).exists(), f"Dockerfile copies {src}, which is not in the repo"
    # gpuops.audit.settings and gpuops.sim.demo find these relative to the source tree
    for needed in ("gpuops", "rules", "elk", "deploy", "pyproject.toml", "README.md"):
        assert needed in sources, f"the image lacks {needed}"
    assert "FROM python:3.11-slim" in text
    assert re.search(r"^USER (?!root)\S+", text, re.M), "the image must not run as root"
    assert 'ENTRYPOINT ["gpuops"]' in text
    ignored = (REPO / ".dockerignore").read_text().split()
    assert not set(sources) & set(ignored), "the Dockerfile copies what .dockerignore drops"


def test_scripts_the_one_shot_services_run_are_in_the_image() -> None:
    for name in ("setup", "tokens"):
        entrypoint = services()[name]["entrypoint"]
        script = entrypoint[-1]
        assert script.startswith("/app/deploy/"), script
        assert (REPO / script.removeprefix("/app/")).is_file()
        assert services()[name]["restart"] == "no"


def test_setup_installs_templates_and_imports_every_kibana_file() -> None:
    script = (REPO / "deploy" / "setup" / "setup.sh").read_text()
    assert 'gpuops elk install --url "$es"' in script
    assert "/api/saved_objects/_import?overwrite=true" in script
    assert "kbn-xsrf: true" in script
    assert "/app/elk/kibana/*.ndjson" in script
    assert list((REPO / "elk" / "kibana").glob("*.ndjson"))


def test_alertmanager_sends_to_the_engine_with_the_token_file_the_tokens_service_writes() -> None:
    config = yaml.safe_load((REPO / "deploy" / "alertmanager" / "alertmanager.yml").read_text())
    (receiver,) = config["receivers"]
    (webhook,) = receiver["webhook_configs"]
    assert webhook["url"] == "http://engine:9843/api/v1/alertmanager"
    auth = webhook["http_config"]["authorization"]
    assert auth["type"] == "Bearer"
    mounts = {v.split(":")[1]: v.split(":")[0] for v in services()["alertmanager"]["volumes"]}
    secrets_dir = str(Path(auth["credentials_file"]).parent)
    assert mounts[secrets_dir] == "gpuops-secrets"
    assert Path(auth["credentials_file"]).name == "alertmanager-token"
    assert load_config(ENGINE_CONFIG).api.listen == "0.0.0.0:9843"
