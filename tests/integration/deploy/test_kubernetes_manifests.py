"""deploy/kubernetes: every object of both kustomizations (``base``: one engine replica on
SQLite; ``ha``: two on PostgreSQL) validates against the Kubernetes 1.36 OpenAPI schemas
(kubernetes-validate, strict: an unknown field is an error), the ClusterRole grants exactly the
API calls of the kubernetes executor, the engine configuration in the ConfigMap loads and
passes ``gpuops rules check`` with its policies, the paths and ports the pods use are those the
configuration names, and the Prometheus scrape configuration passes promtool.

The kustomizations are rendered here, offline, as kustomize does for what they use:
``resources`` (files and directories), ``patches`` (strategic merge patches of mappings only:
then a patch is a merge of mappings, which ``test_patches_only_merge_mappings`` checks),
``namespace`` and ``images``. Where kubectl is installed, its ``kubectl kustomize`` renders
the same objects."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from gpuops.cli import cli
from gpuops.integrations.kubernetes.names import cluster_role_rules
from gpuops.settings import load_config

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
KUBE = REPO / "deploy" / "kubernetes"
KUSTOMIZATIONS = ["base", "ha"]
VERSION = "1.36"
"""The Kubernetes release the executor is run against."""
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}

Doc = dict[str, Any]


def load_docs(path: Path) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def merge(base: Doc, patch: Doc) -> Doc:
    """A strategic merge patch made only of mappings: a recursive merge of mappings."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def render(folder: Path) -> list[Doc]:
    """The objects of the kustomization in ``folder`` (module docstring)."""
    k = load_docs(folder / "kustomization.yaml")[0]
    docs: list[Doc] = []
    for resource in k.get("resources", []):
        path = (folder / resource).resolve()
        docs += render(path) if path.is_dir() else load_docs(path)
    for patch in k.get("patches", []):
        for change in load_docs(folder / patch["path"]):
            matches = [d for d in docs if key(d) == key(change)]
            assert len(matches) == 1, f"{patch['path']}: patches no single object {key(change)}"
            docs[docs.index(matches[0])] = merge(matches[0], change)
    for doc in docs:
        if "namespace" in k and doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = k["namespace"]
        for image in k.get("images", []):
            for container in containers(doc):
                if container["image"] == image["name"]:
                    container["image"] = f"{image['newName']}:{image['newTag']}"
    return docs


def key(doc: Doc) -> tuple[str, str, str]:
    return (doc["apiVersion"], doc["kind"], doc["metadata"]["name"])


def pod_spec(doc: Doc) -> Doc | None:
    template = doc.get("spec", {}).get("template")
    return template["spec"] if template else None


def containers(doc: Doc) -> Iterator[Doc]:
    spec = pod_spec(doc)
    yield from (spec or {}).get("containers", [])


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def engine_config(docs: list[Doc], tmp_path: Path) -> Path:
    path = tmp_path / "engine.yaml"
    path.write_text(find(docs, "ConfigMap", "gpuops-engine-config")["data"]["engine.yaml"])
    return path


@pytest.fixture(params=KUSTOMIZATIONS, scope="module")
def rendered(request: pytest.FixtureRequest) -> list[Doc]:
    return render(KUBE / request.param)


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

    for folder in KUSTOMIZATIONS:
        k = load_docs(KUBE / folder / "kustomization.yaml")[0]
        for patch in k.get("patches", []):
            for change in load_docs(KUBE / folder / patch["path"]):
                assert not lists(change), f"{folder}/{patch['path']}: a list in a patch"


@pytest.mark.parametrize("folder", KUSTOMIZATIONS)
def test_kubectl_kustomize_renders_the_same_objects(folder: str) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    done = subprocess.run(
        [kubectl, "kustomize", str(KUBE / folder)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    theirs = sorted(yaml.safe_load_all(done.stdout), key=key)
    assert theirs == sorted(render(KUBE / folder), key=key)


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
