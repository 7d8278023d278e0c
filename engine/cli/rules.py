"""`gpuops rules` commands."""

from __future__ import annotations

import click


@click.group(name="rules")
def rules() -> None:
    """(under construction)"""
