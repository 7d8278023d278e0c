"""The remediation ladder on Kubernetes, on a real engine and API: a fault pushed by a node
agent quarantines its node through the ``kubernetes`` executor against the fake API server
(``tests.fakes.kube_apiserver``: cordoned as gpuops' own, only the faulty GPU's pod evicted,
found through dcgm-exporter's series), the node agent (the exporter's agent over the fake NVML)
resets the GPU, the node is drained (a PodDisruptionBudget holding a pod holds the reboot) and
rebooted through the agent (its reboot command a script drawing a new boot id:
``tests.fakes.reboot``), checked by the agent, and uncordoned only while the cordon is still
gpuops' own."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuops.actions.nvml_agent import NvmlAgentExecutor
from gpuops.exporters.nvml import nvml, scenarios
from gpuops.exporters.nvml.agent import AgentError
from gpuops.exporters.nvml.fake import FakeGpu, FakeNvml
from gpuops.exporters.nvml.reboot import Rebooter
from gpuops.exporters.nvml.scenarios import fake_reset
from gpuops.exporters.nvml.server import ExporterServer
from gpuops.integrations.kubernetes import names
from gpuops.model.health.ladder import Stage
from tests.fakes.gpu_pods import GpuPods
from tests.fakes.kube_apiserver import FakeApiServer
from tests.fakes.reboot import FakeBoot
from tests.integration.actions.kube import node, pdb, pod, settings
from tests.integration.api.harness import Harness, running_api
from tests.integration.api.test_health_events import event, push
from tests.integration.runtime.test_health_ladder import LADDER_RULES, POLICY
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

HEAD, _, TAIL = LADDER_RULES.rpartition("executor: log}")  # the ladder policy's action
K8S_RULES = HEAD + "executor: kubernetes, params: {cordon: true}}" + TAIL
TOKEN = "agent-token"
NODE = "gpu-1"
UNCORRECTED = (nvml.ECC_ERRORS["uncorrected"], nvml.ECC_COUNTERS["volatile"])


@dataclass
class Node:
    """One Kubernetes GPU node: its object in the API server, its agent over the fake NVML."""

    api: FakeApiServer
    fake: FakeNvml
    boot: FakeBoot
    tmp: Path
    reset: Callable[[str], None] | None = None
    """What the agent's GPU reset does (default: the fake NVML's)."""
    agent_url: str = ""

    @property
    def gpu(self) -> FakeGpu:
        return self.fake.gpus[0]

    def k8s(self) -> dict[str, Any]:
        return self.api.get("", "nodes", NODE)

    def evicted(self, name: str) -> bool:
        return bool(self.api.get("", "pods", name, "ml")["metadata"].get("deletionTimestamp"))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Node]:
    api = FakeApiServer()
    api.put("", "nodes", node(NODE))
    api.put("", "pods", pod("train-a", NODE))  # on the faulty GPU
    api.put("", "pods", pod("serve-b", NODE, labels={"app": "serve"}))  # on another GPU
    fake = scenarios.healthy_h100(2)

    def rebooted() -> None:  # a reboot resets every GPU (volatile ECC, pending remappings)
        for gpu in fake.gpus:
            fake.reset_gpu(gpu.uuid)

    yield Node(api, fake, FakeBoot(tmp_path / "node", on_boot=rebooted), tmp_path)
    api.close()


@pytest.fixture
def climb(cluster: Node) -> Iterator[Callable[..., Harness]]:
    """The engine, the node agent and dcgm-exporter's series, started when the test has set
    the node's fault."""
    stack: list[Any] = []

    def start(drain_timeout_s: float = 300) -> Harness:
        c = cluster
        rebooter = Rebooter(c.tmp / "agent-state", c.boot.command(), c.boot.boot_id, node=NODE)
        agent = ExporterServer(
            c.fake,
            host="127.0.0.1",
            port=0,
            agent_token=TOKEN,
            xid_events=False,
            reset=c.reset or fake_reset(c.fake),
            rebooter=rebooter,
        )
        agent.start()
        stack.append(agent.close)
        c.agent_url = f"http://127.0.0.1:{agent.port}"
        prometheus = GpuPods({c.gpu.uuid: (NODE, "ml", "train-a")})
        stack.append(prometheus.close)
        kubeconfig = c.tmp / "kubeconfig"
        kubeconfig.write_text(c.api.kubeconfig(), encoding="utf-8")
        executors = {
            "kubernetes": settings(
                kubeconfig,
                reclaim={"prometheus_url": prometheus.url},
                drain={"timeout_s": drain_timeout_s},
            ),
            "nvml-agent": {
                "url": c.agent_url,
                "token": TOKEN,
                "reboot_poll_s": 0.05,
                "reboot_timeout_s": 60,
            },
        }
        health = {
            "default_profile": "full",
            "ladder": {
                "reboot": {"executor": "nvml-agent"},
                "validation": {"executor": "nvml-agent"},
                "interval": 3600,
            },
        }
        run = running_api(c.tmp / "engine", rules=K8S_RULES, health=health, executors=executors)
        harness = run.__enter__()
        stack.append(lambda: run.__exit__(None, None, None))
        return harness

    yield start
    for close in reversed(stack):
        close()


def fault(api: Harness, cluster: Node, xid: int = 48) -> None:
    assert push(api, event(api, f"{NODE}-{xid}", NODE, cluster.gpu.uuid, xid)).json()["faults"] == 1


def settled(api: Harness, *stages: Stage) -> None:
    def there() -> bool:
        repair = api.engine.ladder.repair(NODE)
        return repair is not None and repair.stage in stages

    wait_for(there, 60, f"{NODE} {stages}")
    api.settle()


def drained(api: Harness, times: int = 1) -> None:
    """Wait for the ``times``-th drain of the node's climb, and for its worker to stop."""

    def done() -> bool:
        return [m[0] for m in moves(api)].count("migrate") >= times

    wait_for(done, 60, f"drain {times}")
    assert api.engine.ladder.wait_idle(30)


def moves(api: Harness) -> list[tuple[str, str, bool]]:
    with api.lock:
        return [
            (d.action.type, d.action.executor, o.ok)
            for d, o in api.decisions
            if d.group == "health-ladder" and o is not None and d.action is not None
        ]


def test_a_reset_heals_the_gpu_and_the_node_is_uncordoned(
    cluster: Node, climb: Callable[..., Harness]
) -> None:
    cluster.gpu.remapped_rows = (0, 1, 1, 0)  # a row remapping a reset applies
    api = climb()
    fault(api, cluster)
    settled(api, Stage.RETURNED)
    assert moves(api) == [
        ("reset_gpu", "nvml-agent", True),
        ("validate", "nvml-agent", True),
        ("resume", "kubernetes", True),
    ]
    assert cluster.evicted("train-a") and not cluster.evicted("serve-b")
    assert "unschedulable" not in cluster.k8s()["spec"]
    assert not (cluster.k8s()["metadata"].get("annotations") or {}).get(names.CORDONED_BY)
    assert cluster.gpu.resets == 1 and cluster.boot.reboots == 0


def test_a_reset_that_fails_is_followed_by_a_drain_and_a_reboot_through_the_agent(
    cluster: Node, climb: Callable[..., Harness]
) -> None:
    cluster.gpu.ecc[UNCORRECTED] = 2  # a reboot clears it
    seen = []

    def busy(uuid: str) -> None:
        k8s = cluster.k8s()  # quarantined: cordoned as gpuops' own, the GPU's pod evicted
        annotations = k8s["metadata"]["annotations"]
        seen.append((k8s["spec"]["unschedulable"], annotations[names.CORDONED_BY]))
        seen.append((cluster.evicted("train-a"), cluster.evicted("serve-b")))
        raise AgentError(409, f"nvidia-smi --gpu-reset: GPU {uuid} is in use")

    cluster.reset = busy
    api = climb()
    fault(api, cluster)
    drained(api)  # the rest of the node: its pods evicted, the reboot waits for them to stop
    assert cluster.boot.reboots == 0
    repair = api.engine.ladder.repair(NODE)
    assert repair is not None and repair.why == (
        "reboot held: 1 pod(s) still on the node that it would stop: ml/serve-b (evicted)"
    )
    api.engine.ladder.tick()  # the next interval: stopped (no grace period left), rebooted
    settled(api, Stage.RETURNED)
    assert moves(api) == [
        ("reset_gpu", "nvml-agent", False),
        ("migrate", "kubernetes", True),
        ("migrate", "kubernetes", True),
        ("reboot", "nvml-agent", True),
        ("validate", "nvml-agent", True),
        ("resume", "kubernetes", True),
    ]
    assert seen == [(True, POLICY), (True, False)]
    assert cluster.boot.reboots == 1
    assert cluster.evicted("train-a") and cluster.evicted("serve-b")
    assert "unschedulable" not in cluster.k8s()["spec"]
    repair = api.engine.ladder.repair(NODE)
    assert repair is not None and repair.done == ("reboot",)
    with api.lock:  # the reboot's decision again (a retry, a restart): no second reboot
        [rebooted] = [d for d, _ in api.decisions if d.action and d.action.type == "reboot"]
    again = NvmlAgentExecutor({"url": cluster.agent_url, "token": TOKEN}).run(rebooted)
    assert (again["rebooted"], again["replayed"]) == (True, True)
    assert cluster.boot.reboots == 1


class NoEviction:
    """The API server's permissions with evictions taken away (an RBAC change, a webhook)."""

    def __contains__(self, item: object) -> bool:
        return item != ("create", "", "pods/eviction")


def test_a_drain_that_fails_before_the_reboot_holds_it_and_hands_the_node_over(
    cluster: Node, climb: Callable[..., Harness]
) -> None:
    cluster.gpu.ecc[UNCORRECTED] = 2

    def busy(uuid: str) -> None:
        cluster.api.allowed = NoEviction()  # type: ignore[assignment]
        raise AgentError(409, f"nvidia-smi --gpu-reset: GPU {uuid} is in use")

    cluster.reset = busy
    api = climb()
    fault(api, cluster)
    settled(api, Stage.NEEDS_HUMAN)
    assert cluster.boot.reboots == 0  # serve-b still runs on the node: never rebooted under it
    assert not cluster.evicted("serve-b")
    repair = api.engine.ladder.repair(NODE)
    assert repair is not None and "the drain before the reboot did not empty the node" in (
        repair.why
    )
    assert ("reboot", "nvml-agent", True) not in moves(api)


def test_pods_a_disruption_budget_holds_hold_the_reboot_until_it_lets_them_go(
    cluster: Node, climb: Callable[..., Harness]
) -> None:
    cluster.gpu.ecc[UNCORRECTED] = 2

    def busy(uuid: str) -> None:
        raise AgentError(409, f"nvidia-smi --gpu-reset: GPU {uuid} is in use")

    cluster.reset = busy
    cluster.api.put("policy", "poddisruptionbudgets", pdb("serve-pdb", "serve", allowed=0))
    api = climb(drain_timeout_s=0.2)
    fault(api, cluster)
    wait_for(lambda: ("migrate", "kubernetes", True) in moves(api), 60, "the drain")
    assert api.engine.ladder.wait_idle(30)
    assert cluster.boot.reboots == 0 and not cluster.evicted("serve-b")
    repair = api.engine.ladder.repair(NODE)
    assert repair is not None and (repair.stage, repair.step) == (Stage.REMEDIATING, "reboot")
    metrics = api.call(None, "GET", "/metrics").text
    assert 'gpuops_health_ladder_moves_total{move="reboot",result="held"} 1.0' in metrics
    allowed = {"disruptionsAllowed": 1}
    cluster.api.edit("policy", "poddisruptionbudgets", "serve-pdb", "ml", status=allowed)
    api.engine.ladder.tick()  # the next interval: drained; then rebooted, checked, returned
    drained(api, 2)
    api.engine.ladder.tick()
    settled(api, Stage.RETURNED)
    assert cluster.evicted("serve-b") and cluster.boot.reboots == 1
    assert [m[0] for m in moves(api)] == [
        "reset_gpu",
        "migrate",
        "migrate",
        "migrate",
        "reboot",
        "validate",
        "resume",
    ]


def test_a_fault_nothing_heals_needs_a_human_and_the_node_stays_cordoned(
    cluster: Node, climb: Callable[..., Harness]
) -> None:
    cluster.gpu.remapped_rows = (0, 1, 0, 1)  # a failed row remapping: a new GPU
    api = climb()
    fault(api, cluster)
    drained(api)
    api.engine.ladder.tick()
    settled(api, Stage.NEEDS_HUMAN)
    repair = api.engine.ladder.repair(NODE)
    assert repair is not None and repair.done == ("reset_gpu", "reboot")
    assert repair.why.startswith("the health check failed after reset_gpu, reboot")
    assert "a row remapping failed" in repair.why
    assert cluster.boot.reboots == 1
    assert cluster.k8s()["spec"]["unschedulable"] is True
    assert [m[0] for m in moves(api)].count("resume") == 0


def test_a_node_someone_cordoned_before_is_not_on_the_ladder(
    cluster: Node, climb: Callable[..., Harness]
) -> None:
    cluster.api.edit("", "nodes", NODE, spec={"unschedulable": True})  # kubectl cordon
    api = climb()
    fault(api, cluster)
    api.settle()
    assert api.engine.ladder.repair(NODE) is None
    assert moves(api) == []
    assert cluster.k8s()["spec"]["unschedulable"] is True
    assert cluster.gpu.resets == 0 and cluster.boot.reboots == 0


@pytest.mark.parametrize(
    ("edits", "unschedulable", "why"),
    [
        ([None], None, "uncordoned by someone else"),
        ([None, True], True, "cordoned again by someone else: their cordon stays"),
    ],
    ids=["uncordoned", "uncordoned-then-cordoned"],
)
def test_the_return_leaves_a_node_as_a_person_left_it(
    cluster: Node,
    climb: Callable[..., Harness],
    edits: list[bool | None],
    unschedulable: bool | None,
    why: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster.gpu.remapped_rows = (0, 1, 1, 0)

    def reset_meanwhile(uuid: str) -> None:  # a person acts on the node during its repair
        for value in edits:  # kubectl uncordon, kubectl cordon
            cluster.api.edit("", "nodes", NODE, spec={"unschedulable": value})
        fake_reset(cluster.fake)(uuid)

    cluster.reset = reset_meanwhile
    api = climb()
    fault(api, cluster)
    settled(api, Stage.RETURNED)
    assert cluster.k8s()["spec"].get("unschedulable") is unschedulable
    repair = api.engine.ladder.repair(NODE)
    assert repair is not None and "uncordoned=False" in repair.why and why in repair.why
    assert f"node {NODE}: its return leaves it as someone else left it: {why}" in caplog.text
    assert moves(api)[-1] == ("resume", "kubernetes", True)


@pytest.mark.parametrize(
    ("edits", "unschedulable", "why"),
    [
        ([None], None, "someone else uncordoned it in this episode"),
        ([None, True], True, "cordoned again by someone else"),
    ],
    ids=["uncordoned", "uncordoned-then-cordoned"],
)
def test_a_node_a_person_took_back_before_its_reboot_leaves_the_ladder_and_is_not_rebooted(
    cluster: Node,
    climb: Callable[..., Harness],
    edits: list[bool | None],
    unschedulable: bool | None,
    why: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cluster.gpu.ecc[UNCORRECTED] = 2

    def busy_meanwhile(uuid: str) -> None:  # a person takes the node back, the reset fails
        for value in edits:  # kubectl uncordon, kubectl cordon
            cluster.api.edit("", "nodes", NODE, spec={"unschedulable": value})
        raise AgentError(409, f"nvidia-smi --gpu-reset: GPU {uuid} is in use")

    cluster.reset = busy_meanwhile
    api = climb()
    fault(api, cluster)
    settled(api, Stage.HEALTHY)
    assert cluster.boot.reboots == 0 and not cluster.evicted("serve-b")
    assert cluster.k8s()["spec"].get("unschedulable") is unschedulable
    assert moves(api) == [("reset_gpu", "nvml-agent", False), ("migrate", "kubernetes", True)]
    repair = api.engine.ladder.repair(NODE)
    assert repair is not None and repair.why.startswith(f"left the remediation ladder: {why}")
    said = f"node {NODE} leaves the remediation ladder before its reboot: {why}"
    assert said in caplog.text
    with api.lock:
        [audited] = [d for d, _ in api.decisions if d.reason.startswith(said)]
    assert audited.group == "health-ladder" and audited.action is None
    api.engine.ladder.tick()  # the next interval: nothing more
    api.settle()
    assert len(moves(api)) == 2 and cluster.boot.reboots == 0


STOPPING = pod("stopping", NODE)
STOPPING["metadata"]["deletionTimestamp"] = "2999-01-01T00:00:00Z"  # its grace period


@pytest.mark.parametrize(
    ("kept", "why", "audited"),
    [
        (
            pod("pinned", NODE, labels={names.VETO_LABEL: names.VETO_VALUE}),
            "ml/pinned (veto)",
            True,
        ),
        (pod("dns", NODE, namespace="kube-system"), "kube-system/dns (system namespace)", True),
        (STOPPING, "ml/stopping (terminating until 2999-01-01T00:00:00+00:00)", False),
    ],
    ids=["veto", "system-namespace", "terminating"],
)
def test_a_pod_the_drain_leaves_on_the_node_holds_the_reboot_until_it_is_gone(
    cluster: Node,
    climb: Callable[..., Harness],
    kept: dict[str, Any],
    why: str,
    audited: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "gpuops.runtime.ladder")  # pods stopping: said at INFO
    cluster.gpu.ecc[UNCORRECTED] = 2

    def busy(uuid: str) -> None:
        raise AgentError(409, f"nvidia-smi --gpu-reset: GPU {uuid} is in use")

    cluster.reset = busy
    cluster.api.put("", "pods", kept)
    cluster.api.put(
        "", "pods", pod("agent", NODE, namespace="kube-system", owner=("DaemonSet", "a"))
    )
    api = climb()
    fault(api, cluster)
    wait_for(lambda: ("migrate", "kubernetes", True) in moves(api), 60, "the drain")
    assert api.engine.ladder.wait_idle(30)
    api.engine.ladder.tick()  # the next interval: held again, audited once
    api.settle()
    assert cluster.boot.reboots == 0
    repair = api.engine.ladder.repair(NODE)
    assert repair is not None and (repair.stage, repair.step) == (Stage.REMEDIATING, "reboot")
    assert repair.why == f"reboot held: 1 pod(s) still on the node that it would stop: {why}"
    assert caplog.text.count(f"node {NODE}: its reboot waits: ") == 1  # 2 pods, then 1
    with api.lock:
        held = [d for d, _ in api.decisions if d.verdict.value == "suppressed:veto"]
    assert [d.reason for d in held] == [f"remediation ladder: reboot of {NODE} held: {why}"][
        : int(audited)
    ]
    metrics = api.call(None, "GET", "/metrics").text
    assert 'gpuops_health_ladder_moves_total{move="reboot",result="held"} 2.0' in metrics
    meta = kept["metadata"]
    cluster.api.edit("", "pods", meta["name"], meta["namespace"], status={"phase": "Succeeded"})
    api.engine.ladder.tick()
    settled(api, Stage.RETURNED)
    assert cluster.boot.reboots == 1
    assert [m[0] for m in moves(api)] == [
        "reset_gpu",
        "migrate",
        "migrate",
        "migrate",
        "reboot",
        "validate",
        "resume",
    ]


def test_the_labels_an_agent_sends_never_choose_the_pods_evicted(
    cluster: Node, climb: Callable[..., Harness]
) -> None:
    """``pod`` and ``namespace`` from an agent (or anyone with the push token) are not failure
    domains: the engine leaves them out of the fault, and the quarantine evicts the pod that
    dcgm-exporter's series put on the faulty GPU, never the one the labels name."""
    cluster.gpu.remapped_rows = (0, 1, 1, 0)  # a row remapping a reset applies
    api = climb()
    named = {"pod": "serve-b", "namespace": "ml"}
    sent = {**event(api, f"{NODE}-48", NODE, cluster.gpu.uuid, 48), "labels": named}
    assert push(api, sent).json()["faults"] == 1
    settled(api, Stage.RETURNED)
    assert cluster.evicted("train-a") and not cluster.evicted("serve-b")


def test_a_reboot_held_past_reboot_hold_hands_the_node_to_a_human(
    cluster: Node, climb: Callable[..., Harness]
) -> None:
    cluster.gpu.ecc[UNCORRECTED] = 2

    def busy(uuid: str) -> None:
        raise AgentError(409, f"nvidia-smi --gpu-reset: GPU {uuid} is in use")

    cluster.reset = busy
    cluster.api.put("", "pods", pod("pinned", NODE, labels={names.VETO_LABEL: names.VETO_VALUE}))
    api = climb()
    fault(api, cluster)
    wait_for(lambda: ("migrate", "kubernetes", True) in moves(api), 60, "the drain")
    assert api.engine.ladder.wait_idle(30)
    api.clock.advance(1799)  # within health.ladder.reboot_hold (30 minutes): held again
    api.engine.ladder.tick()
    assert api.engine.ladder.wait_idle(30)
    repair = api.engine.ladder.repair(NODE)
    assert repair is not None and repair.stage is Stage.REMEDIATING
    assert repair.why.startswith("reboot held: ")
    api.clock.advance(1)  # the hold has lasted reboot_hold: the node goes to a human
    api.engine.ladder.tick()
    settled(api, Stage.NEEDS_HUMAN)
    assert cluster.boot.reboots == 0  # never rebooted under the vetoed pod
    repair = api.engine.ladder.repair(NODE)
    assert repair is not None
    assert "its reboot was held 1800 s (health.ladder.reboot_hold) by 1 pod(s)" in repair.why
    assert "ml/pinned (veto)" in repair.why
