"""The Slurm exporter's collector: queue per partition, node states and which job holds which
GPU, read from slurmctld on each scrape (``gpuops.integrations.slurm.client``). Served by
``gpuops.exporters.slurm.server``.

Names follow prometheus-slurm-exporter where they overlap (``slurm_queue_pending``,
``slurm_nodes_idle``, ``slurm_gpus_alloc``, ...); ``gpuops_queue_pending_jobs{pool, reason}``
(pool = partition, reason = Slurm's pending reason) feeds the shipped scale-out policy
unchanged, which leaves held jobs (``JobHeld*``) out as it does on the simulated fleet.
Which job holds which GPU is
``gpuops_slurm_gpu_allocated{node, minor_number, job, user, account, project, partition}``:
Slurm's GRES index is the device order of gres.conf (``/dev/nvidiaN``), so it is reported as
the device minor number, which the NVML exporter puts on ``nvml_gpu_info``; the recording rule
in ``deploy/prometheus/slurm/gpuops-slurm.rules.yml`` joins the two into
``gpuops_gpu_allocated{uuid, ...}``. When slurmctld does not answer, ``gpuops_slurm_up`` is 0
and no Slurm series is exported at all: an absent series, never a 0 that reads as "no jobs".
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from gpuops.integrations.slurm.client import (
    SlurmClient,
    SlurmError,
    expand_gres_index,
    gres_gpus,
    job_gpus_requested,
    job_nodes,
)
from gpuops.integrations.slurm.nodes import node_state

log = logging.getLogger(__name__)

SCALED_OUT_MARK = "gpuops:scale_out:"
"""How the slurm executor's ``scale_out`` marks a node it powers up (its node comment, with the
default ``reason_prefix``); its ``scale_in`` powers down only nodes so marked."""

COMPAT_NODE_STATES = ("alloc", "idle", "mix", "drain", "down")
"""prometheus-slurm-exporter's ``slurm_nodes_<state>`` gauges that gpuops exports too."""


def _compat(state: str) -> str | None:
    return {
        "allocated": "alloc",
        "idle": "idle",
        "mixed": "mix",
        "drained": "drain",
        "draining": "drain",
        "down": "down",
    }.get(state)


class SlurmCollector:
    """A ``prometheus_client`` custom collector; every scrape asks slurmctld afresh."""

    def __init__(
        self, client: SlurmClient, gres_minors: Mapping[str, list[int]] | None = None
    ) -> None:
        self.client = client
        self.gres_minors = dict(gres_minors or {})
        """Per node, the device minor number of each GRES index (from gres.conf); a node not
        listed has minor number = index (``File=/dev/nvidia[0-N]``)."""
        self.failures = 0

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        up = GaugeMetricFamily(
            "gpuops_slurm_up", "1 when slurmctld answered this scrape, 0 when it did not."
        )
        try:
            nodes = self.client.nodes()
            jobs = self.client.jobs()
            families = list(self._families(nodes, jobs))
        except SlurmError as exc:
            self.failures += 1
            log.warning("Slurm unreachable: %s", exc)
            families = []
            up.add_metric([], 0.0)
        else:
            up.add_metric([], 1.0)
        yield up
        yield from families
        errors = GaugeMetricFamily(
            "gpuops_slurm_scrape_failures", "Scrapes since start that Slurm did not answer."
        )
        errors.add_metric([], float(self.failures))
        yield errors
        duration = GaugeMetricFamily(
            "gpuops_slurm_scrape_duration_seconds", "Seconds the last scrape took."
        )
        duration.add_metric([], time.monotonic() - started)
        yield duration

    def _families(
        self, nodes: list[Mapping[str, Any]], jobs: list[Mapping[str, Any]]
    ) -> Iterator[Metric]:
        partitions = sorted(
            {str(p) for n in nodes for p in n.get("partitions") or []}
            | {str(j.get("partition")) for j in jobs if j.get("partition")}
        )
        yield from self._queue(jobs, partitions)
        yield from self._nodes(nodes)
        yield from self._allocations(jobs)

    def _queue(self, jobs: list[Mapping[str, Any]], partitions: list[str]) -> Iterator[Metric]:
        states = Counter(str(j.get("job_state", "")).upper() for j in jobs)
        for state, name in (("PENDING", "pending"), ("RUNNING", "running")):
            g = GaugeMetricFamily(f"slurm_queue_{name}", f"Jobs {name.lower()} (all partitions).")
            g.add_metric([], float(states[state]))
            yield g
        pending_jobs: Counter[tuple[str, str]] = Counter()
        pending_gpus: Counter[tuple[str, str]] = Counter()
        for job in jobs:
            if str(job.get("job_state", "")).upper() != "PENDING":
                continue
            # A job submitted to several partitions waits in each of them.
            for partition in str(job.get("partition") or "").split(","):
                key = (partition, str(job.get("state_reason") or "None"))
                pending_jobs[key] += 1
                pending_gpus[key] += job_gpus_requested(job)
        for metric, counts, help_ in (
            ("gpuops_queue_pending_jobs", pending_jobs, "Jobs waiting in a partition, by reason."),
            ("gpuops_queue_pending_gpus", pending_gpus, "GPUs asked by waiting jobs, by reason."),
        ):
            g = GaugeMetricFamily(metric, help_, labels=["pool", "reason"])
            for partition in partitions:
                keys = [k for k in counts if k[0] == partition]
                if not keys:  # Slurm answered: this partition's queue is really empty
                    g.add_metric([partition, ""], 0.0)
                for key in sorted(keys):
                    g.add_metric(list(key), float(counts[key]))
            yield g

    def _nodes(self, nodes: list[Mapping[str, Any]]) -> Iterator[Metric]:
        per_node = GaugeMetricFamily(
            "gpuops_slurm_node_state", "1 for the node's state.", labels=["node", "state"]
        )
        per_pool: Counter[tuple[str, str]] = Counter()
        scaled_out: Counter[tuple[str, str]] = Counter()
        compat: Counter[str] = Counter()
        gpus_total = gpus_alloc = 0
        node_gpus = GaugeMetricFamily(
            "gpuops_slurm_node_gpus", "GPUs configured on the node (GRES).", labels=["node"]
        )
        for node in nodes:
            name = str(node.get("name", ""))
            state = node_state(node)
            per_node.add_metric([name, state], 1.0)
            ours = str(node.get("comment") or "").startswith(SCALED_OUT_MARK)
            for partition in node.get("partitions") or []:
                per_pool[(str(partition), state)] += 1
                if ours:
                    scaled_out[(str(partition), state)] += 1
            if (c := _compat(state)) is not None:
                compat[c] += 1
            total = gres_gpus(str(node.get("gres") or ""))
            node_gpus.add_metric([name], float(total))
            if state not in ("powered_down", "powering_up", "powering_down"):
                gpus_total += total
                gpus_alloc += gres_gpus(str(node.get("gres_used") or ""))
        yield per_node
        yield node_gpus
        pools = GaugeMetricFamily(
            "gpuops_slurm_nodes", "Nodes of a partition by state.", labels=["pool", "state"]
        )
        for (pool, state), count in sorted(per_pool.items()):
            pools.add_metric([pool, state], float(count))
        yield pools
        powered = GaugeMetricFamily(
            "gpuops_slurm_scaled_out_nodes",
            f"Nodes of a partition that gpuops powered up (node comment {SCALED_OUT_MARK}...),"
            " by state: the only ones its scale_in powers down.",
            labels=["pool", "state"],
        )
        for (pool, state), count in sorted(scaled_out.items()):
            powered.add_metric([pool, state], float(count))
        yield powered
        for c in COMPAT_NODE_STATES:
            g = GaugeMetricFamily(f"slurm_nodes_{c}", f"Nodes in state {c}.")
            g.add_metric([], float(compat[c]))
            yield g
        for name, value, help_ in (
            ("slurm_gpus_total", gpus_total, "GPUs of powered-up nodes."),
            ("slurm_gpus_alloc", gpus_alloc, "GPUs allocated to jobs."),
            ("slurm_gpus_idle", gpus_total - gpus_alloc, "GPUs of powered-up nodes not allocated."),
        ):
            g = GaugeMetricFamily(name, help_)
            g.add_metric([], float(value))
            yield g

    def _allocations(self, jobs: list[Mapping[str, Any]]) -> Iterator[Metric]:
        g = GaugeMetricFamily(
            "gpuops_slurm_gpu_allocated",
            "1 for each GPU (device minor number) a running job holds.",
            labels=["node", "minor_number", "job", "user", "account", "project", "partition"],
        )
        for job in jobs:
            if str(job.get("job_state", "")).upper() != "RUNNING":
                continue
            details = list(job.get("gres_detail") or [])
            if not details:
                continue
            try:
                names = job_nodes(self.client, job)
            except SlurmError as exc:
                log.warning("job %s: cannot expand its node list: %s", job.get("job_id"), exc)
                continue
            account = str(job.get("account") or "")
            common = [
                str(job.get("job_id")),
                str(job.get("user_name") or ""),
                account,
                account,
                str(job.get("partition") or ""),
            ]
            for node, detail in zip(names, details, strict=False):
                minors = self.gres_minors.get(node)
                for index in expand_gres_index(str(detail)):
                    minor = minors[index] if minors and index < len(minors) else index
                    g.add_metric([node, str(minor), *common], 1.0)
        yield g
