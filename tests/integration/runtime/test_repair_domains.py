"""Paced repair by failure domain on a real engine and API: the node agents send their node's
rack with each event, and repairs are paced per rack (a fault in one rack never waits behind
another's); with ``max_fraction``, a rack whose nodes out of service for any reason are at
its bound holds the next repair and says why, and an answer about them that is stale or
failed holds it too (fresh data only); the nodes gpuops quarantined never hold each other's
repair: a flood past the bound is repaired at the domain's width."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from gpuops.model.decisions import Sample, freeze
from gpuops.model.health.ladder import Stage
from gpuops.sources import QueryError
from tests.fakes.prometheus import FakeSource
from tests.integration.api.harness import Harness, running_api
from tests.integration.api.test_health_events import event, push
from tests.integration.runtime.test_health_ladder import LADDER_RULES, faults, health, settled

pytestmark = pytest.mark.integration

UNAVAILABLE = "max by (node, pool, rack) (gpuops_node_out_of_service)"
SELECTOR = "gpuops_node_out_of_service{}"
"""The input series of ``UNAVAILABLE`` as the stale-series probe is asked of it."""


def ladder(**pacing: Any) -> dict[str, Any]:
    logged = {"executor": "log"}
    return {
        "default_profile": "full",
        "ladder": {
            "reset_gpu": logged,
            "reboot": logged,
            "validation": {"command": ["true"], "executor": "log"},
            "interval": 3600,
            "pacing": pacing,
        },
    }


def fault(api: Harness, node: str, rack: str, pool: str = "a") -> dict[str, Any]:
    return {**event(api, f"{node}-1", node, "GPU-0", 48), "pool": pool, "labels": {"rack": rack}}


def stage(api: Harness, node: str) -> Stage | None:
    repair = api.engine.ladder.repair(node)
    return None if repair is None else repair.stage


def why(api: Harness, node: str) -> str:
    repair = api.engine.ladder.repair(node)
    assert repair is not None
    return repair.why


def look_again(api: Harness, later: float) -> None:
    """``later`` seconds on (past the reuse of the answer on nodes out of service), the
    ladder's next look."""
    api.clock.advance(later)
    api.engine.ladder.tick()
    api.settle()


def test_faults_in_two_racks_of_one_pool_are_paced_per_rack(tmp_path: Path) -> None:
    with running_api(tmp_path, rules=LADDER_RULES, health=ladder(domains=["rack"])) as api:
        faults = [fault(api, f"r1n{i}", "r1") for i in range(3)]
        faults += [fault(api, f"r2n{i}", "r2") for i in range(3)]
        assert push(api, *faults).json()["faults"] == 6
        api.settle()
        returned = {r.node[:2] for r in api.engine.ladder.repairs() if r.stage is Stage.RETURNED}
        assert returned == {"r1", "r2"}  # one repair in each rack at once
        waiting = [r for r in api.engine.ladder.repairs() if r.stage is Stage.QUARANTINED]
        assert (
            sorted(r.why.split(":")[1] for r in waiting)
            == [" paced repair in rack=r1"] * 2 + [" paced repair in rack=r2"] * 2
        )
        assert all(r.labels == {"rack": r.node[:2]} for r in waiting)  # kept on the record
        nodes = api.call("developer", "GET", "/api/v1/health/nodes").json()
        assert {n["node"]: n["domains"] for n in nodes}["r2n1"] == ["rack=r2"]
        metrics = api.call(None, "GET", "/metrics").text
        assert 'gpuops_health_ladder_deferrals_total{domain="rack=r1"} 2.0' in metrics
        assert 'gpuops_health_ladder_deferrals_total{domain="rack=r2"} 2.0' in metrics
        assert 'domain="pool=a"' not in metrics  # the pool is no domain here


def test_a_failed_repair_cools_down_every_domain_of_its_node(tmp_path: Path) -> None:
    faults(tmp_path, x1="never", x2="reset", x3="reset", x4="reset")
    settings = health(tmp_path)
    settings["ladder"]["pacing"] = {"domains": ["pool", "rack"]}
    with running_api(tmp_path, rules=LADDER_RULES, health=settings) as api:
        assert push(api, fault(api, "x1", "r1")).json()["faults"] == 1
        settled(api, "x1", Stage.NEEDS_HUMAN)  # nothing heals it: a failed repair
        assert push(api, fault(api, "x2", "r2"), fault(api, "x3", "r1", pool="b")).json() == {
            "accepted": 2,
            "duplicates": 0,
            "faults": 2,
            "skipped": 0,
        }
        api.settle()
        assert why(api, "x2").startswith("deferred: paced repair in pool=a: cooling down")
        assert why(api, "x3").startswith("deferred: paced repair in rack=r1: cooling down")
        assert push(api, fault(api, "x4", "r3", pool="c")).json()["faults"] == 1
        settled(api, "x4", Stage.RETURNED)  # neither pool=a nor rack=r1: at once
        look_again(api, 120)  # past the cooldown (1 min after one failure, jittered)
        for node in ("x2", "x3"):
            settled(api, node, Stage.RETURNED)


class Scheduler(FakeSource):
    """Answers ``UNAVAILABLE`` with a fleet of two racks of 8 nodes in pool ``a``: the nodes
    in ``out`` out of service; ``stale``: the input series Prometheus last heard of long ago;
    ``error``: the query fails."""

    def __init__(self) -> None:
        self.out: set[str] = set()
        self.stale = False
        self.error: str | None = None
        self.asked = 0

    def query(self, expr: str, at: float | None = None) -> tuple[Sample, ...]:
        assert expr == UNAVAILABLE, expr
        self.asked += 1
        if self.error is not None:
            raise QueryError(self.error)
        return tuple(
            Sample(freeze({"node": n, "pool": "a", "rack": n[:2]}), float(n in self.out), at or 0)
            for n in [f"r{r}n{i}" for r in (1, 2) for i in range(8)]
        )

    def stale_series(
        self, inputs: Iterable[str], bound_s: float, at: float | None = None
    ) -> dict[str, tuple[Sample, ...]]:
        assert list(inputs) == [SELECTOR]
        if not self.stale:
            return {}
        old = Sample(freeze({"__name__": "gpuops_node_out_of_service", "node": "r1n3"}), 0, 0)
        return {SELECTOR: (old,)}


def test_a_rack_at_its_unavailability_bound_holds_the_next_repair_and_says_why(
    tmp_path: Path,
) -> None:
    scheduler = Scheduler()
    health = ladder(domains=["pool", "rack"], max_fraction=0.25, unavailable=UNAVAILABLE)
    with running_api(tmp_path, rules=LADDER_RULES, health=health, source=scheduler) as api:
        scheduler.out = {"r1n0", "r1n5", "r1n6", "r1n7"}  # r1n5-7 drained by someone else
        assert push(api, fault(api, "r1n0", "r1")).json()["faults"] == 1
        api.settle()
        assert stage(api, "r1n0") is Stage.QUARANTINED
        assert why(api, "r1n0") == (
            "deferred: paced repair in rack=r1: 3 other node(s) of 8 out of service (r1n5,"
            " r1n6, r1n7), past its bound of 2 (max_fraction 0.25)"
        )
        scheduler.out = {"r1n0", "r1n5", "r1n7"}  # r1n6 is back: the others are at the bound
        look_again(api, 10)
        assert stage(api, "r1n0") is Stage.RETURNED
        metrics = api.call(None, "GET", "/metrics").text
        assert 'gpuops_health_ladder_deferrals_total{domain="rack=r1"} 1.0' in metrics

        look_again(api, 300)  # r1n0's repair held: the pool's width is 2
        scheduler.stale = True  # the scheduler's view stopped coming: it holds the repair
        assert push(api, fault(api, "r2n0", "r2")).json()["faults"] == 1
        api.settle()
        assert stage(api, "r2n0") is Stage.QUARANTINED
        assert why(api, "r2n0") == (
            "deferred: paced repair in pool=a: its nodes out of service are not known (1 series"
            " of gpuops_node_out_of_service{} older than 120s ({__name__='gpuops_node_out_of_"
            "service', node='r1n3'})): it waits for a fresh answer"
        )
        scheduler.stale, scheduler.error = False, "connection refused"
        look_again(api, 10)
        assert why(api, "r2n0") == (
            "deferred: paced repair in pool=a: its nodes out of service are not known (the"
            " query failed: connection refused): it waits for a fresh answer"
        )
        scheduler.error = None
        look_again(api, 10)
        assert stage(api, "r2n0") is Stage.RETURNED


def test_a_flood_past_the_bound_is_repaired_at_the_width_of_its_domains(tmp_path: Path) -> None:
    scheduler = Scheduler()
    health = ladder(domains=["pool", "rack"], max_fraction=0.25, unavailable=UNAVAILABLE)
    flood = [f"r1n{i}" for i in range(5)]  # 5 of the rack's 8 nodes: its bound is 2

    def returned() -> list[str]:
        return [n for n in flood if stage(api, n) is Stage.RETURNED]

    with running_api(tmp_path, rules=LADDER_RULES, health=health, source=scheduler) as api:
        scheduler.out = set(flood)  # every one drained by its quarantine
        assert push(api, *(fault(api, n, "r1") for n in flood)).json()["faults"] == 5
        api.settle()  # (a node that looked before the others reached the ladder saw them out)
        look_again(api, 10)  # the next interval, every quarantine on the ladder
        assert len(returned()) == 1  # width 1: one repair at once
        waiting = [api.engine.ladder.repair(n) for n in flood if n not in returned()]
        assert all(
            r is not None and r.why.startswith("deferred: paced repair in pool=a: 1 unproven")
            for r in waiting
        )
        widths = [1]
        while len(returned()) < len(flood):
            scheduler.out = set(flood) - set(returned())
            before = len(returned())
            look_again(api, 300)  # the repairs held for the dwell: the width grows
            widths.append(len(returned()) - before)
        assert widths == [1, 2, 2]  # width 1, then 2, then 4 (two were left)
