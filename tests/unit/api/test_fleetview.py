"""The Fleet page's state derivation (``gpuops.api.fleetview``): each node state from the series
that say it, stale data shown as no data (never healthy), GPU health, the job holding a GPU,
holds attached to their node or GPU, the pool filter and the queue."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from gpuops.api.fleetview import QUERIES, Held, Readings, fleet, hold_of, node_state
from gpuops.api.responses.fleet import HoldOut, NodeOut
from gpuops.model.decisions import ActionSpec, Decision, Evidence, Sample, Target, Transition

NOW = 10_000.0
AGE = 30.0


def s(value: float, **labels: str) -> Sample:
    return Sample(MappingProxyType(labels), value, NOW)


def node(
    name: str, pool: str = "default", up: float = 1, seen: float = NOW - 5
) -> dict[str, list[Sample]]:
    return {"up": [s(up, node=name, pool=pool)], "up_seen": [s(seen, node=name, pool=pool)]}


def gpu(
    name: str,
    uuid: str,
    util: float,
    seen: float = NOW - 5,
    pool: str = "default",
    index: str = "",
) -> dict[str, list[Sample]]:
    labels = {"node": name, "uuid": uuid, "gpu": index or uuid[-1], "pool": pool}
    return {
        "gpu_seen": [s(seen, **labels)],
        "gpu_up": [s(1, **labels)],
        "utilization": [s(util, **labels)],
        "temperature": [s(61, **labels)],
    }


def readings(*parts: dict[str, list[Sample]], errors: tuple[str, ...] = ()) -> Readings:
    merged: dict[str, list[Sample]] = {}
    for part in parts:
        for name, samples in part.items():
            merged.setdefault(name, []).extend(samples)
    return Readings(NOW, AGE, {k: tuple(v) for k, v in merged.items()}, errors)


def hold(
    action: str, key: str, dry_run: bool = False, undo: str | None = None, policy: str = ""
) -> HoldOut:
    decision = Decision(
        id=f"id-{action}",
        policy=policy or f"p-{action}",
        group="g",
        target=Target(key, MappingProxyType({})),
        transition=Transition.FIRE,
        action=ActionSpec(action, "fleet"),
        evidence=Evidence("expr", 1.0, NOW - 100, NOW - 60),
        at=NOW - 60,
        episode_start=NOW - 100,
    )
    return hold_of(decision, dry_run, undo, None)


def only(out: list[NodeOut], name: str) -> NodeOut:
    (found,) = [n for n in out if n.name == name]
    return found


@pytest.mark.parametrize(
    ("slurm", "up", "fresh", "booting", "drained", "state"),
    [
        ("idle", 1.0, True, False, False, "up"),
        ("mixed", None, False, False, False, "up"),
        ("draining", 1.0, True, False, False, "draining"),
        ("drained", 1.0, True, False, False, "drained"),
        ("down", 1.0, True, False, False, "down"),
        ("powered_down", None, False, False, False, "powered_down"),
        ("powering_up", None, False, False, False, "booting"),
        ("maint", 1.0, True, False, False, "unknown"),
        (None, None, False, True, False, "booting"),
        (None, 1.0, False, False, False, "unknown"),
        (None, None, True, False, False, "unknown"),
        (None, 0.0, True, False, False, "down"),
        (None, 1.0, True, False, True, "drained"),
        (None, 1.0, True, False, False, "up"),
    ],
)
def test_node_state_from_the_series_that_say_it(
    slurm: str | None, up: float | None, fresh: bool, booting: bool, drained: bool, state: str
) -> None:
    got, source = node_state(slurm, up, fresh, booting, drained)
    assert got == state
    assert source  # says where the state was read


def test_a_down_node_is_failed_and_its_gpus_have_no_data() -> None:
    r = readings(
        node("n1"),
        node("n2", up=0),
        gpu("n1", "GPU-a0", 0.8),
        gpu("n2", "GPU-b0", 0.9, seen=NOW - 200),  # the node's last scrape with GPUs
    )
    out = fleet(r, [], None)
    n2 = only(out.nodes, "n2")
    assert (n2.state, n2.health, n2.problems) == ("down", "failed", ["down"])
    (g,) = n2.gpus
    assert (g.health, g.stale, g.utilization, g.last_seen) == ("no_data", True, None, NOW - 200)
    n1 = only(out.nodes, "n1")
    assert (n1.state, n1.health) == ("up", "ok")
    assert n1.gpus[0].utilization == 0.8 and n1.gpus[0].temperature_c == 61


def test_a_node_that_stopped_reporting_is_no_data_since_its_last_sample_not_healthy() -> None:
    r = readings({"up_seen": [s(NOW - 600, node="n3", pool="default")]})
    (n3,) = fleet(r, [], None).nodes
    assert (n3.state, n3.health, n3.stale, n3.last_seen) == ("unknown", "no_data", True, NOW - 600)


def test_an_old_up_sample_is_not_taken_as_up() -> None:
    r = readings(node("n1", seen=NOW - AGE - 1))
    (n1,) = fleet(r, [], None).nodes
    assert (n1.state, n1.health) == ("unknown", "no_data")


def test_gpu_health_lost_xid_ecc_and_remap() -> None:
    labels = {"node": "n1", "uuid": "GPU-a0"}
    r = readings(
        node("n1"),
        gpu("n1", "GPU-a0", 0.5),
        gpu("n1", "GPU-a1", 0.5),
        gpu("n1", "GPU-a2", 0.5),
        {
            "xid": [s(3, **labels)],
            "ecc": [s(2, **labels)],
            "remap_failed": [s(1, node="n1", uuid="GPU-a1")],
            "gpu_up": [s(0, node="n1", uuid="GPU-a2")],
        },
    )
    n1 = only(fleet(r, [], None).nodes, "n1")
    a0, a1, a2 = n1.gpus
    assert a0.health == "degraded"
    assert a0.problems == [
        "3 XID errors in the last hour",
        "2 uncorrected ECC errors in the last hour",
    ]
    assert (a1.health, a1.problems) == (
        "failed",
        ["a memory row remapping failed: replace the GPU"],
    )
    assert (a2.health, a2.up) == ("failed", False)
    assert n1.health == "failed" and len(n1.problems) == 3


def test_the_job_and_project_holding_each_gpu() -> None:
    r = readings(
        node("n1"),
        gpu("n1", "GPU-a0", 0.9),
        gpu("n1", "GPU-a1", 0.0),
        {"allocated": [s(1, node="n1", uuid="GPU-a0", job="job-7", project="vision")]},
    )
    a0, a1 = only(fleet(r, [], None).nodes, "n1").gpus
    assert (a0.job, a0.project) == ("job-7", "vision")
    assert (a1.job, a1.project) == (None, None)


def test_holds_go_to_their_gpu_node_or_the_rest() -> None:
    r = readings(node("n1"), gpu("n1", "GPU-a0", 0.1))
    held = [
        Held({"uuid": "GPU-a0"}, hold("downclock", "uuid=GPU-a0", undo="restore_clocks")),
        Held({"node": "n1"}, hold("migrate", "node=n1", undo="resume")),
        Held({"pool": "default"}, hold("scale_out", "pool=default")),
    ]
    out = fleet(r, held, None)
    n1 = only(out.nodes, "n1")
    assert [h.what for h in n1.gpus[0].holds] == ["downclocked"]
    assert n1.gpus[0].holds[0].undo == "restore_clocks"
    assert [h.what for h in n1.holds] == ["drained"]
    assert n1.state == "drained" and "gpuops" in n1.state_source
    assert [h.what for h in out.other_holds] == ["scaled out"]


def test_a_dry_run_migrate_does_not_show_the_node_drained() -> None:
    r = readings(node("n1"))
    out = fleet(r, [Held({"node": "n1"}, hold("migrate", "node=n1", dry_run=True))], None)
    assert only(out.nodes, "n1").state == "up"


def test_the_pool_filter_and_the_queue() -> None:
    r = readings(
        node("n1", pool="a100"),
        node("n2", pool="h100"),
        {
            "queue": [
                s(30, pool="a100", reason="Resources"),
                s(5, pool="a100", reason="JobHeldAdmin"),
                s(0, pool="h100", reason=""),
            ]
        },
    )
    everything = fleet(r, [], None)
    assert everything.pools == ["a100", "h100"] and everything.pending_jobs == 35
    a100 = fleet(r, [], "a100")
    assert [n.name for n in a100.nodes] == ["n1"]
    (q,) = a100.queue
    assert (q.pool, q.pending_jobs, q.reasons) == ("a100", 35, {"JobHeldAdmin": 5, "Resources": 30})


def test_a_failed_query_is_named_and_its_data_missing() -> None:
    r = readings(node("n1"), errors=("Prometheus rejected 'x': 503",))
    out = fleet(r, [], None)
    assert out.errors == ["Prometheus rejected 'x': 503"]
    assert out.pending_jobs is None  # no queue answer: not an empty queue


def test_every_query_is_named() -> None:
    assert set(QUERIES) >= {"up", "up_seen", "gpu_seen", "allocated", "queue", "slurm_state"}


def test_a_series_gone_stale_just_now_is_no_data_though_its_last_sample_is_recent() -> None:
    # a removed target: Prometheus writes a staleness marker, the instant query has no `up`
    r = readings(
        {"up_seen": [s(NOW - 3, node="n7", pool="h100")]},
        {"gpu_seen": [s(NOW - 3, node="n7", uuid="GPU-7a", gpu="0")]},
        {"utilization": [s(0.5, node="n7", uuid="GPU-7a")]},
    )
    (n7,) = fleet(r, [], None).nodes
    assert (n7.state, n7.health, n7.stale) == ("unknown", "no_data", True)
    (g,) = n7.gpus
    assert (g.health, g.utilization) == ("no_data", None)


def test_a_powered_down_node_without_an_exporter_is_not_unhealthy() -> None:
    r = readings({"slurm_state": [s(1, node="n4", state="powered_down")]})
    (n4,) = fleet(r, [], None).nodes
    assert (n4.state, n4.health, n4.problems) == ("powered_down", "ok", [])
    r = readings({"slurm_state": [s(1, node="n4", state="idle")]})
    (n4,) = fleet(r, [], None).nodes
    assert (n4.state, n4.health) == ("up", "degraded")
    assert n4.problems == ["its exporter has no fresh sample"]


def test_a_quarantine_policy_s_drain_is_a_quarantine() -> None:
    assert hold("migrate", "node=n1", policy="quarantine-on-lost-gpu").what == "quarantined"
    assert hold("migrate", "node=n1").what == "drained"
    assert hold("lend", "pool=a").what == "lending"
    assert hold("restore_clocks", "uuid=x").what == "restore clocks"


def test_the_nodes_that_need_attention() -> None:
    r = readings(
        node("ok"),
        node("down", up=0),
        node("held"),
        gpu("ok", "GPU-o", 0.5),
        gpu("held", "GPU-h", 0.5),
    )
    out = fleet(r, [Held({"uuid": "GPU-h"}, hold("downclock", "uuid=GPU-h"))], None)
    assert {n.name: n.attention for n in out.nodes} == {"down": True, "held": True, "ok": False}


def test_gpus_in_index_order() -> None:
    order = (("z", 2), ("a", 10), ("m", 0), ("b", 1))
    parts = [gpu("n1", f"GPU-{u}{i}", 0.5, index=str(i)) for u, i in order]
    r = readings(node("n1"), *parts)
    (n1,) = fleet(r, [], None).nodes
    assert [g.uuid for g in n1.gpus] == ["GPU-m0", "GPU-b1", "GPU-z2", "GPU-a10"]


def test_a_node_the_fleet_powered_down_is_powered_down_not_no_data() -> None:
    """The scrape stopped when the machine was switched off: its last samples are stale, and
    the fleet's ``gpuops_node_powered_down`` says why; its GPUs keep no values."""
    gone = NOW - 600
    r = readings(
        {"up_seen": [s(gone, node="n2", pool="default")]},
        gpu("n2", "GPU-b0", 0.9, seen=gone),
        {"powered_down": [s(1, node="n2", pool="default")]},
        node("n1"),
    )
    n2 = only(fleet(r, [], None).nodes, "n2")
    assert (n2.state, n2.state_source) == ("powered_down", "gpuops_node_powered_down")
    assert n2.health == "ok" and n2.problems == [] and n2.stale
    assert n2.pool == "default"
    [g] = n2.gpus
    assert g.stale and g.utilization is None  # its old values are not shown as now
    # without the fleet's flag, the same node is one that stopped answering
    r = readings({"up_seen": [s(gone, node="n2")]}, gpu("n2", "GPU-b0", 0.9, seen=gone))
    n2 = only(fleet(r, [], None).nodes, "n2")
    assert (n2.state, n2.health) == ("unknown", "no_data")


def test_a_fresh_scrape_wins_over_a_powered_down_flag() -> None:
    r = readings(node("n1"), {"powered_down": [s(1, node="n1", pool="default")]})
    assert only(fleet(r, [], None).nodes, "n1").state == "up"
