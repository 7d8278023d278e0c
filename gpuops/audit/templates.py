"""Installs the ILM policy, component templates and index templates of ``elk/elasticsearch``.

Called by the shipper before it ships (``AuditLog.start``) and by ``gpuops elk install``.
Idempotent: every object is PUT under its own name, so installing twice changes nothing.
Files: ``ilm/<name>.json``, ``component_templates/<name>.json``, ``index_templates/<name>.json``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elasticsearch import Elasticsearch

from gpuops.audit.client import CLIENT_ERRORS, wrap
from gpuops.audit.errors import TemplateError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TemplateObject:
    """One object to install: its kind (ilm, component, index), name and body."""

    kind: str
    name: str
    body: dict[str, Any]


_KINDS = (("ilm", "ilm"), ("component", "component_templates"), ("index", "index_templates"))


def load_templates(directory: Path) -> list[TemplateObject]:
    """The objects of ``directory`` in install order (ILM, components, index templates)."""
    if not directory.is_dir():
        raise TemplateError(f"template directory {directory} does not exist")
    found: list[TemplateObject] = []
    for kind, sub in _KINDS:
        for path in sorted((directory / sub).glob("*.json")):
            try:
                body = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise TemplateError(f"{path}: not valid JSON: {exc}") from exc
            if not isinstance(body, dict):
                raise TemplateError(f"{path}: expected a JSON object, found {type(body).__name__}")
            found.append(TemplateObject(kind, path.stem, body))
    if not any(obj.kind == "index" for obj in found):
        raise TemplateError(f"{directory}: no index template in {directory / 'index_templates'}")
    return found


def install_templates(client: Elasticsearch, directory: Path) -> list[str]:
    """PUT every object of ``directory``; returns what was installed (``kind/name``).

    Raises ``TemplateError`` for bad files, ``RetryableError``/``ElasticsearchError`` when
    Elasticsearch is unreachable or refuses an object.
    """
    installed: list[str] = []
    for obj in load_templates(directory):
        try:
            if obj.kind == "ilm":
                client.ilm.put_lifecycle(name=obj.name, body=obj.body)
            elif obj.kind == "component":
                client.cluster.put_component_template(name=obj.name, body=obj.body)
            else:
                client.indices.put_index_template(name=obj.name, body=obj.body)
        except CLIENT_ERRORS as exc:
            raise wrap(exc, f"installing {obj.kind} {obj.name}") from exc
        installed.append(f"{obj.kind}/{obj.name}")
        log.debug("installed %s %s", obj.kind, obj.name)
    log.info("installed %d Elasticsearch objects from %s", len(installed), directory)
    return installed
