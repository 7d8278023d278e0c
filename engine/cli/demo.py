"""`gpuops demo`: the whole loop on one machine (simulated fleet, real Prometheus, engine)."""

from __future__ import annotations

import click


@click.command(name="demo")
@click.option("--duration", default=0, show_default=True, help="Seconds to run (0: until Ctrl-C).")
def demo(duration: int) -> None:
    """Run the demo."""
    raise click.ClickException("the demo is under construction")
