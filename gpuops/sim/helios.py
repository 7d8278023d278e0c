"""Real cluster history for backtests: the Helios "Earth" per-minute virtual-cluster sequences
(SC'21; one of them ships in examples/helios-earth) as OpenMetrics text that ``promtool tsdb
create-blocks-from openmetrics`` turns into Prometheus blocks.

Called by ``gpuops backtest load-helios``. Each virtual cluster (VC) becomes a ``pool``; the
series carry the names the shipped policies use, so ``scale-out-on-queue`` runs unchanged:

- ``gpuops_queue_pending_jobs{pool}``: pending_job_num
- ``gpuops_vc_jobs{pool,state=running|pending}``: running_job_num, pending_job_num
- ``gpuops_vc_gpus{pool,state=total|running|idle|pending}``: *_gpu_num
- ``gpuops_vc_allocation_ratio{pool}``: gpu_utilization (allocated / total, not SM utilization)
"""

from __future__ import annotations

import csv
import gzip
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

FAMILIES: tuple[tuple[str, str, tuple[tuple[str, str], ...]], ...] = (
    ("gpuops_queue_pending_jobs", "Jobs waiting in the pool's queue.", (("", "pending_job_num"),)),
    (
        "gpuops_vc_jobs",
        "Jobs of the virtual cluster by state.",
        (("running", "running_job_num"), ("pending", "pending_job_num")),
    ),
    (
        "gpuops_vc_gpus",
        "GPUs of the virtual cluster by state.",
        (
            ("total", "total_gpu_num"),
            ("running", "running_gpu_num"),
            ("idle", "idle_gpu_num"),
            ("pending", "pending_gpu_num"),
        ),
    ),
    (
        "gpuops_vc_allocation_ratio",
        "Allocated GPUs over total GPUs.",
        (("", "gpu_utilization"),),
    ),
)


class HeliosError(ValueError):
    """A file that is not a Helios VC sequence."""


@dataclass(frozen=True)
class VcSequence:
    name: str
    times: tuple[int, ...]
    columns: dict[str, tuple[str, ...]]


_SUFFIXES = (".csv", ".csv.gz")


def available(data_dir: Path) -> list[str]:
    """The virtual clusters in ``data_dir`` (files vc*.csv or vc*.csv.gz)."""
    return sorted({p.name.removesuffix(s) for s in _SUFFIXES for p in data_dir.glob(f"vc*{s}")})


def vc_file(data_dir: Path, name: str) -> Path | None:
    """The file of virtual cluster ``name`` in ``data_dir`` (plain CSV first), or None."""
    for suffix in _SUFFIXES:
        path = data_dir / f"{name}{suffix}"
        if path.is_file():
            return path
    return None


def read_vc(path: Path) -> VcSequence:
    """One VC sequence from ``path`` (``.csv``, or ``.csv.gz`` read compressed)."""
    wanted = {column for _, _, series in FAMILIES for _, column in series}
    name = path.name.removesuffix(".gz").removesuffix(".csv")
    opened = gzip.open(path, "rt", newline="") if path.suffix == ".gz" else path.open(newline="")
    with opened as f:
        reader = csv.DictReader(f)
        missing = wanted - set(reader.fieldnames or ())
        if missing:
            raise HeliosError(f"{path}: not a Helios VC sequence (missing {sorted(missing)})")
        times: list[int] = []
        columns: dict[str, list[str]] = {c: [] for c in wanted}
        for line, row in enumerate(reader, start=2):
            try:
                at = datetime.strptime(row["time"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
            except (KeyError, ValueError) as exc:
                raise HeliosError(f"{path}:{line}: time {row.get('time')!r}: {exc}") from None
            times.append(int(at.timestamp()))
            for c in wanted:
                columns[c].append(row[c])
    return VcSequence(name, tuple(times), {c: tuple(v) for c, v in columns.items()})


def window(seq: VcSequence, start: float | None, end: float | None) -> VcSequence:
    """The part of ``seq`` with ``start <= time <= end`` (None: unbounded)."""
    keep = [
        i
        for i, at in enumerate(seq.times)
        if (start is None or at >= start) and (end is None or at <= end)
    ]
    return VcSequence(
        seq.name,
        tuple(seq.times[i] for i in keep),
        {c: tuple(v[i] for i in keep) for c, v in seq.columns.items()},
    )


def openmetrics(sequences: Sequence[VcSequence]) -> Iterator[str]:
    """OpenMetrics lines (without newlines) for ``sequences``, families kept contiguous."""
    for name, help_text, series in FAMILIES:
        yield f"# HELP {name} {help_text}"
        yield f"# TYPE {name} gauge"
        for seq in sequences:
            for state, column in series:
                labels = f'pool="{seq.name}"' + (f',state="{state}"' if state else "")
                values = seq.columns[column]
                for at, value in zip(seq.times, values, strict=True):
                    yield f"{name}{{{labels}}} {float(value):g} {at}"
    yield "# EOF"


def write_openmetrics(sequences: Sequence[VcSequence], out: Path) -> int:
    """Write the OpenMetrics file; returns the number of samples."""
    samples = 0
    with out.open("w") as f:
        for line in openmetrics(sequences):
            f.write(line + "\n")
            samples += not line.startswith("#")
    return samples
