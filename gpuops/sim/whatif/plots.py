"""PNG plots of a what-if (``gpuops whatif --plots DIR``): utilization over powered GPUs,
queue length and power over virtual time, off vs on, from the fleet as each run's recorder
saw it at every scrape (``gpuops.sim.fleet.report.Point``).

matplotlib with its non-interactive Agg backend (no display, no GUI toolkit). Used by
``gpuops.cli.whatif``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first)

from gpuops.sim.fleet.report import Point  # noqa: E402
from gpuops.sim.whatif.both import Whatif  # noqa: E402

PLOTS: tuple[tuple[str, str, Callable[[Point], float | None]], ...] = (
    ("utilization.png", "utilization over powered GPUs (%)", lambda p: _pct(p.utilization)),
    ("queue.png", "jobs waiting", lambda p: float(p.queued)),
    ("power.png", "power, GPUs and hosts (kW)", lambda p: p.power_watts / 1000.0),
)


def _pct(v: float | None) -> float | None:
    return None if v is None else v * 100.0


def plot(w: Whatif, directory: Path) -> list[Path]:
    """Write the plots into ``directory`` (created); returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, ylabel, get in PLOTS:
        fig, ax = plt.subplots(figsize=(9, 3.5))
        for label, run in (("policies off", w.off), ("policies on", w.on)):
            xs, ys = [], []
            for p in run.points:
                y = get(p)
                if y is not None:
                    xs.append(p.t_s / 3600.0)
                    ys.append(y)
            ax.plot(xs, ys, label=label, linewidth=1.2)
        ax.set_xlabel("virtual hours")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{w.fleet}, seed {w.seed}: {ylabel}")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = directory / name
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
