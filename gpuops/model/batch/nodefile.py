"""A nodes file to the ``FleetNode``s an operation is planned over, every problem as
``FILE:LINE: field: what``.

The fleet as a list (``nodes:``: name, pool, gpus, features, labels, state, reason) for a plan
made away from the cluster, and for the tests; the engine reads its fleet from Slurm or
Kubernetes instead. Called by ``gpuops.cli.batch``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuops.model.batch.operation import Availability, FleetNode
from gpuops.model.rules.messages import from_yaml, located, unknown_key
from gpuops.model.rules.model import RuleError, RulesError
from gpuops.model.rules.schema import describe
from gpuops.model.rules.yamlsource import YamlPath, parse_yaml

_NODE = ("features", "gpus", "labels", "name", "pool", "reason", "state")
_STATES = tuple(a.value for a in Availability)


def parse_nodes(text: str, file: str) -> tuple[FleetNode, ...]:
    """The nodes in ``text``; ``RulesError`` lists every problem."""
    data, positions, problems = parse_yaml(text)
    errors = [from_yaml(file, p) for p in problems]

    def fail(path: YamlPath, message: str) -> None:
        errors.append(located(file, positions.value_line(path), path, message))

    nodes: list[FleetNode] = []
    items = data.get("nodes") if isinstance(data, dict) else None
    if not errors and not isinstance(items, list):
        fail(("nodes",), f"expected a list of nodes, found {describe(items)}")
    seen: set[str] = set()
    for i, item in enumerate(items if isinstance(items, list) else []):
        path: YamlPath = ("nodes", i)
        if not isinstance(item, dict):
            fail(path, f"expected a mapping, found {describe(item)}")
            continue
        for key in item:
            if key not in _NODE:
                fail((*path, str(key)), unknown_key(str(key), list(_NODE)))
        node = _node(item, path, fail)
        if node is None:
            continue
        if node.name in seen:
            fail((*path, "name"), f"node {node.name} is listed twice")
        seen.add(node.name)
        nodes.append(node)
    if errors:
        raise RulesError(errors)
    return tuple(nodes)


def _node(item: dict[str, Any], path: YamlPath, fail: Any) -> FleetNode | None:
    name = item.get("name")
    if not isinstance(name, str) or not name:
        fail((*path, "name"), f"expected the node's name, found {describe(name)}")
        return None
    gpus = item.get("gpus", 0)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
        fail((*path, "gpus"), f"expected a whole number of GPUs, found {describe(gpus)}")
        gpus = 0
    state = item.get("state", "up")
    if state not in _STATES:
        fail((*path, "state"), f"expected one of {', '.join(_STATES)}, found {describe(state)}")
        state = "up"
    features = item.get("features", [])
    if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
        fail((*path, "features"), f"expected a list of names, found {describe(features)}")
        features = []
    labels = item.get("labels", {})
    if not isinstance(labels, dict):
        fail((*path, "labels"), f"expected a mapping, found {describe(labels)}")
        labels = {}
    return FleetNode(
        name=name,
        pool=str(item.get("pool", "")),
        gpus=gpus,
        features=frozenset(features),
        labels={str(k): str(v) for k, v in labels.items()},
        availability=Availability(state),
        reason=str(item.get("reason", "")),
    )


def load_nodes(path: Path) -> tuple[FleetNode, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RulesError([RuleError(str(path), 1, f"cannot read the file: {exc}")]) from None
    return parse_nodes(text, str(path))
