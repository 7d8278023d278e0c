"""`gpuops exporter` commands: `gpuops exporter nvml` runs the NVML exporter (and, with
``--agent``, the node agent for clock actions, GPU resets and, with ``--agent-reboot``, the
node's reboot) from ``gpuops.exporters.nvml.server``.

The exporter package is imported when the command runs, not when the CLI loads: it is the only
route to pynvml, and the engine's own commands must not load it (see the import contracts).
"""

from __future__ import annotations

import logging
import re
import shlex
import socket
import threading
from importlib import import_module
from pathlib import Path
from typing import Any

import click

from gpuops.model.health.events import FAULT_LABELS, TARGET_LABELS, domain_value_problem

log = logging.getLogger(__name__)

_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

FAKE_SCENARIOS = (
    "healthy-8xh100",
    "mig-a100",
    "gpu-lost",
    "old-driver",
    "no-permission",
    "library-missing",
)
"""The names of ``gpuops.exporters.nvml.scenarios.SCENARIOS`` (a test keeps the two equal)."""


@click.group(name="exporter")
def exporter() -> None:
    """Prometheus exporters that run on GPU nodes."""


@exporter.command(name="nvml")
@click.option(
    "--host",
    default="0.0.0.0",
    show_default=True,
    help="Address to listen on (0.0.0.0: every interface; 127.0.0.1: this node only).",
)
@click.option(
    "--port",
    default=9835,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="TCP port of /metrics (and of the node agent); 0 picks a free one.",
)
@click.option(
    "--fake-nvml",
    "fake_nvml",
    metavar="SCENARIO",
    type=click.Choice(FAKE_SCENARIOS),
    default=None,
    help="Serve a simulated NVML instead of the real one, for demos and checks: "
    + ", ".join(FAKE_SCENARIOS)
    + ".",
)
@click.option(
    "--agent/--no-agent",
    default=False,
    show_default=True,
    help="Also serve the node agent (lock/reset GPU clocks, set power limits) on "
    "/api/v1/gpus. Needs a bearer token and, on a real GPU, root.",
)
@click.option(
    "--agent-token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    envvar="GPUOPS_AGENT_TOKEN_FILE",
    default=None,
    help="File holding the bearer token the node agent requires (first line). "
    "Env: GPUOPS_AGENT_TOKEN_FILE.",
)
@click.option(
    "--agent-reboot/--no-agent-reboot",
    default=False,
    show_default=True,
    help="Also let the node agent reboot this node (POST /api/v1/node/reboot, the "
    "remediation ladder's reboot where the scheduler cannot reboot a node: Kubernetes), "
    "once per decision id. Needs --agent.",
)
@click.option(
    "--agent-reboot-command",
    default="systemctl reboot",
    show_default=True,
    metavar="COMMAND",
    help="What reboots this node (split like a shell, run without one; nothing a request "
    "carries is added to it), started after the agent answered.",
)
@click.option(
    "--agent-state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/var/lib/gpuops-agent"),
    show_default=True,
    help="Where the node agent keeps the decision ids it rebooted for and, with --push-url, "
    "the health events the engine has not taken yet (it must outlive a reboot: not a tmpfs).",
)
@click.option(
    "--agent-boot-id-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("/proc/sys/kernel/random/boot_id"),
    show_default=True,
    help="The file holding the id of the running boot (new at each boot): how a reboot is "
    "known to have happened.",
)
@click.option(
    "--xid-events/--no-xid-events",
    default=True,
    show_default=True,
    help="Count XID errors from an NVML event thread (nvml_gpu_xid_errors_total).",
)
@click.option(
    "--xid-poll-ms",
    default=500,
    show_default=True,
    type=click.IntRange(10, 60_000),
    help="How long one NVML event wait blocks, in milliseconds (bounds shutdown time).",
)
@click.option(
    "--push-url",
    envvar="GPUOPS_PUSH_URL",
    default=None,
    metavar="URL",
    help="The engine's API (https://engine:9843): send each XID and lost GPU to its "
    "/api/v1/health/events the moment NVML reports it, retried while it is away. "
    "Env: GPUOPS_PUSH_URL.",
)
@click.option(
    "--push-token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    envvar="GPUOPS_PUSH_TOKEN_FILE",
    default=None,
    help="File holding the engine API token (role alertmanager) for --push-url (first line). "
    "Env: GPUOPS_PUSH_TOKEN_FILE.",
)
@click.option(
    "--node",
    "node_name",
    default=None,
    help="This node's name as the scheduler knows it, sent with each event; a reboot "
    "(--agent-reboot) must name it (default: the host name up to its first dot).",
)
@click.option(
    "--pool",
    "pool_name",
    default="",
    help="This node's pool (Slurm: partition), sent with each pushed event: the engine "
    "applies the pool's health profile (observe, quarantine).",
)
@click.option(
    "--label",
    "labels",
    multiple=True,
    envvar="GPUOPS_NODE_LABELS",
    metavar="NAME=VALUE",
    help="A label of this node sent with each pushed event, e.g. --label rack=r12 --label "
    "zone=z1: the failure domains its repairs are paced in (health.ladder.pacing.domains). "
    'Repeatable. Env: GPUOPS_NODE_LABELS (space-separated: "rack=r12 zone=z1").',
)
def nvml(
    host: str,
    port: int,
    fake_nvml: str | None,
    agent: bool,
    agent_token_file: Path | None,
    agent_reboot: bool,
    agent_reboot_command: str,
    agent_state_dir: Path,
    agent_boot_id_file: Path,
    xid_events: bool,
    xid_poll_ms: int,
    push_url: str | None,
    push_token_file: Path | None,
    node_name: str | None,
    pool_name: str,
    labels: tuple[str, ...],
) -> None:
    """Export NVML metrics on /metrics (default port 9835) for Prometheus."""
    node_labels = _labels(labels)
    pool_problem = domain_value_problem(pool_name) if pool_name else None
    if pool_problem is not None:
        raise click.UsageError(f"--pool {pool_name!r}: the pool {pool_problem}")
    name = node_name or socket.gethostname().split(".")[0]
    token = None
    if agent:
        if agent_token_file is None:
            raise click.UsageError("--agent needs --agent-token-file (the bearer token)")
        token = _first_line(agent_token_file, "--agent-token-file")
    extra: dict[str, Any] = {}
    if agent_reboot:
        if not agent:
            raise click.UsageError("--agent-reboot needs --agent (the node agent)")
        extra["rebooter"] = _rebooter(
            agent_reboot_command, agent_state_dir, agent_boot_id_file, name
        )
    if fake_nvml is not None:
        scenarios = import_module("gpuops.exporters.nvml.scenarios")
        backend = scenarios.SCENARIOS[fake_nvml]()
        extra["reset"] = scenarios.fake_reset(backend)
        log.info("serving the simulated NVML scenario %r", fake_nvml)
    else:
        backend = import_module("gpuops.exporters.nvml.nvml").real_backend()
    server = import_module("gpuops.exporters.nvml.server").ExporterServer(
        backend,
        host=host,
        port=port,
        agent_token=token,
        xid_events=xid_events,
        xid_poll_ms=xid_poll_ms,
        push=_pusher(
            push_url,
            push_token_file,
            name,
            pool_name,
            node_labels,
            agent_state_dir,
            agent_boot_id_file,
        ),
        **extra,
    )
    log.info(
        "NVML exporter on http://%s:%d/metrics%s",
        host,
        server.port,
        " with the node agent on /api/v1/gpus" if token else "",
    )
    try:
        server.serve_forever()
    finally:
        server.close()


def _labels(given: tuple[str, ...]) -> dict[str, str]:
    """``--label NAME=VALUE`` as a mapping; a usage error naming the one that cannot be."""
    found: dict[str, str] = {}
    for text in given:
        name, eq, value = text.partition("=")
        if not eq or not _LABEL.fullmatch(name):
            raise click.UsageError(
                f"--label {text!r}: give NAME=VALUE, NAME a label name ([a-zA-Z_][a-zA-Z0-9_]*)"
            )
        if name in FAULT_LABELS:
            raise click.UsageError(
                f"--label {text!r}: {name} is a label the engine sets itself"
                f" ({', '.join(sorted(FAULT_LABELS))})"
            )
        if name in TARGET_LABELS:
            raise click.UsageError(
                f"--label {text!r}: {name} is a label an executor reads to choose what it acts "
                f"on, never a failure domain ({', '.join(sorted(TARGET_LABELS))})"
            )
        problem = domain_value_problem(value)
        if problem is not None:
            raise click.UsageError(f"--label {text!r}: the value {problem}")
        if name in found:
            raise click.UsageError(f"--label {name} is given twice")
        found[name] = value
    return found


def _pusher(
    url: str | None,
    token_file: Path | None,
    node: str,
    pool: str = "",
    labels: dict[str, str] | None = None,
    state_dir: Path | None = None,
    boot_id_file: Path | None = None,
) -> object | None:
    """The health pusher of ``--push-url`` (its queue under ``state_dir``, each event tagged
    with the boot of ``boot_id_file``), or None."""
    if url is None:
        if token_file is not None:
            raise click.UsageError("--push-token-file without --push-url")
        return None
    if token_file is None:
        raise click.UsageError("--push-url needs --push-token-file (the engine API token)")
    token = _first_line(token_file, "--push-token-file")
    log.info("pushing XIDs and lost GPUs of node %r to %s", node, url)
    push = import_module("gpuops.exporters.nvml.push")
    queue_dir = state_dir / push.QUEUE_DIR if state_dir is not None else None
    boot_id = None
    if boot_id_file is not None:
        boot_id = import_module("gpuops.exporters.nvml.reboot").boot_id_of(boot_id_file)
    pusher: object = push.HealthPusher(
        url, token, node, pool=pool, labels=labels, queue_dir=queue_dir, boot_id=boot_id
    )
    return pusher


def _rebooter(command: str, state_dir: Path, boot_id_file: Path, node: str) -> object:
    """The node agent's reboot of ``--agent-reboot``, of node ``node`` only."""
    argv = shlex.split(command)
    if not argv:
        raise click.UsageError("--agent-reboot-command is empty")
    reboot = import_module("gpuops.exporters.nvml.reboot")
    rebooter: object = reboot.Rebooter(state_dir, argv, reboot.boot_id_of(boot_id_file), node=node)
    log.info("the node agent reboots this node, %s, with %s (state in %s)", node, argv, state_dir)
    return rebooter


def _first_line(path: Path, flag: str) -> str:
    """A token file's first line; a usage error when it is empty."""
    lines = path.read_text(encoding="utf-8").splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        raise click.UsageError(f"{flag} {path} is empty")
    return token


@exporter.command(name="slurm")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    default=9341,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="TCP port of /metrics; 0 picks a free one.",
)
@click.option(
    "--slurm-conf",
    type=click.Path(exists=True, dir_okay=False),
    envvar="SLURM_CONF",
    default=None,
    help="slurm.conf of the cluster (default: Slurm's own). Env: SLURM_CONF.",
)
@click.option(
    "--gres-conf",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="gres.conf, to map GRES indexes to /dev/nvidiaN minor numbers when its File= "
    "devices are not nvidia0..N-1 in order.",
)
@click.option(
    "--timeout",
    "timeout_s",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0.1, 300),
    help="Seconds one Slurm command may take; slower counts as Slurm unreachable.",
)
def slurm(
    host: str, port: int, slurm_conf: str | None, gres_conf: Path | None, timeout_s: float
) -> None:
    """Export Slurm's queue, node states and GPU allocations on /metrics (default port 9341)."""
    client_module = import_module("gpuops.integrations.slurm.client")
    client = client_module.SlurmClient(conf=slurm_conf, timeout_s=timeout_s)
    minors = None
    if gres_conf is not None:
        minors = import_module("gpuops.integrations.slurm.gres").minor_numbers(gres_conf, client)
    server = import_module("gpuops.exporters.slurm.server").SlurmExporter(
        client, host=host, port=port, gres_minors=minors
    )
    server.start()
    log.info("Slurm exporter on http://%s:%d/metrics", host, server.port)
    try:
        threading.Event().wait()
    finally:
        server.stop()
