"""Finished Slurm jobs as ECS events (``gpuops audit slurm-jobs``), so that ``gpuops audit
anomalies`` and Kibana find jobs, users and nodes failing repeatedly — GPU out-of-memory above
all, found in the job's own output.

``SlurmJobWatcher.poll`` asks slurmctld (``squeue --json``, through
``gpuops.integrations.slurm.client``)
for the jobs it remembers and writes one event per ended run: a job in a final state, or a job
whose ``restart_cnt`` grew (requeued after a failure, e.g. ``RequeueExit``). The output files
(``StdOut``/``StdErr`` patterns expanded as Slurm does) are read from where the last run left
them, so each run is judged by its own lines. Event ids derive from (job id, run, state): a
restarted watcher writes the same ids, which the audit index and search deduplicate.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuops.audit.documents import DECISION_DATASET, ECS_VERSION, event_id, iso
from gpuops.integrations.slurm.client import SlurmClient

log = logging.getLogger(__name__)

OOM_PATTERNS = (
    "CUDA out of memory",
    "CUDA_ERROR_OUT_OF_MEMORY",
    "cudaErrorMemoryAllocation",
    "torch.OutOfMemoryError",
    "torch.cuda.OutOfMemoryError",
)
"""Lines of a job's output that mean its GPU ran out of memory (PyTorch, CUDA driver, runtime)."""

FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
    }
)
READ_CAP = 1 << 20
"""Bytes of new output read per file and run (the end: where programs say how they died)."""


@dataclass
class _Seen:
    runs_reported: int = 0
    """Runs of this job already written (run n has restart_cnt n)."""
    final: bool = False
    node: str = ""
    offsets: dict[str, int] = field(default_factory=dict)


def expand_output_path(pattern: str, job: Mapping[str, Any], node: str) -> str:
    """Slurm's filename pattern (``%j %x %u %N %A %a %%``) for one job; its default
    ``slurm-%j.out`` in the working directory when ``pattern`` is empty."""
    job_id = str(job.get("job_id", ""))
    array_id = str(job.get("array_job_id") or "")
    task = job.get("array_task_id")
    values = {
        "j": job_id,
        "J": job_id,
        "x": str(job.get("name", "")),
        "u": str(job.get("user_name", "")),
        "N": node,
        "n": "0",
        "A": array_id if array_id not in ("", "0") else job_id,
        "a": str(task) if task not in (None, "", 4294967294) else "4294967294",
        "%": "%",
    }
    if not pattern:
        pattern = "slurm-%A_%a.out" if array_id not in ("", "0") else "slurm-%j.out"
    text = re.sub(
        r"%(\d*)([jJxuNnAa%])", lambda m: values[m.group(2)].zfill(int(m.group(1) or 0)), pattern
    )
    cwd = str(job.get("current_working_directory") or "")
    return text if os.path.isabs(text) else os.path.join(cwd, text)


def _exit(raw: Any) -> tuple[int | None, int | None]:
    """(exit code, signal) of Slurm's raw wait status."""
    try:
        status = int(raw)
    except (TypeError, ValueError):
        return None, None
    return (status >> 8) & 0xFF, (status & 0x7F) or None


class SlurmJobWatcher:
    """Turns ended job runs into ECS documents handed to ``emit`` (``AuditLog.record``)."""

    def __init__(
        self,
        client: SlurmClient,
        emit: Callable[[dict[str, Any]], str],
        host_name: str,
        namespace: str = "default",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.emit = emit
        self.host_name = host_name
        self.namespace = namespace
        self.clock = clock
        self._seen: dict[str, _Seen] = {}

    def poll(self) -> list[str]:
        """One look at slurmctld; the event ids written (raises ``SlurmError`` when it does
        not answer: nothing is written then, and the next poll catches up)."""
        written = []
        for job in self.client.jobs():
            job_id = str(job.get("job_id"))
            seen = self._seen.setdefault(job_id, _Seen())
            state = str(job.get("job_state", "")).upper()
            runs = int(job.get("restart_cnt") or 0)
            if job.get("nodes"):
                seen.node = str(job["nodes"])
            if seen.final:
                continue
            if runs > seen.runs_reported and state not in ("RUNNING", "CONFIGURING"):
                # A run ended and the job went back to the queue (requeued).
                written.append(self._write(job, seen, runs - 1, "REQUEUED"))
                seen.runs_reported = runs
            if state in FINAL_STATES:
                written.append(self._write(job, seen, runs, state))
                seen.final = True
        return written

    def _write(self, job: Mapping[str, Any], seen: _Seen, run: int, state: str) -> str:
        oom = self._oom_line(job, seen)
        doc = job_document(
            job, run, state, seen.node, oom, self.host_name, self.namespace, self.clock()
        )
        return self.emit(doc)

    def _oom_line(self, job: Mapping[str, Any], seen: _Seen) -> str | None:
        found = None
        paths = {
            expand_output_path(str(job.get(key) or ""), job, seen.node.split(",")[0])
            for key in ("standard_output", "standard_error")
        }
        for path in sorted(paths):
            try:
                size = os.path.getsize(path)
                start = seen.offsets.get(path, 0)
                start = 0 if size < start else max(start, size - READ_CAP)  # truncated: a rerun
                with open(path, "rb") as f:
                    f.seek(start)
                    text = f.read(size - start).decode("utf-8", errors="replace")
                seen.offsets[path] = size
            except OSError:
                continue  # not on this host (no shared filesystem), or removed
            for line in text.splitlines():
                if any(p in line for p in OOM_PATTERNS):
                    found = found or line.strip()[:512]
        return found


def job_document(
    job: Mapping[str, Any],
    run: int,
    state: str,
    node: str,
    oom_line: str | None,
    host_name: str,
    namespace: str,
    now: float,
) -> dict[str, Any]:
    """The ECS event of one ended run of a Slurm job (data stream of decisions and outcomes,
    where the anomaly searches over nodes and jobs look)."""
    job_id = str(job.get("job_id"))
    code, signal = _exit(job.get("exit_code"))
    failed = state != "COMPLETED" or bool(code) or oom_line is not None
    user = str(job.get("user_name") or "")
    end = job.get("end_time")
    at = float(end) if isinstance(end, int | float) and 0 < end < now + 86400 else now
    why = f"GPU out of memory: {oom_line}" if oom_line else f"state {state}, exit code {code}"
    message = (
        f"Slurm job {job_id} ({job.get('name', '')}) of {user or 'unknown user'}, run {run}, "
        f"{'failed' if failed else 'completed'} on {node or 'unknown node'}: {why}"
    )
    labels = {
        "job": job_id,
        "job_name": str(job.get("name") or ""),
        "user": user,
        "node": node,
        "partition": str(job.get("partition") or ""),
        "account": str(job.get("account") or ""),
    }
    if oom_line:
        labels["reason"] = "oom"
    doc: dict[str, Any] = {
        "@timestamp": iso(at),
        "ecs": {"version": ECS_VERSION},
        "data_stream": {"type": "logs", "dataset": DECISION_DATASET, "namespace": namespace},
        "event": {
            "kind": "event",
            "category": ["process"],
            "type": ["end"],
            "action": "slurm-job-end",
            "outcome": "failure" if failed else "success",
            "dataset": DECISION_DATASET,
            "module": "gpuops",
            "created": iso(now),
            "id": event_id("slurm-job", job_id, str(run), state),
        },
        "message": message,
        "labels": {k: v for k, v in labels.items() if v},
        "host": {"name": node.split(",")[0] if node else host_name},
        "observer": {"hostname": host_name},
        "gpuops": {
            "job": {
                "id": job_id,
                "run": run,
                "state": state,
                "exit_code": code,
                "signal": signal,
                "oom": oom_line is not None,
                "nodes": node,
            }
        },
    }
    if user:
        doc["user"] = {"name": user}
    if code is not None:
        doc["process"] = {"exit_code": code}
    if oom_line:
        doc["error"] = {"type": "GPUOutOfMemory", "message": oom_line}
    return doc
