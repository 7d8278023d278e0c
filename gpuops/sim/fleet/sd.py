"""Prometheus service discovery for the simulated fleet: the file_sd JSON file listing node
targets, and the scrape config snippet that reads it, or a whole Prometheus config around it.

``gpuops.sim.fleet.sim`` rewrites the file whenever nodes are added or removed; the demo, the
CLI and the integration tests render the scrape config with ``scrape_configs``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

NODES_JOB = "gpu-nodes"
FLEET_JOB = "gpuops-fleet"


def write_targets(path: Path, host: str, nodes: Iterable[tuple[str, str, int]]) -> None:
    """Atomically write file_sd ``path`` with one target group per (node, pool, port)."""
    groups = [
        {"targets": [f"{host}:{port}"], "labels": {"node": node, "pool": pool}}
        for node, pool, port in sorted(nodes)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(groups, out, indent=2)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; Prometheus may run as another user
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def scrape_jobs(
    sd_file: str | Path, control_target: str, scrape_interval: str = "15s"
) -> list[dict[str, Any]]:
    """The two scrape jobs: ``gpu-nodes`` (every node, via file_sd) and ``gpuops-fleet``."""
    return [
        {
            "job_name": NODES_JOB,
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            # node and pool come both from the target and from the series: keep the series'.
            "honor_labels": True,
            "file_sd_configs": [{"files": [str(sd_file)], "refresh_interval": "5s"}],
        },
        {
            "job_name": FLEET_JOB,
            "scrape_interval": scrape_interval,
            "scrape_timeout": scrape_interval,
            "honor_labels": True,
            "static_configs": [{"targets": [control_target]}],
        },
    ]


def scrape_configs(sd_file: str | Path, control_target: str, scrape_interval: str = "15s") -> str:
    """YAML text of a ``scrape_configs:`` section for the fleet, to paste into prometheus.yml."""
    doc = {"scrape_configs": scrape_jobs(sd_file, control_target, scrape_interval)}
    return yaml.safe_dump(doc, sort_keys=False)


def prometheus_config(
    sd_file: str | Path,
    control_target: str,
    scrape_interval: str = "15s",
    engine_target: str | None = "127.0.0.1:9842",
) -> str:
    """YAML text of a complete prometheus.yml for the fleet: its two jobs (``sd_file`` made
    absolute, as Prometheus reads a relative one from the config's folder) and, when
    ``engine_target`` is set, the engine's own metrics as job ``gpuops-engine``."""
    jobs = scrape_jobs(Path(sd_file).resolve(), control_target, scrape_interval)
    if engine_target:
        jobs.append({"job_name": "gpuops-engine", "static_configs": [{"targets": [engine_target]}]})
    doc = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": jobs,
    }
    head = "# Written by `gpuops fleet sim --prometheus-config`; remade at every start.\n"
    return head + yaml.safe_dump(doc, sort_keys=False)
