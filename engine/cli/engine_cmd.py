"""`gpuops engine` commands."""

from __future__ import annotations

import click


@click.group(name="engine")
def engine() -> None:
    """(under construction)"""
