"""GPU sharing of the simulated fleet: how fast jobs on the slices of one shared GPU progress,
how busy the GPU is, and whether one more job fits.

Used by ``gpuops.sim.fleet.cluster`` (each step of a shared GPU) and
``gpuops.sim.fleet.scheduler`` / ``gpuops.sim.fleet.operations`` (placing on a slice, ``pack``).
Pure functions; no I/O.

The model, and where its shape comes from:

- **Time-slicing** (NVIDIA k8s-device-plugin "time-slicing" replicas, and CUDA's default
  compute mode): the jobs' kernels take turns on the whole GPU, memory is shared without
  isolation. The GPU is as busy as the sum of what the jobs ask (at most 1); when they ask
  for more than the GPU has, each slows by the same factor. Interleaving costs a context
  switch: Gandiva (Xiao et al., OSDI 2018) packs jobs whose combined utilization fits one GPU
  and reports small slowdowns for such pairs; ``TIME_SLICING_OVERHEAD`` charges 5 % of
  progress to every job on a GPU shared by two or more — more than those measurements for
  light jobs, less than for two busy trainings (which ``pack`` is not for).
- **MIG** (NVIDIA's MIG user guide, A100/H100): a slice is an isolated instance with
  ``1/slices`` of the SMs and of the memory (7 x 1g.10gb on an 80 GB A100). A job that asks
  ``u`` of a whole GPU runs at full speed while ``u <= 1/slices`` and slower beyond, by
  ``(1/slices) / u``; no interference between slices.
- Memory must fit: every job's memory on the GPU (its ``memory_gib``, else its profile's
  share) together within the GPU's memory (time-slicing), or its slice's (MIG).
"""

from __future__ import annotations

TIME_SLICING_OVERHEAD = 0.05
"""Share of progress a job on a time-sliced GPU shared with others loses to context switches."""


def gpu_utilization(mode: str, demands: list[float], slices: int) -> float:
    """How busy (0-1) a shared GPU is when its jobs ask ``demands`` (each 0-1 of a whole GPU)."""
    if mode == "mig":
        return min(1.0, sum(min(d, 1.0 / slices) for d in demands))
    return min(1.0, sum(demands))


def progress_rates(mode: str, demands: list[float], slices: int) -> list[float]:
    """Each job's progress relative to running alone on the whole GPU."""
    if mode == "mig":
        share = 1.0 / slices
        return [1.0 if d <= share else share / d for d in demands]
    total = sum(demands)
    contention = 1.0 if total <= 1.0 else 1.0 / total
    overhead = TIME_SLICING_OVERHEAD if len(demands) > 1 else 0.0
    return [contention * (1.0 - overhead) for _ in demands]


def fits(mode: str, used_bytes: list[int], new_bytes: int, memory_bytes: int, slices: int) -> bool:
    """Whether one more job needing ``new_bytes`` fits next to jobs using ``used_bytes``."""
    if len(used_bytes) >= slices:
        return False
    if mode == "mig":
        return new_bytes <= memory_bytes // slices
    return sum(used_bytes) + new_bytes <= memory_bytes
