"""A fleet that keeps its own record in files: its nodes' states (``fleet.json``), every change
with the nodes out of service just after it (``events.jsonl``), each node's calls in order
(``calls/NODE``), and the nodes file an engine plans over (``nodes.yaml``, ``batch.nodes``),
written whole on each change. Every change holds an exclusive ``flock`` on ``lock``.

``FileFleetExecutor`` (registered as ``rollout-fleet``, settings: ``dir``) drains
(``migrate``) and returns (``resume``) a node as the Slurm and Kubernetes executors do:
``resume`` returns only a node it drained.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from gpuops.model.decisions import Decision

NAME = "rollout-fleet"


class FileFleet:
    """The fleet's record in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def create(
        self, names: Sequence[str], drained: Sequence[str] = (), down: Sequence[str] = ()
    ) -> None:
        """A fleet of ``names`` (pool ``a100``, 8 GPUs each), some drained or down already."""
        (self.folder / "calls").mkdir(parents=True, exist_ok=True)
        state = {n: {"state": "up", "ours": False} for n in names}
        for name in drained:
            state[name]["state"] = "drained"
        for name in down:
            state[name]["state"] = "down"
        with self._locked():
            self._write(state)
            self._event(state, "", "start")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.folder / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def state(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = json.loads((self.folder / "fleet.json").read_text())
        return found

    def _write(self, state: Mapping[str, Mapping[str, Any]]) -> None:
        for name, text in (
            ("fleet.json", json.dumps(state)),
            (
                "nodes.yaml",
                yaml.safe_dump(
                    {
                        "nodes": [
                            {"name": n, "pool": "a100", "gpus": 8, "state": s["state"]}
                            for n, s in state.items()
                        ]
                    }
                ),
            ),
        ):
            part = self.folder / f".{name}.part"
            part.write_text(text)
            os.replace(part, self.folder / name)

    def _event(self, state: Mapping[str, Mapping[str, Any]], node: str, verb: str) -> None:
        out = sum(1 for s in state.values() if s["state"] != "up")
        with open(self.folder / "events.jsonl", "a") as events:
            events.write(json.dumps({"t": time.time(), "node": node, "verb": verb, "out": out}))
            events.write("\n")

    def change(self, node: str, verb: str, decision_id: str) -> dict[str, str]:
        """``migrate`` or ``resume`` ``node``, recorded; what it changed."""
        with self._locked():
            state = self.state()
            record = state[node]
            changed = {}
            if verb == "migrate" and record["state"] == "up":
                record.update(state="drained", ours=True)
                changed = {"node": node, "state": "drained"}
            elif verb == "resume" and record["ours"]:
                record.update(state="up", ours=False)
                changed = {"node": node, "state": "up"}
            self._write(state)
            self._event(state, node, verb)
            self.call(node, verb, decision_id)
        return changed

    def call(self, node: str, what: str, decision_id: str) -> None:
        with open(self.folder / "calls" / node, "a") as calls:
            calls.write(f"{what} {decision_id}\n")

    def events(self) -> list[dict[str, Any]]:
        lines = (self.folder / "events.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def calls(self) -> dict[str, list[tuple[str, str]]]:
        """Each node's calls, in order: (what, decision id)."""
        out: dict[str, list[tuple[str, str]]] = {}
        for path in sorted((self.folder / "calls").iterdir()):
            pairs = [line.split() for line in path.read_text().splitlines()]
            out[path.name] = [(what, ident) for what, ident in pairs]
        return out


class FileFleetExecutor:
    """Drains and returns the nodes of a ``FileFleet`` (settings: ``dir``)."""

    name = NAME
    verbs: frozenset[str] | None = frozenset({"migrate", "resume"})

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self.fleet = FileFleet(Path(str((settings or {})["dir"])))

    def run(self, decision: Decision) -> dict[str, str]:
        assert decision.action is not None
        node = decision.target.labels["node"]
        return self.fleet.change(node, decision.action.type, decision.id)
