"""Label selectors as gpuops' Kubernetes settings hold them (the node selector, the veto, the
drain modes' rules) and as PodDisruptionBudgets name their pods: parsed once, matched against an
object's labels here (the API server matches the node selector itself when gpuops lists nodes).
Used by the ``kubernetes`` executor (``gpuops.actions.kubernetes``) and its drain.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

_REQUIREMENT = re.compile(
    r"^\s*(!?)\s*([A-Za-z0-9][-A-Za-z0-9_./]*)\s*(?:(==|=|!=)\s*([-A-Za-z0-9_.]*))?\s*$"
)


@dataclass(frozen=True)
class Selector:
    """An equality-based label selector (``a=b,c!=d,e,!f``), as the API server reads one."""

    requirements: tuple[tuple[str, str, str], ...]

    @classmethod
    def parse(cls, text: str) -> Selector:
        out = []
        for part in text.split(",") if text.strip() else []:
            m = _REQUIREMENT.fullmatch(part)
            if m is None:
                raise ValueError(
                    f"{part.strip()!r} is not a label selector requirement "
                    "(key=value, key!=value, key or !key)"
                )
            negated, key, op, value = m.groups()
            if negated and op:
                raise ValueError(f"{part.strip()!r}: '!' takes a key alone")
            out.append(
                (key, "!" if negated else ("!=" if op == "!=" else "=" if op else ""), value or "")
            )
        return cls(tuple(out))

    def matches(self, labels: Mapping[str, str]) -> bool:
        for key, op, value in self.requirements:
            have = labels.get(key)
            if (
                (op == "=" and have != value)
                or (op == "!=" and have == value)
                or (op == "" and have is None)
                or (op == "!" and have is not None)
            ):
                return False
        return bool(self.requirements)
