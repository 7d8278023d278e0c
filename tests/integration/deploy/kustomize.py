"""An offline renderer of deploy/kubernetes's kustomizations, as kustomize renders what they
use, for tests/integration/deploy/test_kubernetes_manifests.py (which also compares it with
``kubectl kustomize`` where kubectl is installed):

- ``resources`` (files and directories) and ``components`` (directories whose
  ``kind: Component`` kustomization adds its resources and applies its patches to what the
  including kustomization holds so far, in the order listed, before that one's own patches);
- ``patches`` from a ``path``: a strategic merge patch made only of mappings (then a merge of
  mappings), or, with a ``target``, a JSON patch (RFC 6902: ``add``, ``remove``, ``replace``,
  ``test``; a failed ``test`` fails the rendering, as in kustomize);
- ``namespace`` and ``images``.

Anything else in a kustomization is refused, so that a manifest never relies on a part of
kustomize this renderer would get wrong.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

Doc = dict[str, Any]

CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding"}
FIELDS = {"apiVersion", "kind", "namespace", "resources", "components", "patches", "images"}
"""What a kustomization here may hold."""


class RenderError(AssertionError):
    """A kustomization this renderer (or kustomize) cannot render."""


def load_docs(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def key(doc: Doc) -> tuple[str, str, str]:
    return (doc["apiVersion"], doc["kind"], doc["metadata"]["name"])


def pod_spec(doc: Doc) -> Doc | None:
    template = doc.get("spec", {}).get("template")
    return template["spec"] if template else None


def containers(doc: Doc) -> Iterator[Doc]:
    spec = pod_spec(doc)
    yield from (spec or {}).get("containers", [])


def merge(base: Doc, patch: Doc) -> Doc:
    """A strategic merge patch made only of mappings: a recursive merge of mappings."""
    out = copy.deepcopy(base)
    for name, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(name), dict):
            out[name] = merge(out[name], value)
        else:
            out[name] = copy.deepcopy(value)
    return out


def render(folder: Path) -> list[Doc]:
    """The objects of the kustomization in ``folder`` (module docstring)."""
    k = _kustomization(folder, "Kustomization")
    docs: list[Doc] = []
    for resource in k.get("resources", []):
        path = (folder / resource).resolve()
        docs += render(path) if path.is_dir() else load_docs(path)
    for component in k.get("components", []):
        docs = _component((folder / component).resolve(), docs)
    docs = _patch(folder, k, docs)
    for doc in docs:
        if "namespace" in k and doc["kind"] not in CLUSTER_SCOPED:
            doc["metadata"]["namespace"] = k["namespace"]
        for image in k.get("images", []):
            for container in containers(doc):
                if container["image"] == image["name"]:
                    container["image"] = f"{image['newName']}:{image['newTag']}"
    return docs


def _kustomization(folder: Path, kind: str) -> Doc:
    k: Doc = load_docs(folder / "kustomization.yaml")[0]
    if k.get("kind", "Kustomization") != kind:
        raise RenderError(f"{folder}: a {k.get('kind')}, where a {kind} is expected")
    unknown = set(k) - FIELDS
    if unknown:
        raise RenderError(f"{folder}: this renderer does not implement {sorted(unknown)}")
    return k


def _component(folder: Path, docs: list[Doc]) -> list[Doc]:
    k = _kustomization(folder, "Component")
    for resource in k.get("resources", []):
        docs = docs + load_docs(folder / resource)
    return _patch(folder, k, docs)


def _patch(folder: Path, k: Doc, docs: list[Doc]) -> list[Doc]:
    docs = list(docs)
    for patch in k.get("patches", []):
        name = patch["path"]
        loaded = load_docs(folder / name)
        if len(loaded) == 1 and isinstance(loaded[0], list):  # a JSON patch: a list of ops
            if "target" not in patch:
                raise RenderError(f"{name}: a JSON patch needs a target")
            for doc in selected(docs, patch["target"], name):
                docs[docs.index(doc)] = json_patch(doc, loaded[0], name)
            continue
        for change in loaded:
            matches = [d for d in docs if key(d) == key(change)]
            if len(matches) != 1:
                raise RenderError(f"{name}: patches no single object {key(change)}")
            docs[docs.index(matches[0])] = merge(matches[0], change)
    return docs


def selected(docs: list[Doc], target: Doc, name: str) -> list[Doc]:
    """The objects a patch's ``target`` selects: each of its fields a regular expression the
    whole value matches, as kustomize's selectors are."""
    unknown = set(target) - {"group", "version", "kind", "name", "namespace"}
    if unknown:
        raise RenderError(f"{name}: this renderer does not select by {sorted(unknown)}")

    def fields(doc: Doc) -> dict[str, str]:
        group, _, version = doc["apiVersion"].rpartition("/")
        return {
            "group": group,
            "version": version,
            "kind": doc["kind"],
            "name": doc["metadata"]["name"],
            "namespace": doc["metadata"].get("namespace", ""),
        }

    found = [
        d for d in docs if all(re.fullmatch(str(want), fields(d)[f]) for f, want in target.items())
    ]
    if not found:
        raise RenderError(f"{name}: its target {target} selects nothing")
    return found


def json_patch(doc: Doc, ops: list[Doc], name: str = "patch") -> Doc:
    """``doc`` with the RFC 6902 operations ``ops`` applied (a copy)."""
    out = copy.deepcopy(doc)
    for op in ops:
        where = op["path"]
        parent, last = _parent(out, where, name)
        kind = op["op"]
        if kind == "test":
            if _get(parent, last, where, name) != op["value"]:
                raise RenderError(f"{name}: testing value {where} failed")
        elif kind == "add":
            value = copy.deepcopy(op["value"])
            if isinstance(parent, list):
                index = len(parent) if last == "-" else _index(parent, last, where, name, 1)
                parent.insert(index, value)
            else:
                parent[last] = value
        elif kind in ("replace", "remove"):
            _get(parent, last, where, name)  # both need the value to be there
            slot: Any = _index(parent, last, where, name, 0) if isinstance(parent, list) else last
            if kind == "remove":
                del parent[slot]
            else:
                parent[slot] = copy.deepcopy(op["value"])
        else:
            raise RenderError(f"{name}: this renderer does not implement op {kind!r}")
    return out


def _tokens(pointer: str, name: str) -> list[str]:
    if not pointer.startswith("/"):
        raise RenderError(f"{name}: {pointer!r} is not a JSON pointer")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _parent(doc: Doc, pointer: str, name: str) -> tuple[Any, str]:
    *path, last = _tokens(pointer, name)
    node: Any = doc
    for token in path:
        node = _get(node, token, pointer, name)
    if not isinstance(node, dict | list):
        raise RenderError(f"{name}: {pointer}: its parent is neither an object nor a list")
    return node, last


def _get(node: Any, token: str, pointer: str, name: str) -> Any:
    if isinstance(node, list):
        return node[_index(node, token, pointer, name, 0)]
    if isinstance(node, dict) and token in node:
        return node[token]
    raise RenderError(f"{name}: {pointer}: no {token!r} there")


def _index(node: list[Any], token: str, pointer: str, name: str, past_end: int) -> int:
    """A list's index ``token``: 0 to its length less 1 (to its length with ``past_end``)."""
    if not re.fullmatch(r"0|[1-9][0-9]*", token) or int(token) >= len(node) + past_end:
        raise RenderError(f"{name}: {pointer}: {token!r} is no index of a list of {len(node)}")
    return int(token)
