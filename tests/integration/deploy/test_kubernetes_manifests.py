"""deploy/kubernetes: every object of both kustomizations (``base``: one engine replica on
SQLite; ``ha``: two on PostgreSQL), alone and with the ``agent-reboot`` component, validates
against the Kubernetes 1.36 OpenAPI schemas (kubernetes-validate, strict: an unknown field is an
error), the ClusterRole grants exactly the API calls of the kubernetes executor, the engine
configuration in the ConfigMap loads and passes ``gpuops rules check`` with its policies, the
paths and ports the pods use are those the configuration names, the node agent gets reboot
rights only from the component and then all it needs, and the Prometheus scrape configuration
passes promtool.

The kustomizations are rendered offline by ``tests.integration.deploy.kustomize``, as kustomize
does for what they use. Where kubectl is installed, its ``kubectl kustomize`` renders the same
objects."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from gpuops.cli import cli
from gpuops.cli.exporter import _rebooter, nvml
from gpuops.exporters.nvml.reboot import Rebooter
from gpuops.integrations.kubernetes.names import cluster_role_rules
from gpuops.settings import load_config
from tests.integration.deploy.kustomize import (
    CLUSTER_SCOPED,
    Doc,
    RenderError,
    containers,
    json_patch,
    key,
    load_docs,
    merge,
    pod_spec,
    render,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
KUBE = REPO / "deploy" / "kubernetes"
KUSTOMIZATIONS = ["base", "ha"]
SITES = [*KUSTOMIZATIONS, "base+agent-reboot", "ha+agent-reboot"]
"""What is rendered: a kustomization of deploy/kubernetes, or one with a component over it
(a site's own kustomization, written outside the tree)."""
VERSION = "1.36"
"""The Kubernetes release the executor is run against."""
REBOOT_COMMAND = ["nsenter", "--target", "1", "--mount", "--", "systemctl", "reboot"]


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def engine_config(docs: list[Doc], tmp_path: Path) -> Path:
    path = tmp_path / "engine.yaml"
    path.write_text(find(docs, "ConfigMap", "gpuops-engine-config")["data"]["engine.yaml"])
    return path


def site_folder(site: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of ``site`` (``SITES``): a kustomization of the tree, or one written in a
    temporary folder with its component, as a site's own (paths relative: kustomize refuses
    absolute ones)."""
    resource, _, component = site.partition("+")
    if not component:
        return KUBE / resource
    folder = tmp_path_factory.mktemp("site")
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(KUBE / resource, folder)],
        "components": [os.path.relpath(KUBE / component, folder)],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return folder


@pytest.fixture(params=SITES, scope="module")
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[Doc]:
    return render(site_folder(request.param, tmp_path_factory))


def test_every_object_validates_against_the_kubernetes_schemas(rendered: list[Doc]) -> None:
    problems = []
    for doc in rendered:
        try:
            kubernetes_validate.validate(doc, VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{key(doc)}: {str(exc).splitlines()[0]}")
    assert not problems, "\n".join(problems)
    assert {d["kind"] for d in rendered} >= {"StatefulSet", "DaemonSet", "ClusterRole"}


def test_the_validation_refuses_an_unknown_field_and_a_wrong_type() -> None:
    statefulset = find(render(KUBE / "base"), "StatefulSet", "gpuops-engine")
    unknown = merge(statefulset, {"spec": {"replica": 2}})
    with pytest.raises(kubernetes_validate.ValidationError, match="'replica' was unexpected"):
        kubernetes_validate.validate(unknown, VERSION, strict=True)
    wrong = merge(statefulset, {"spec": {"replicas": "two"}})
    with pytest.raises(kubernetes_validate.ValidationError, match="'two' is not of type"):
        kubernetes_validate.validate(wrong, VERSION, strict=True)


def test_namespaced_objects_are_in_the_gpuops_namespace(rendered: list[Doc]) -> None:
    outside = [
        key(d)
        for d in rendered
        if d["kind"] not in CLUSTER_SCOPED and d["metadata"].get("namespace") != "gpuops"
    ]
    assert not outside


def test_the_cluster_role_grants_exactly_what_the_executor_calls(rendered: list[Doc]) -> None:
    role = find(rendered, "ClusterRole", "gpuops-engine")
    assert role["rules"] == cluster_role_rules()
    binding = find(rendered, "ClusterRoleBinding", "gpuops-engine")
    assert binding["roleRef"]["name"] == "gpuops-engine"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpuops-engine", "namespace": "gpuops"}
    ]
    engine = pod_spec(find(rendered, "StatefulSet", "gpuops-engine"))
    assert engine is not None and engine["serviceAccountName"] == "gpuops-engine"
    agent = pod_spec(find(rendered, "DaemonSet", "gpuops-node-agent"))
    assert agent is not None and agent["automountServiceAccountToken"] is False


def test_the_engine_configuration_loads_and_names_what_the_pod_mounts(
    rendered: list[Doc], tmp_path: Path
) -> None:
    config = load_config(engine_config(rendered, tmp_path))
    assert config.rules == [Path("/app/rules/kubernetes")]  # the Dockerfile copies rules/
    assert (REPO / "rules" / "kubernetes").is_dir()
    assert config.guardrails.dry_run is True
    assert config.executors["scheduler"]["use"] == "kubernetes"
    assert config.executors["kubernetes"]["node_selector"]
    statefulset = find(rendered, "StatefulSet", "gpuops-engine")
    (container,) = containers(statefulset)
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    files = [
        str(config.api.tokens_file),
        config.executors["nvml-agent"]["token_file"],
        *([config.state.password_file] if config.state.url else []),
    ]
    for file in map(str, files):
        assert str(Path(file).parent) in mounts, f"{file} is in no mounted volume"
    assert "/var/lib/gpuops/state" in mounts  # state, spool and kill switch: the volume
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert str(config.metrics_listen).endswith(f":{ports['metrics']}")
    assert str(config.api.listen).endswith(f":{ports['api']}")


def test_rules_check_accepts_the_configuration_with_its_policies(
    rendered: list[Doc], tmp_path: Path
) -> None:
    """As the engine loads them: the image's /app/rules/kubernetes is this tree's."""
    config = engine_config(rendered, tmp_path)
    text = config.read_text()
    assert "[/app/rules/kubernetes]" in text
    config.write_text(text.replace("/app/rules/kubernetes", str(REPO / "rules" / "kubernetes")))
    result = CliRunner().invoke(cli, ["rules", "check", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("OK: 6 policies in 1 group from 1 file")


def test_services_and_probes_name_ports_the_pods_have(rendered: list[Doc]) -> None:
    named = {
        doc["metadata"]["name"]: {p["name"] for c in containers(doc) for p in c["ports"]}
        for doc in rendered
        if pod_spec(doc)
    }
    for doc in rendered:
        for container in containers(doc):
            for probe in ("readinessProbe", "livenessProbe"):
                check = container.get(probe, {})
                port = (check.get("httpGet") or check.get("tcpSocket") or {}).get("port")
                assert port is None or port in named[doc["metadata"]["name"]], (key(doc), probe)
        if doc["kind"] == "Service":
            (owner,) = [
                d
                for d in rendered
                if pod_spec(d)
                and d["spec"]["template"]["metadata"]["labels"].items()
                >= doc["spec"]["selector"].items()
            ]
            for port in doc["spec"]["ports"]:
                assert port["targetPort"] in named[owner["metadata"]["name"]], key(doc)


def test_the_node_agent_serves_the_token_the_engine_sends(rendered: list[Doc]) -> None:
    (agent,) = containers(find(rendered, "DaemonSet", "gpuops-node-agent"))
    args = agent["args"]
    assert "--agent" in args
    token_file = next(a.split("=", 1)[1] for a in args if a.startswith("--agent-token-file="))
    mounts = {m["mountPath"]: m["name"] for m in agent["volumeMounts"]}
    assert mounts[str(Path(token_file).parent)] == "agent-token"
    port = next(a.split("=", 1)[1] for a in args if a.startswith("--port="))
    assert agent["ports"][0]["hostPort"] == int(port)
    statefulset = find(rendered, "StatefulSet", "gpuops-engine")
    (engine,) = containers(statefulset)
    volumes = (pod_spec(statefulset) or {})["volumes"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in volumes if "secret" in v}
    assert secrets["agent-token"] == "gpuops-agent-token"
    assert any(m["name"] == "agent-token" for m in engine["volumeMounts"])


def test_the_ha_kustomization_runs_two_replicas_on_postgresql(tmp_path: Path) -> None:
    docs = render(KUBE / "ha")
    assert find(docs, "StatefulSet", "gpuops-engine")["spec"]["replicas"] == 2
    config = load_config(engine_config(docs, tmp_path))
    assert config.state.url is not None and "gpuops-postgres" in config.state.url
    assert find(docs, "Service", "gpuops-postgres")
    assert find(render(KUBE / "base"), "StatefulSet", "gpuops-engine")["spec"]["replicas"] == 1


def test_the_ha_configuration_differs_from_the_base_one_only_in_its_state() -> None:
    def settings(folder: str) -> Doc:
        text = find(render(KUBE / folder), "ConfigMap", "gpuops-engine-config")["data"]
        data: Doc = yaml.safe_load(text["engine.yaml"])
        data.pop("state", None)
        data.pop("state_file", None)
        return data

    assert settings("ha") == settings("base")


def test_patches_only_merge_mappings() -> None:
    def lists(value: Any) -> bool:
        if isinstance(value, dict):
            return any(lists(v) for v in value.values())
        return isinstance(value, list)

    for folder in [*KUSTOMIZATIONS, "agent-reboot"]:
        k = load_docs(KUBE / folder / "kustomization.yaml")[0]
        for patch in k.get("patches", []):
            if "target" in patch:  # a JSON patch (RFC 6902): lists are what it is made of
                continue
            for change in load_docs(KUBE / folder / patch["path"]):
                assert not lists(change), f"{folder}/{patch['path']}: a list in a patch"


@pytest.mark.parametrize("site", SITES)
def test_kubectl_kustomize_renders_the_same_objects(
    site: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    folder = site_folder(site, tmp_path_factory)
    done = subprocess.run(
        [kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    theirs = sorted(yaml.safe_load_all(done.stdout), key=key)
    assert theirs == sorted(render(folder), key=key)


def agent_of(docs: list[Doc]) -> tuple[Doc, Doc]:
    """The node agent's pod spec and container."""
    spec = pod_spec(find(docs, "DaemonSet", "gpuops-node-agent"))
    assert spec is not None
    (container,) = spec["containers"]
    return spec, container


def flag(args: list[str], name: str) -> str | None:
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")]
    assert len(values) <= 1, f"{name} is given twice"
    return values[0] if values else None


def test_no_container_is_privileged_without_privilege_escalation(rendered: list[Doc]) -> None:
    """The API server refuses that pair, which the schemas do not check."""
    for doc in rendered:
        for container in containers(doc):
            context = container.get("securityContext", {})
            if context.get("privileged"):
                assert context.get("allowPrivilegeEscalation") is not False, key(doc)


@pytest.mark.parametrize("folder", KUSTOMIZATIONS)
def test_the_default_install_cannot_reboot_a_node(folder: str) -> None:
    spec, agent = agent_of(render(KUBE / folder))
    assert "--agent-reboot" not in agent["args"]
    assert not spec.get("hostPID") and not agent["securityContext"].get("privileged")
    assert agent["securityContext"]["allowPrivilegeEscalation"] is False
    assert not [v for v in spec["volumes"] if "hostPath" in v]


@pytest.mark.parametrize("folder", KUSTOMIZATIONS)
def test_the_agent_reboot_component_gives_the_agent_what_a_reboot_needs(
    folder: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    base_spec, base_agent = agent_of(render(KUBE / folder))
    docs = render(site_folder(f"{folder}+agent-reboot", tmp_path_factory))
    spec, agent = agent_of(docs)
    args = agent["args"]
    assert args[: len(base_agent["args"])] == base_agent["args"]  # appended to, not replaced
    assert "--agent" in args and "--agent-reboot" in args
    known = {o for p in nvml.params for o in [*p.opts, *p.secondary_opts]}
    assert {a.split("=", 1)[0] for a in args if a.startswith("--")} - {"--log-json"} <= known
    command, state_dir = flag(args, "--agent-reboot-command"), flag(args, "--agent-state-dir")
    assert command is not None and state_dir is not None
    assert flag(args, "--node") == "$(NODE_NAME)"  # the name a reboot must give: the node's
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in (
        agent["env"]
    )
    boot_id = Path("/proc/sys/kernel/random/boot_id")
    rebooter = _rebooter(command, Path(state_dir), boot_id, "gpu-node-1")
    assert isinstance(rebooter, Rebooter) and list(rebooter.command) == REBOOT_COMMAND
    assert spec["hostPID"] is True  # PID 1 is the host's systemd
    assert agent["securityContext"]["privileged"] is True
    mount = next(m for m in agent["volumeMounts"] if m["mountPath"] == state_dir)
    assert not mount.get("readOnly")
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"] == {"path": "/var/lib/gpuops-agent", "type": "DirectoryOrCreate"}
    assert spec["volumes"][: len(base_spec["volumes"])] == base_spec["volumes"]
    namespace = find(docs, "Namespace", "gpuops")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    others = [d for d in docs if d["kind"] != "DaemonSet"]
    assert others == [d for d in render(KUBE / folder) if d["kind"] != "DaemonSet"]


def test_a_json_patch_is_applied_as_rfc_6902_says() -> None:
    doc = {"a": {"b": [1, 2], "c": "x", "d/e": 0}}
    ops: list[Doc] = [
        {"op": "test", "path": "/a/c", "value": "x"},
        {"op": "add", "path": "/a/b/-", "value": 3},
        {"op": "add", "path": "/a/b/0", "value": 0},
        {"op": "replace", "path": "/a/c", "value": "y"},
        {"op": "remove", "path": "/a/d~1e"},
        {"op": "add", "path": "/a/f", "value": True},
    ]
    assert json_patch(doc, ops) == {"a": {"b": [0, 1, 2, 3], "c": "y", "f": True}}
    assert doc["a"]["b"] == [1, 2]  # a copy is patched
    failing: list[tuple[Doc, str]] = [
        ({"op": "test", "path": "/a/c", "value": "z"}, "p: testing value /a/c failed"),
        ({"op": "replace", "path": "/a/g", "value": 1}, "p: /a/g: no 'g' there"),
        ({"op": "add", "path": "/a/b/3", "value": 1}, "p: /a/b/3: '3' is no index of a list"),
        ({"op": "remove", "path": "/a/b/-"}, "p: /a/b/-: '-' is no index of a list of 2"),
        ({"op": "move", "from": "/a/c", "path": "/a/h"}, "does not implement op 'move'"),
    ]
    for op, says in failing:
        with pytest.raises(RenderError, match=re.escape(says)):
            json_patch(doc, [op], "p")


SD_ROLES = {"node", "service", "pod", "endpoints", "endpointslice", "ingress"}


def test_the_scrape_configuration_passes_promtool(tmp_path: Path) -> None:
    """Debian's promtool is built without Kubernetes service discovery: each job's
    ``kubernetes_sd_configs`` is checked here (role, namespaces) and replaced by a static
    target for promtool, which checks everything else (relabelling regexes included)."""
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(promtool).exists():
        pytest.skip("promtool is not installed (Debian package prometheus)")
    config = load_docs(KUBE / "prometheus" / "prometheus.yml")[0]
    for job in config["scrape_configs"]:
        for sd in job.pop("kubernetes_sd_configs"):
            assert sd["role"] in SD_ROLES, job["job_name"]
            assert set(sd) <= {"role", "namespaces"}, job["job_name"]
            assert set(sd.get("namespaces", {})) <= {"names", "own_namespace"}
        job["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
        auth = job.get("authorization", {})
        if "credentials_file" in auth:
            token = tmp_path / "token"
            token.write_text("x")
            auth["credentials_file"] = str(token)
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["dcgm-exporter"]["honor_labels"] is True  # the exporter's pod/namespace win
    assert jobs["kube-state-metrics"]["honor_labels"] is True
    node = [r for r in jobs["dcgm-exporter"]["relabel_configs"] if r.get("target_label") == "node"]
    assert node == [{"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"}]


def test_the_image_has_what_the_manifests_run() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^COPY rules \./rules$", dockerfile, flags=re.M)
    assert "--uid 10001" in dockerfile  # the engine's runAsUser
    # Debian, whose essential util-linux has the nsenter of the agent-reboot component
    assert re.search(r"^FROM python:3\.11-slim$", dockerfile, flags=re.M)
