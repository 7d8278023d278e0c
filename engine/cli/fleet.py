"""`gpuops fleet` commands."""

from __future__ import annotations

import click


@click.group(name="fleet")
def fleet() -> None:
    """(under construction)"""
