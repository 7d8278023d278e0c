"""``gpuops elk install``: install the Elasticsearch templates and ILM policy of ``elk/``.

A thin front over ``gpuops.audit.templates`` (the engine does the same at start). Kibana saved
objects are imported with the command in ``elk/README.md``.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from gpuops.audit import AuditSettings
from gpuops.audit.client import make_client
from gpuops.audit.errors import AuditError
from gpuops.audit.settings import default_templates_dir
from gpuops.audit.templates import install_templates


@click.group(name="elk")
def elk() -> None:
    """Set up Elasticsearch for the gpuops audit trail."""


@elk.command("install")
@click.option(
    "--url",
    envvar="GPUOPS_ELASTICSEARCH_URL",
    required=True,
    help="Elasticsearch URL. Env: GPUOPS_ELASTICSEARCH_URL (API key: "
    "GPUOPS_ELASTICSEARCH_API_KEY).",
)
@click.option(
    "--templates-dir",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    default=None,
    help="Directory with ilm/, component_templates/ and index_templates/ "
    "(default: elk/elasticsearch).",
)
def install(url: str, templates_dir: Path | None) -> None:
    """Install (idempotently) the ILM policy, component templates and index templates."""
    directory = templates_dir or default_templates_dir()
    settings = AuditSettings(
        spool_dir=Path("."),
        elasticsearch_url=url,
        elasticsearch_api_key=os.environ.get("GPUOPS_ELASTICSEARCH_API_KEY"),
    )
    client = make_client(settings)
    try:
        installed = install_templates(client, directory)
    except AuditError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        client.close()
    for name in installed:
        click.echo(f"installed {name}")
