"""The console's decisions in words, in a real browser: the list's action, state and effect
columns and one decision's page in each state (waiting for approval, held, dry run, running,
done, no effect, failed, undone), a decision beside its undo, the Retry button of a failed
action, the policy's summary, the value and the expression as lines. Screenshots
``decisions`` and ``decision`` (docs/console/).

A real simulated fleet (``gpuops.sim.fleet``) takes the ``fleet`` executor's actions; the
policies' queries are answered by a scripted Prometheus and evaluated when the test says.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from playwright.sync_api import Locator, Page, expect

from gpuops.model.decisions import Decision
from gpuops.sim.fleet import FleetConfig, FleetSim
from tests.browser.conftest import shot, sign_in
from tests.fakes.prometheus import FakePrometheus
from tests.integration.api.harness import Harness, running_api
from tests.waiting import wait_for

IDLE = (
    "max_over_time(nvml_gpu_utilization_ratio[30m]) < 0.20\n"
    "  and on (uuid) gpuops_gpu_allocated == 1"
)

RULES = """\
groups:
  - name: words
    interval: 1h
    rules:
      - policy: cap-idle-gpus
        description: A GPU idle while allocated for 30 minutes runs at 1100 MHz until it is used.
        expr: |
          max_over_time(nvml_gpu_utilization_ratio[30m]) < 0.20
            and on (uuid) gpuops_gpu_allocated == 1
        target: [uuid]
        action: {type: downclock, executor: fleet, params: {max_clock_mhz: 1100}}
        on_clear: {type: restore_clocks, executor: fleet}
        limits: {max_per_hour: 1}
        mode: enforce
        annotations:
          summary: "GPU {{ $labels.uuid }} idle while allocated: capping its clocks"
      - policy: migrate-off-down-nodes
        expr: node_down
        target: [node]
        action: {type: migrate, executor: fleet}
        mode: enforce
      - policy: scale-out-early
        expr: queue_long
        target: [pool]
        action: {type: scale_out, executor: fleet, params: {nodes: 1}}
      - policy: drain-by-script
        expr: slow
        target: [node]
        action:
          type: migrate
          executor: command
          params: {argv: [sh, -c, "while [ ! -e release ]; do sleep 0.1; done"]}
        mode: enforce
      - policy: reclaim-with-approval
        trigger: {alertmanager: {alertname: GPUIdle}}
        target: [node, uuid]
        action: {type: reclaim, executor: log}
        mode: enforce
        approval: required
"""


class Story:
    """The decisions of every state, made once for the module's tests."""

    def __init__(self, console: Harness, prom: FakePrometheus, fleet: FleetSim) -> None:
        self.console = console
        self.prom = prom
        self.fleet = fleet
        self.ids: dict[str, str] = {}

    def evaluate(self, policy: str) -> list[Decision]:
        found = self.console.engine.rules.policy(policy)
        assert found is not None
        decisions = self.console.engine.evaluate_policy(found)
        self.console.engine.wait_idle(30)
        return decisions

    def one(self, policy: str, **labels: str) -> str:
        """The id of ``policy``'s newest stored decision on the target with ``labels``."""
        for stored in self.console.engine.store.decisions(policy, None, 100):
            if all(stored.decision.target.labels.get(k) == v for k, v in labels.items()):
                return stored.decision.id
        raise AssertionError(f"no decision of {policy} on {labels}")


def gpus(fleet: FleetSim) -> list[dict[str, Any]]:
    state = requests.get(f"{fleet.control_url}/api/v1/state", timeout=5).json()
    return [g for n in state["nodes"] for g in n["gpus"]]


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    tmp = tmp_path_factory.mktemp("decisions")
    prom = FakePrometheus()
    fleet = FleetSim(FleetConfig(arrival_rate_per_min=0.0, sd_file=f"{tmp}/gpu-nodes.json"))
    with fleet:
        executors = {"fleet": {"url": fleet.control_url}, "command": {"cwd": str(tmp)}}
        with running_api(tmp / "api", rules=RULES, executors=executors, source=prom) as console:
            s = Story(console, prom, fleet)
            make_every_state(s, tmp)
            yield s
            (tmp / "release").touch()  # the running action ends


@pytest.fixture(scope="module")
def console(story: Story) -> Harness:
    return story.console


def make_every_state(s: Story, tmp: Path) -> None:
    first, second = (g["uuid"] for g in gpus(s.fleet)[:2])
    # done, then undone: the first GPU capped, then its cap removed once it is busy again;
    # the second GPU held by max_per_hour (1)
    s.prom.results[IDLE] = [{"uuid": first}]
    s.evaluate("cap-idle-gpus")
    s.ids["undone"] = s.one("cap-idle-gpus", uuid=first)
    s.prom.results[IDLE] = [{"uuid": second}]
    s.console.clock.now += 60
    s.evaluate("cap-idle-gpus")
    s.ids["held"] = s.one("cap-idle-gpus", uuid=second)
    s.console.clock.now += 60
    s.evaluate("cap-idle-gpus")  # the first GPU cleared: its undo runs
    s.ids["undo"] = s.one("cap-idle-gpus", uuid=first)
    # no effect: every GPU is busy, so node-1's jobs wait in the queue; failed: no such node
    s.prom.results["node_down"] = [{"node": "node-1"}, {"node": "node-99"}]
    s.evaluate("migrate-off-down-nodes")
    s.ids["no effect"] = s.one("migrate-off-down-nodes", node="node-1")
    s.ids["failed"] = s.one("migrate-off-down-nodes", node="node-99")
    s.prom.results["queue_long"] = [{"pool": "default"}]
    s.evaluate("scale-out-early")
    s.ids["dry run"] = s.one("scale-out-early", pool="default")
    assert s.console.notify(s.console.alert("GPUIdle", node="node-2", uuid="GPU-w")).ok
    s.console.settle()
    s.ids["waiting for approval"] = s.one("reclaim-with-approval", node="node-2")
    s.prom.results["slow"] = [{"node": "node-3"}]
    policy = s.console.engine.rules.policy("drain-by-script")
    assert policy is not None
    threading.Thread(target=s.console.engine.evaluate_policy, args=(policy,), daemon=True).start()
    wait_for(lambda: s.console.engine.gate.in_flight() == 1, 30, "the script to run")
    s.ids["running"] = s.one("drain-by-script", node="node-3")


EXPECTED = {
    "undone": ("downclock", r"clocks of GPU-\S+ on node-0 capped at 1100 MHz, were not capped"),
    "undo": ("undo: restore_clocks", r"clock cap of GPU-\S+ on node-0 removed \(was 1100 MHz\)"),
    "held": ("downclock", r"^—$"),
    "no effect": ("migrate", r"node-1 drained; job-\d+ requeued: no free node; no job moved"),
    "failed": ("migrate", r"node-99"),
    "dry run": ("scale_out", r"^—$"),
    "waiting for approval": ("reclaim", r"^—$"),
    "running": ("migrate", r"^—$"),
}
"""Each decision's action and effect cells in the list (its state is its key, but for the
undo, which is done)."""


def test_the_list_shows_each_decision_s_action_state_and_effect(page: Page, story: Story) -> None:
    sign_in(page, story.console, "auditor", "/decisions")
    expect(page.locator("caption")).to_have_text(re.compile(r"^\d+ decisions, newest first$"))
    for name, (action, told) in EXPECTED.items():
        row = row_of(page, story.ids[name])
        expect(row.locator("td.action")).to_have_text(re.compile("^" + re.escape(action)))
        expect(row.locator("td.state")).to_have_text(
            re.compile("^" + ("done" if name == "undo" else name))
        )
        expect(row.locator("td.effect")).to_have_text(re.compile(told))
    undone = row_of(page, story.ids["undone"])
    expect(undone.get_by_role("link", name="its undo")).to_have_attribute(
        "href", f"/decisions/{story.ids['undo']}"
    )
    page.goto("/decisions?policy=cap-idle-gpus&transition=fire")  # its undo filtered out
    expect(row_of(page, story.ids["undone"]).locator("td.state")).to_have_text(
        re.compile("^undone")
    )
    page.goto("/decisions")
    body = page.locator("tbody").inner_text()
    for raw in ("[]", "None", "{", "attempts"):
        assert raw not in body, raw
    shot(page, "decisions")


def row_of(page: Page, decision_id: str) -> Locator:
    """The list's row of ``decision_id`` (its time links to it)."""
    return page.locator(
        "tbody tr", has=page.locator(f'td:first-child a[href="/decisions/{decision_id}"]')
    )


STATES = {
    "waiting for approval": "waiting for approval: nothing runs until an admin grants it",
    "held": "held: held back by a guardrail, not run",
    "dry run": "dry run: recorded, never run",
    "running": "running: its action runs now",
}


def test_each_state_reads_true_on_its_decision_page(page: Page, story: Story) -> None:
    sign_in(page, story.console, "auditor", "/")
    for name, said in STATES.items():
        page.goto(f"/decisions/{story.ids[name]}")
        expect(page.locator("#state")).to_have_text(f"State: {name}")
        expect(page.locator("#outcome")).to_have_text(said)
        expect(page.locator("body")).not_to_contain_text("done after")
    page.goto(f"/decisions/{story.ids['no effect']}")
    expect(page.locator("#state")).to_have_text("State: no effect")
    expect(page.locator("#outcome")).to_contain_text("no effect after 1 attempt: node-1 drained")
    expect(page.locator("#effect li")).to_have_text(
        [
            re.compile("^node-1 drained$"),
            re.compile(r"^job-\d+ requeued: no free node$"),
            "no job moved",
        ]
    )
    page.goto(f"/decisions/{story.ids['failed']}")
    expect(page.locator("#state")).to_have_text("State: failed")
    expect(page.locator("#outcome")).to_contain_text("failed for good after 1 attempt:")
    expect(page.locator(".note", has_text="Retrying needs")).to_be_visible()  # an auditor


def test_a_decision_and_its_undo_are_told_together(page: Page, story: Story) -> None:
    sign_in(page, story.console, "auditor", f"/decisions/{story.ids['undone']}")
    expect(page.locator("#summary")).to_have_text(
        re.compile(r"^GPU GPU-\S+ idle while allocated: capping its clocks$")
    )
    expect(page.locator("#description")).to_have_text(
        "A GPU idle while allocated for 30 minutes runs at 1100 MHz until it is used."
    )
    expect(page.locator("#state")).to_have_text("State: undone")
    expect(page.locator("#value")).to_contain_text("10%")
    expect(page.locator("#expr")).to_have_text(IDLE)  # lines, not a literal \n
    expect(page.locator("#outcome")).to_contain_text("done after 1 attempt:")
    expect(page.locator("#effect li")).to_have_text(
        [re.compile(r"^clocks of GPU-\S+ on node-0 capped at 1100 MHz, were not capped$")]
    )
    expect(page.locator("#undo")).to_contain_text("Undone by undo: restore_clocks at")
    expect(page.locator("#undo")).to_contain_text("done — clock cap of GPU-")
    words = page.locator("section", has=page.get_by_role("heading", name="In words"))
    expect(words).not_to_contain_text("\\n")
    expect(words).to_contain_text(f"undone by decision {story.ids['undo']}: done")
    shot(page, "decision")
    page.locator("#undo a").click()
    expect(page.locator("#undo")).to_contain_text("Undoes downclock at")


def test_an_admin_retries_a_failed_action(page: Page, story: Story) -> None:
    sign_in(page, story.console, "admin", f"/decisions/{story.ids['failed']}")
    page.get_by_role("button", name="Retry").click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Retry accepted")
    expect(page.locator("main")).to_contain_text(
        "migrate-off-down-nodes decides node=node-99 again"
    )
    page.goto(f"/decisions/{story.ids['failed']}")
    expect(page.get_by_role("button", name="Retry")).to_have_count(0)  # retried once
