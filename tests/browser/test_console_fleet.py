"""The Fleet page and the Timeline in a real browser, over a real Prometheus: every node state
(up, down, draining, drained, powered down, booting, and no data since its last sample), GPU
health, the job holding a GPU, what gpuops holds (with the decision and its undo), the queue,
the pool filter, the refresh interval, and the timeline's charts and decisions. Screenshots
``fleet.png`` and ``timeline.png`` (``var/console-screenshots/``).

The series come from a small HTTP server that serves, per node, what the NVML exporter serves
and, for the cluster, what the Slurm exporter and the fleet serve (docs/reference/metrics.md);
Prometheus scrapes it as ``deploy/prometheus/cluster.yml`` scrapes the real ones (one
``gpu-nodes`` target per node, ``node`` and ``pool`` from the target).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import yaml
from playwright.sync_api import Page, expect

from gpuops.api.fleetview import LOOKBACK
from gpuops.sources.promproc import PrometheusServer
from tests.browser.conftest import shot, sign_in
from tests.integration.api.harness import Harness, running_api
from tests.waiting import wait_for

RULES = """\
groups:
  - name: fleet-page
    interval: 1h
    rules:
      - policy: drain-down-nodes
        expr: up{job="gpu-nodes"} == 0
        target: [node]
        action: {type: migrate, executor: log}
        on_clear: {type: resume, executor: log}
        mode: enforce
      - policy: downclock-hot-gpus
        expr: nvml_gpu_temperature_celsius > 85
        target: [node, uuid]
        action: {type: downclock, executor: log, params: {max_clock_mhz: 1100}}
        on_clear: {type: restore_clocks, executor: log}
        mode: enforce
      - policy: reclaim-idle-gpus
        expr: nvml_gpu_utilization_ratio < 0.05
        target: [node, uuid]
        action: {type: reclaim, executor: log}
"""


def gpu(index: int, uuid: str, util: float, temp: float, **extra: float) -> str:
    labels = f'gpu="{index}",uuid="{uuid}"'
    lines = [
        f"nvml_gpu_up{{{labels}}} 1",
        f"nvml_gpu_utilization_ratio{{{labels}}} {util}",
        f"nvml_gpu_temperature_celsius{{{labels}}} {temp}",
    ]
    lines += [f"{name}{{{labels}}} {value}" for name, value in extra.items()]
    return "\n".join(lines) + "\n"


NODES: dict[str, tuple[str, str | None]] = {
    # node: (pool, what its exporter serves; None: the scrape fails)
    "node-1": ("a100", gpu(0, "GPU-1a", 0.92, 64) + gpu(1, "GPU-1b", 0.71, 91)),
    "node-2": ("a100", None),
    "node-3": ("a100", gpu(0, "GPU-3a", 0.02, 40, nvml_gpu_remapped_rows_failed=1)),
    "node-5": ("h100", ""),
    "node-6": ("h100", gpu(0, "GPU-6a", 0.0, 35)),
    "node-8": ("h100", gpu(0, "GPU-8a", 0.4, 50)),
    "node-7": ("h100", gpu(0, "GPU-7a", 0.5, 50)),  # last: its target is removed
}
CLUSTER = """\
gpuops_slurm_up 1
gpuops_slurm_node_state{node="node-1",state="allocated"} 1
gpuops_slurm_node_state{node="node-3",state="draining"} 1
gpuops_slurm_node_state{node="node-4",state="powered_down"} 1
gpuops_slurm_node_state{node="node-5",state="powering_up"} 1
gpuops_slurm_node_state{node="node-6",state="drained"} 1
gpuops_slurm_node_state{node="node-8",state="idle"} 1
gpuops_gpu_allocated{node="node-1",uuid="GPU-1a",job="job-17",project="vision"} 1
gpuops_gpu_allocated{node="node-1",uuid="GPU-1b",job="job-18",project="nlp"} 1
gpuops_gpu_allocated{node="node-3",uuid="GPU-3a",job="job-20",project="vision"} 1
gpuops_queue_pending_jobs{pool="a100",reason="Resources"} 35
gpuops_queue_pending_jobs{pool="a100",reason="JobHeldAdmin"} 2
gpuops_queue_pending_jobs{pool="h100",reason=""} 0
"""


class Exporters(BaseHTTPRequestHandler):
    """``/<node>``: a node's NVML exporter; ``/cluster``: the Slurm exporter and the fleet."""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        name = self.path.strip("/")
        body = CLUSTER if name == "cluster" else NODES.get(name, ("", None))[1]
        if body is None:
            self.send_error(500, "the node does not answer")
            return
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def prometheus_config(port: int, nodes: list[str]) -> str:
    target = f"127.0.0.1:{port}"
    groups = [
        {
            "targets": [target],
            "labels": {"__metrics_path__": f"/{n}", "node": n, "pool": NODES[n][0]},
        }
        for n in nodes
    ]
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [
            {"job_name": "gpu-nodes", "static_configs": groups},
            {
                "job_name": "cluster",
                "honor_labels": True,
                "metrics_path": "/cluster",
                "static_configs": [{"targets": [target]}],
            },
        ],
    }
    return yaml.safe_dump(config)


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """This module's engine and console (the browser's ``context`` opens it), reading a
    Prometheus that scrapes the exporters above."""
    workdir = tmp_path_factory.mktemp("fleet-console")
    server = ThreadingHTTPServer(("127.0.0.1", 0), Exporters)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with (
            PrometheusServer(
                workdir / "prom", prometheus_config(server.server_port, list(NODES))
            ) as prom,
            running_api(workdir / "engine", rules=RULES, prometheus=prom.url) as harness,
        ):
            wait_for(
                lambda: (
                    len(harness.engine.prometheus.query('up{job="gpu-nodes"}')) == len(NODES)
                    and harness.engine.prometheus.query("gpuops_queue_pending_jobs")
                ),
                timeout=30,
                what="every target scraped",
            )
            harness.clock.now = time.time()
            for policy in harness.engine.rules.policies():
                harness.engine.evaluate_policy(policy, harness.clock.now)
            harness.settle()
            # node-7's exporter goes away (once the look back has seen it): its samples age
            # into "no data since"
            wait_for(
                lambda: harness.engine.prometheus.query(
                    f'max_over_time(timestamp(up{{node="node-7"}})[{LOOKBACK}])'
                ),
                timeout=30,
                what="node-7 in the look back",
            )
            prom.config_path.write_text(prometheus_config(server.server_port, list(NODES)[:-1]))
            prom.reload()
            wait_for(
                lambda: not harness.engine.prometheus.query('up{node="node-7"}'),
                timeout=30,
                what="node-7 no longer scraped",
            )
            yield harness
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def signed_in(page: Page, console: Harness) -> Harness:
    harness = console
    harness.clock.now = time.time()  # the pages ask Prometheus at the engine's clock
    sign_in(page, harness, "developer", "/fleet")
    return harness


def node(page: Page, name: str) -> Any:
    return page.locator(f"#node-{name}")


def test_the_fleet_page_shows_every_state_health_job_and_hold(
    page: Page, signed_in: Harness
) -> None:
    expect(page.get_by_role("heading", name="Fleet", exact=True)).to_be_visible()
    expected = {
        "node-1": "up",
        "node-2": "down",
        "node-3": "draining",
        "node-4": "powered down",
        "node-5": "booting",
        "node-6": "drained",
        "node-7": "unknown",
        "node-8": "up",
    }
    for name, state in expected.items():
        expect(node(page, name).locator("h3 .state")).to_have_text(state)
    expect(node(page, "node-2").locator("h3")).to_contain_text("failed")
    expect(node(page, "node-4").locator("h3")).to_contain_text("ok")  # no exporter expected
    expect(node(page, "node-3").locator("h3")).to_contain_text("failed")  # its GPU's remap
    expect(node(page, "node-3")).to_contain_text("a memory row remapping failed: replace the GPU")
    stale = node(page, "node-7")
    expect(stale.locator("h3")).to_contain_text("no data")
    expect(stale).to_contain_text(re.compile(r"no data since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"))
    expect(stale.locator("#gpu-GPU-7a")).not_to_contain_text("50%")  # an old reading is not shown

    hot = node(page, "node-1").locator("#gpu-GPU-1b")
    expect(hot).to_contain_text("job-18 (nlp)")
    expect(hot).to_contain_text("71%")
    expect(hot).to_contain_text("downclocked")
    expect(hot).to_contain_text("undone by restore_clocks when the condition clears")
    link = hot.get_by_role("link", name="downclock-hot-gpus")
    decision_id = link.get_attribute("href").rsplit("/", 1)[1]  # type: ignore[union-attr]
    stored = signed_in.engine.store.decision(decision_id)
    assert stored is not None and stored.decision.target.labels["uuid"] == "GPU-1b"

    drained = node(page, "node-2").locator("ul.holds")
    expect(drained).to_contain_text("drained by drain-down-nodes")
    expect(drained).to_contain_text("undone by resume")
    idle = node(page, "node-6").locator("#gpu-GPU-6a")
    expect(idle).to_contain_text("reclaimed (dry-run: not done)")
    expect(idle).to_contain_text("free")

    expect(page.locator("#queue-length")).to_have_text("37")
    expect(page.locator("#queue")).to_contain_text("Resources: 35")
    shot(page, "fleet")

    page.get_by_label("Pool", exact=True).select_option("h100")
    page.get_by_label("Refresh every", exact=True).select_option("10")
    page.get_by_role("button", name="Apply").click()
    expect(page).to_have_url(re.compile(r"/fleet\?pool=h100&show=all&refresh=10$"))
    expect(page.locator("article.node")).to_have_count(4)  # node-5, 6, 7, 8
    expect(page.locator("#queue-length")).to_have_text("0")
    assert page.locator('meta[http-equiv="refresh"]').get_attribute("content") == "10"


def test_a_node_links_to_the_decisions_about_it(page: Page, signed_in: Harness) -> None:
    node(page, "node-2").get_by_role("link", name="Decisions about node-2").click()
    expect(page).to_have_url(re.compile(r"/decisions\?target=node%3Dnode-2$"))
    expect(page.locator("main table")).to_contain_text("drain-down-nodes")
    expect(page.locator("main table")).not_to_contain_text("downclock-hot-gpus")


def test_a_refresh_interval_not_offered_is_refused_by_name(page: Page, signed_in: Harness) -> None:
    page.goto("/fleet?refresh=5")
    expect(page.locator("main")).to_contain_text("refresh: 5 is not one of 0, 10, 30, 60 (seconds)")
    page.goto("/fleet")
    assert page.locator('meta[http-equiv="refresh"]').count() == 0


def test_the_timeline_charts_utilization_and_queue_with_the_decisions(
    page: Page, signed_in: Harness
) -> None:
    page.goto("/timeline?range=15m&refresh=30")
    charts = page.locator("svg.chart")
    expect(charts).to_have_count(2)
    expect(page.locator("figure").first).to_contain_text("a100")
    for i in range(2):  # both draw their data (a line, or a dot while a series has one step)
        assert charts.nth(i).locator("polyline, circle").count() >= 2, i  # a100 and h100
    assert page.locator('meta[http-equiv="refresh"]').get_attribute("content") == "30"
    rows = page.locator("#events tbody tr")
    expect(rows).to_have_count(4)  # node-2 drained, GPU-1b downclocked, two idle GPUs (dry-run)
    hot = rows.filter(has_text="downclock-hot-gpus")
    expect(hot.locator("td").nth(4)).to_have_text("done")
    expect(rows.filter(has_text="reclaim-idle-gpus").first.locator("td").nth(4)).to_have_text(
        "dry run"
    )
    marker = charts.first.locator("a.mark-success").first
    href = marker.get_attribute("href")
    assert href is not None and href.startswith("/decisions/")
    shot(page, "timeline")
    page.goto(href)
    expect(page).to_have_url(re.compile(re.escape(href) + "$"))


def test_only_the_nodes_that_need_attention(page: Page, signed_in: Harness) -> None:
    page.get_by_label("Show", exact=True).select_option("attention")
    page.get_by_role("button", name="Apply").click()
    expect(page).to_have_url(re.compile(r"show=attention"))
    expect(page.locator("#nodes-h")).to_contain_text("(7 of 8)")
    shown = {a.get_attribute("id") for a in page.locator("article.node").all()}
    # node-1 is up and healthy, but gpuops downclocked one of its GPUs; node-8, up, healthy
    # and held by nothing, is the one left out
    assert shown == {f"node-node-{i}" for i in (1, 2, 3, 4, 5, 6, 7)}
