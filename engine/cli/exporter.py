"""`gpuops exporter` commands."""

from __future__ import annotations

import click


@click.group(name="exporter")
def exporter() -> None:
    """(under construction)"""
