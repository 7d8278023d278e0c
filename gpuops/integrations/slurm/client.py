"""Runs Slurm's commands (``sinfo``, ``squeue``, ``scontrol``, ``scancel``) for the Slurm
exporter (``gpuops.exporters.slurm.collector``) and the ``slurm`` executor
(``gpuops.actions.slurm``).

Arguments are argv elements, never a shell line. Every command has a timeout: ``sinfo`` and
``squeue`` hang while slurmctld is down. Errors are classified here, where Slurm's messages are
known: ``SlurmUnavailable`` (timeout, controller unreachable, busy: try again) and
``SlurmRejected`` (Slurm refused the request: an invalid node or job, a bad state transition).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

UNAVAILABLE_MARKERS = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "communication connection failure",
    "slurm_persist_conn_open",
    "resource temporarily unavailable",
    "zero bytes were transmitted",
    "slurmctld not responding",
    "transient",
    "try again",
)
"""Fragments of Slurm's stderr that mean "the controller is not there (yet)"."""

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""Node and partition names gpuops passes to Slurm: no hostlist brackets, commas or spaces (a
name with those could address other nodes), no leading ``-`` (an option)."""


class SlurmError(Exception):
    """Base of what the client raises; the message names the command."""


class SlurmUnavailable(SlurmError):
    """slurmctld did not answer (timeout, refused, down): the same request may work later."""


class SlurmRejected(SlurmError):
    """Slurm answered and refused: trying again will not help."""


def check_name(kind: str, value: str) -> str:
    """``value`` if it is a plain Slurm node/partition name, else ``SlurmRejected``."""
    if not NAME_RE.fullmatch(value):
        raise SlurmRejected(
            f"{kind} name {value!r} is not a plain Slurm name (letters, digits, '.', '_', '-'; "
            "no hostlist brackets, commas or spaces)"
        )
    return value


def check_job_id(value: str) -> str:
    if not re.fullmatch(r"[0-9]{1,12}(_[0-9]{1,9})?", value):
        raise SlurmRejected(f"job id {value!r} is not a Slurm job id (digits, or N_M for arrays)")
    return value


@dataclass(frozen=True)
class SlurmClient:
    """Settings of how Slurm's commands are run."""

    conf: str | None = None
    """slurm.conf to use (``SLURM_CONF``); None: Slurm's default (/etc/slurm/slurm.conf)."""
    timeout_s: float = 10.0
    """Seconds before a command counts as failed (slurmctld unreachable)."""
    bin_dir: str | None = None
    """Directory of the Slurm commands; None: found on PATH."""

    def run(self, *argv: str) -> str:
        """stdout of the command; ``SlurmUnavailable`` or ``SlurmRejected`` otherwise."""
        program = os.path.join(self.bin_dir, argv[0]) if self.bin_dir else argv[0]
        env = dict(os.environ)
        if self.conf:
            env["SLURM_CONF"] = self.conf
        what = " ".join(argv[:3])
        try:
            done = subprocess.run(
                [program, *argv[1:]],
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(f"{what}: no answer within {self.timeout_s:g} s") from None
        except FileNotFoundError:
            raise SlurmRejected(f"{program!r} not found (is slurm-client installed?)") from None
        except OSError as exc:
            raise SlurmUnavailable(f"{what}: could not run: {exc}") from exc
        if done.returncode != 0:
            message = (done.stderr.strip() or done.stdout.strip())[-512:]
            error = f"{what} exited {done.returncode}: {message or '(no message)'}"
            if any(m in message.lower() for m in UNAVAILABLE_MARKERS):
                raise SlurmUnavailable(error)
            raise SlurmRejected(error)
        return done.stdout

    def run_json(self, *argv: str) -> Mapping[str, Any]:
        out = self.run(*argv, "--json")
        try:
            data = json.loads(out)
        except ValueError as exc:
            raise SlurmUnavailable(
                f"{' '.join(argv[:2])} --json: unreadable answer: {exc}"
            ) from None
        if not isinstance(data, dict):
            raise SlurmUnavailable(f"{' '.join(argv[:2])} --json: not a JSON object")
        errors = [e for e in data.get("errors") or [] if e]
        if errors:
            raise SlurmUnavailable(f"{' '.join(argv[:2])} --json: {errors[0]}")
        return data

    def nodes(self) -> list[Mapping[str, Any]]:
        """Every node (cloud ones too), as ``sinfo --json`` describes them."""
        return list(self.run_json("sinfo")["nodes"])

    def jobs(self) -> list[Mapping[str, Any]]:
        """Every job slurmctld remembers (pending, running, and finished ones within MinJobAge)."""
        return list(self.run_json("squeue")["jobs"])

    def node(self, name: str) -> Mapping[str, Any]:
        """One node (``scontrol show node`` has no ``--json`` in 22.05: sinfo's is used)."""
        check_name("node", name)
        for node in self.nodes():
            if node.get("name") == name:
                return node
        raise SlurmRejected(f"node {name!r} is not in this Slurm cluster")

    def job(self, job_id: str) -> Mapping[str, Any]:
        check_job_id(job_id)
        for job in self.jobs():
            if str(job.get("job_id")) == job_id:
                return job
        raise SlurmRejected(f"job {job_id} is not known to slurmctld (finished long ago?)")

    def scontrol(self, *args: str) -> str:
        return self.run("scontrol", *args)

    def hostnames(self, expression: str) -> list[str]:
        """A hostlist expression (``gpu-[1-3]``) as node names."""
        return self.run("scontrol", "show", "hostnames", expression).split()


def expand_gres_index(detail: str) -> list[int]:
    """GRES indexes of one node of a job from ``gres_detail`` (``gpu:2(IDX:0-1)``,
    ``gpu:a100:3(IDX:0,2-3)``); [] for none or N/A."""
    found: list[int] = []
    for match in re.finditer(r"gpu(?::[^:(]+)?:\d+\(IDX:([0-9,\-]+)\)", detail):
        for part in match.group(1).split(","):
            if "-" in part:
                lo, hi = part.split("-", 1)
                found.extend(range(int(lo), int(hi) + 1))
            elif part:
                found.append(int(part))
    return found


def gres_gpus(value: str) -> int:
    """GPUs in a GRES/TRES string (``gpu:2``, ``gres:gpu:a100:4``, ``gres/gpu=2``, ``gpu:0``)."""
    total = 0
    for item in re.split(r"[,]", value or ""):
        item = item.strip()
        m = re.fullmatch(r"(?:gres[:/])?gpu(?::[^:=()]+)?[:=](\d+)(?:\(.*\))?", item)
        if m:
            total += int(m.group(1))
    return total


def job_gpus_requested(job: Mapping[str, Any]) -> int:
    """GPUs a (pending) job asks for: per job, or per node times its node count."""
    per_job = gres_gpus(str(job.get("tres_per_job") or ""))
    if per_job:
        return per_job
    per_node = gres_gpus(str(job.get("tres_per_node") or ""))
    nodes = job.get("node_count") or 1
    try:
        count = int(nodes)
    except (TypeError, ValueError):
        count = 1
    return per_node * max(count, 1)


def job_nodes(client: SlurmClient, job: Mapping[str, Any]) -> list[str]:
    """The nodes a job runs on, in the order of its ``gres_detail``."""
    resources = job.get("job_resources") or {}
    allocated = resources.get("allocated_nodes") if isinstance(resources, dict) else None
    if allocated:
        return [str(n.get("nodename", "")) for n in allocated]
    nodes = str(job.get("nodes") or "")
    if not nodes:
        return []
    if re.fullmatch(r"[A-Za-z0-9._-]+", nodes):
        return [nodes]
    return client.hostnames(nodes)
