"""The files of elk/: templates map every field the documents use, Kibana objects are complete
and consistent."""

from __future__ import annotations

import json
from typing import Any

from gpuops.audit.settings import default_templates_dir
from gpuops.audit.templates import load_templates
from tests.unit.audit.test_documents import SHAPES, leaves

KIBANA = default_templates_dir().parent / "kibana" / "gpuops-audit.ndjson"


def mapped_fields() -> dict[str, str]:
    fields: dict[str, str] = {}

    def walk(props: dict[str, Any], prefix: str) -> None:
        for name, spec in props.items():
            if "properties" in spec:
                walk(spec["properties"], f"{prefix}{name}.")
            else:
                fields[prefix + name] = spec.get("type", "object")

    for obj in load_templates(default_templates_dir()):
        walk(obj.body.get("template", {}).get("mappings", {}).get("properties", {}), "")
    return fields


def test_index_templates_have_priority_above_500_and_data_streams() -> None:
    templates = [o for o in load_templates(default_templates_dir()) if o.kind == "index"]
    assert {o.name for o in templates} == {"logs-gpuops.decision", "logs-gpuops.audit"}
    for obj in templates:
        assert obj.body["priority"] > 500
        assert "data_stream" in obj.body


def test_every_field_of_every_document_shape_is_mapped_explicitly() -> None:
    fields = mapped_fields()
    unmapped = set()
    for doc in SHAPES.values():
        for path, _ in leaves(doc):
            covered = any(
                path == f or (path.startswith(f + ".") and t in ("flattened", "object"))
                for f, t in fields.items()
            )
            if not covered:
                unmapped.add(path)
    assert unmapped == set()


def test_kibana_objects_reference_only_objects_of_the_file() -> None:
    objects = [json.loads(line) for line in KIBANA.read_text().splitlines()]
    ids = {(o["type"], o["id"]) for o in objects}
    assert len(ids) == len(objects)
    for obj in objects:
        for ref in obj["references"]:
            assert (ref["type"], ref["id"]) in ids, ref
    titles = {o["attributes"]["title"] for o in objects if o["type"] == "search"}
    assert titles == {
        "actions by user",
        "failed actions",
        "suppressed decisions and why",
        "repeated actions on one target",
        "GPU out-of-memory by job",
    }
    views = {o["attributes"]["title"] for o in objects if o["type"] == "index-pattern"}
    assert views == {"logs-gpuops.decision-*", "logs-gpuops.audit-*"}
    (dashboard,) = [o for o in objects if o["type"] == "dashboard"]
    panels = json.loads(dashboard["attributes"]["panelsJSON"])
    assert {p["panelRefName"] for p in panels} == {r["name"] for r in dashboard["references"]}


def test_saved_searches_use_mapped_fields() -> None:
    fields = mapped_fields()
    objects = [json.loads(line) for line in KIBANA.read_text().splitlines()]
    for obj in objects:
        if obj["type"] == "search":
            for column in obj["attributes"]["columns"]:
                assert column in fields, column
