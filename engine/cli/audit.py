"""`gpuops audit` commands."""

from __future__ import annotations

import click


@click.group(name="audit")
def audit() -> None:
    """(under construction)"""
