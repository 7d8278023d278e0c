"""Reading YAML with positions: PyYAML composes the node tree (which carries the line of every
key and item) and ``Reader`` turns it into plain data plus a path -> line map, so that every
problem can name its line.

Used by ``gpuops.sim.fleet.fleetfile.load``. The simulated fleet does not import the engine,
so it has this reader of its own.
"""

from __future__ import annotations

from typing import Any

import yaml

Path_ = tuple[str | int, ...]
"""Where a key is in the file: its keys and item indexes from the top."""


class Reader:
    """Turns a composed YAML node tree into plain data, recording the line of every key."""

    def __init__(self) -> None:
        self.lines: dict[Path_, int] = {}
        self.problems: list[tuple[int, str]] = []
        self._constructor = yaml.SafeLoader("")

    def read(self, node: yaml.Node, path: Path_) -> Any:
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            data: dict[Any, Any] = {}
            seen: dict[Any, int] = {}
            for key_node, value_node in node.value:
                key = self._constructor.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if not isinstance(key, str | int | float | bool):
                    self.problems.append((line, "a key must be a plain value"))
                    continue
                if key in seen:
                    self.problems.append(
                        (line, f'duplicate key "{key}" (check lines {seen[key]} and {line})')
                    )
                seen[key] = line
                child = (*path, key if isinstance(key, str | int) else str(key))
                self.lines[child] = line
                data[key] = self.read(value_node, child)
            return data
        if isinstance(node, yaml.SequenceNode):
            return [self.read(item, (*path, i)) for i, item in enumerate(node.value)]
        return self._constructor.construct_object(node)

    def line(self, path: Path_) -> int:
        for end in range(len(path), -1, -1):
            line = self.lines.get(path[:end])
            if line is not None:
                return line
        return 1
