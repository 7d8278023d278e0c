"""`gpuops demo`: the whole loop on one machine (simulated fleet, real Prometheus, engine, its
API and web console)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from types import FrameType

import click

from gpuops.sim.demo import DEMO_RULES, Demo, DemoSettings
from gpuops.sim.demo_console import DemoPortBusy


@click.command(name="demo")
@click.option(
    "--duration",
    default=DemoSettings.duration_s,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds to run, then the summary (the story's last step comes at 135 s); 0 runs "
    "until Ctrl-C. Ctrl-C ends it early, with the summary.",
)
@click.option(
    "--api-port",
    default=9843,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="Port of the engine's API and web console on 127.0.0.1 while the demo runs (0: any "
    "free port).",
)
@click.option(
    "--audit-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory of the audit spool (ECS JSON lines); default: a new temporary one, kept.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep Prometheus data and engine state here instead of a temporary directory.",
)
@click.option(
    "--rules",
    "rules_path",
    type=click.Path(exists=True, path_type=Path),
    default=DEMO_RULES,
    show_default=True,
    help="Policies to run (demo-scale versions of rules/*.yaml).",
)
@click.option("--nodes", default=4, show_default=True, help="Simulated nodes at start.")
@click.option("--gpus-per-node", default=4, show_default=True, help="GPUs per simulated node.")
@click.option("--seed", default=42, show_default=True, help="Seed of the simulated fleet.")
@click.option(
    "--slurm",
    is_flag=True,
    help="Tell the story on a real local Slurm (slurm-wlm and munge, as root) instead of the "
    "simulated fleet; --duration, --api-port, --rules, --nodes, --gpus-per-node and --seed do "
    "not apply.",
)
def demo(
    duration: float,
    api_port: int,
    audit_dir: Path | None,
    workdir: Path | None,
    rules_path: Path,
    nodes: int,
    gpus_per_node: int,
    seed: int,
    slurm: bool,
) -> None:
    """Run the simulated fleet, a real Prometheus and the engine; print each decision."""
    parent = click.get_current_context().parent
    source = parent.get_parameter_source("log_level") if parent is not None else None
    if source is click.core.ParameterSource.DEFAULT:
        # the demo's own lines tell the story; components speak up only when it matters, and
        # the engine's decision lines (a held one is a warning there) would tell it twice
        logging.getLogger().setLevel(logging.WARNING)
        logging.getLogger("gpuops.runtime.gate.told").setLevel(logging.ERROR)
    settings = DemoSettings(
        duration_s=duration,
        workdir=workdir,
        audit_dir=audit_dir,
        rules=rules_path,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        seed=seed,
        api_listen=f"127.0.0.1:{api_port}",
    )
    started = time.monotonic()
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # first Ctrl-C or SIGTERM: stop gracefully (every process stopped, summary printed);
        # a second one interrupts at once
        click.echo(f"\n{signal.Signals(signum).name}: stopping the demo", err=True)
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if slurm:
        _slurm_demo(workdir, audit_dir, stop)
        return
    if duration:
        click.echo(
            f"The demo runs {duration:g} s (--duration); Ctrl-C ends it early, with the summary."
        )
    else:
        click.echo("The demo runs until Ctrl-C (--duration 0), then prints its summary.")
    runner = Demo(settings, out=click.echo)
    try:
        runner.run(stop)
    except DemoPortBusy as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(runner.summary(time.monotonic() - started))


def _slurm_demo(workdir: Path | None, audit_dir: Path | None, stop: threading.Event) -> None:
    import tempfile

    from gpuops.sim.slurmdemo import SlurmDemo

    work = workdir or Path(tempfile.mkdtemp(prefix="gpuops-demo-slurm-"))
    audit = audit_dir or Path(tempfile.mkdtemp(prefix="gpuops-demo-slurm-audit-"))
    counts = SlurmDemo(work, audit, click.echo).run(stop)
    click.echo("decisions by policy and verdict:")
    for (policy, verdict), count in sorted(counts.items()):
        click.echo(f"  {policy:28} {verdict:24} {count}")
    click.echo(f"audit spool: {audit} (gpuops audit search --spool-dir {audit})")
