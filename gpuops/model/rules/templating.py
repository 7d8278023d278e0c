"""``{{ $labels.name }}`` and ``{{ $value }}`` templating for annotations and executor params.

Deliberately tiny and safe: no expressions, no evaluation. Used by evaluation (annotations) and
executors (params). Unknown placeholders are rejected by the loader through ``placeholders``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

PLACEHOLDER = re.compile(r"\{\{\s*\$(labels\.([A-Za-z_][A-Za-z0-9_]*)|value)\s*\}\}")
ANY_BRACES = re.compile(r"\{\{.*?\}\}")


def render(template: str, labels: Mapping[str, str], value: float | None) -> str:
    """Replace placeholders; a missing label renders as an empty string, like Prometheus."""

    def sub(match: re.Match[str]) -> str:
        if match.group(1) == "value":
            return "" if value is None else f"{value:g}"
        return labels.get(match.group(2), "")

    return PLACEHOLDER.sub(sub, template)


def unknown_placeholders(template: str) -> list[str]:
    """Placeholders in ``template`` that ``render`` does not understand."""
    return [
        m.group(0) for m in ANY_BRACES.finditer(template) if not PLACEHOLDER.fullmatch(m.group(0))
    ]
