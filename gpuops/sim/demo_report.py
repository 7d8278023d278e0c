"""What ``gpuops demo`` tells at the end: what the engine did, what its guardrails held back
(with the audit record of one such decision), what a new dry-run policy would have done, and
the counts behind it — in sentences a newcomer reads without knowing the code.

``gpuops.sim.demo`` fills a ``DemoReport`` from the decisions as they happen and from the audit
spool at the end, and prints ``summary``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuops.model.decisions import Decision, Outcome
from gpuops.model.telling import effect, plural

WHY: Mapping[str, str] = {
    "max_fraction": "blast radius: a policy may act on only this share of its targets per hour; "
    "several nodes down at once may be a network partition, not dead nodes",
    "max_per_hour": "rate limit: a policy may act only this often per hour",
    "cooldown": "cooldown: no new action on a target for a while after the last one",
    "global_budget": "global budget: all policies together may act only this often per hour",
    "kill_switch": "the kill switch is on: nothing runs",
    "paused": "the engine is paused: nothing runs",
}
"""What each guardrail is for, said once per suppression reason in the summary."""

AUDIT_FIELDS = (
    "@timestamp",
    "rule.name",
    "event.action",
    "event.outcome",
    "gpuops.target.key",
    "gpuops.verdict",
    "event.reason",
)
"""The fields of an audit record the summary shows (the whole document is in the spool)."""


@dataclass(frozen=True)
class Held:
    """A decision that was taken but not executed."""

    decision_id: str
    policy: str
    action: str
    target: str
    verdict: str
    reason: str


@dataclass
class DemoReport:
    decisions: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    held_back: list[Held] = field(default_factory=list)
    """Suppressed by a guardrail (kill switch and pause included)."""
    dry_runs: list[Held] = field(default_factory=list)
    """Decided by a policy in dry-run: recorded, never executed."""
    held_back_record: dict[str, Any] | None = None
    """The audit document of the first held-back decision (AUDIT_FIELDS of it)."""
    repeats: int = 0
    """Re-decisions of a recorded suppression: counted (``held_repeats`` of the next record,
    the targets' state, ``gpuops_engine_suppressed_total``), not recorded again."""
    start_utilization: float | None = None
    end_utilization: float | None = None
    counters: dict[str, int] = field(default_factory=dict)
    audit_dir: Path | None = None
    audit_documents: int = 0

    def add(self, decision: Decision, outcome: Outcome | None) -> None:
        self.decisions[(decision.policy, decision.transition.value, decision.verdict)] += 1
        self.repeats += decision.held_repeats
        if outcome is not None:
            self.outcomes[outcome.status.value] += 1
            verb = decision.action.type if decision.action is not None else None
            if outcome.ok and not effect(verb, outcome.changed).did:
                self.outcomes["no effect"] += 1  # ran, and changed nothing its verb promises
        if decision.action is None:
            return
        held = Held(
            decision.id,
            decision.policy,
            decision.action.type,
            decision.target.key,
            decision.verdict,
            decision.reason,
        )
        if decision.verdict.startswith("suppressed:"):
            self.held_back.append(held)
        elif decision.verdict == "dry_run":
            self.dry_runs.append(held)

    def add_repeats(self, held_now: int) -> None:
        """Add the re-decisions of suppressions still holding their targets at the end."""
        self.repeats += held_now

    def find_record(self, documents: Iterable[Mapping[str, Any]]) -> None:
        """Keep the audit record of the first held-back decision, from the spool."""
        if not self.held_back:
            return
        first = self.held_back[0]
        for doc in documents:
            gpuops = doc.get("gpuops", {})
            if (gpuops.get("decision") or {}).get("id") == first.decision_id and gpuops.get(
                "verdict"
            ) == first.verdict:
                self.held_back_record = {f: _get(doc, f) for f in AUDIT_FIELDS}
                return

    def summary(self, elapsed: float) -> str:
        lines = [f"== gpuops demo summary ({elapsed:.0f} s) =="]
        lines += self._what_ran()
        lines += self._what_was_held_back()
        lines += self._what_dry_run_would_do()
        lines.append("decisions by policy, transition and verdict:")
        for (policy, transition, verdict), n in sorted(self.decisions.items()):
            lines.append(f"  {policy:<28} {transition:<6} {verdict:<28} {n}")
        if not self.decisions:
            lines.append("  (none)")
        lines.append(
            "mean utilization of allocated GPUs: "
            f"start {fmt(self.start_utilization)} -> end {fmt(self.end_utilization)}"
        )
        lines.append(f"audit spool: {self.audit_dir} ({self.audit_documents} ECS documents)")
        lines.append(f"  search it: gpuops audit search --spool-dir {self.audit_dir}")
        return "\n".join(lines)

    def _what_ran(self) -> list[str]:
        c = self.counters
        ran = sum(n for status, n in self.outcomes.items() if status != "no effect")
        failed = self.outcomes.get("failure", 0)
        idle = self.outcomes.get("no effect", 0)
        said = [f"{failed} failed"] if failed else []
        said += [f"{idle} changed nothing"] if idle else []
        return [
            f"The engine ran {plural(ran, 'action')} through the fleet's control API"
            + (f" ({', '.join(said)})" if said else "")
            + ":",
            f"  GPUs reclaimed: {c.get('reclaimed', 0)}   nodes added: {c.get('nodes_added', 0)}   "
            f"jobs migrated: {c.get('migrated', 0)}   "
            f"jobs requeued for want of a node: {c.get('requeued_by_migrate', 0)}   "
            f"GPUs downclocked: {c.get('downclocked', 0)}   "
            f"clocks restored: {c.get('restored', 0)}",
        ]

    def _what_was_held_back(self) -> list[str]:
        if not self.held_back:
            return ["No guardrail had to hold anything back."]
        lines = [
            f"The guardrails held back {plural(len(self.held_back), 'decision')} "
            "(recorded and audited, not executed):"
        ]
        seen: set[str] = set()
        for h in self.held_back:
            lines.append(f"  {h.policy}: {h.action} on {h.target} -> {h.verdict}")
            if h.reason:
                lines.append(f"    because: {h.reason}")
            kind = h.verdict.partition(":")[2]
            if kind in WHY and kind not in seen:
                seen.add(kind)
                lines.append(f"    ({WHY[kind]})")
        repeats = self.repeats
        if repeats > 0:
            lines.append(
                f"  each is recorded once: the engine decided them again {plural(repeats, 'time')}"
                " without new records (counted in gpuops_engine_suppressed_total; `gpuops "
                "decisions explain ID` says whether one still holds and since when)"
            )
        if self.held_back_record is not None:
            lines.append("  the audit record of the first one:")
            lines.append(f"    {json.dumps(self.held_back_record)}")
        return lines

    def _what_dry_run_would_do(self) -> list[str]:
        if not self.dry_runs:
            return []
        policies = sorted({h.policy for h in self.dry_runs})
        lines = [
            f"Policies in dry-run decided {plural(len(self.dry_runs), 'action')} and executed none "
            "(a new policy runs in dry-run until its file says mode: enforce):"
        ]
        lines += [f"  {h.policy}: would {h.action} on {h.target}" for h in self.dry_runs]
        lines.append(f"  to let {', '.join(policies)} act: set mode: enforce in its rule file")
        return lines


def _get(doc: Mapping[str, Any], dotted: str) -> Any:
    if dotted in doc:
        return doc[dotted]
    node: Any = doc
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def fmt(v: float | None) -> str:
    """A ratio with two decimals, or n/a."""
    return "n/a" if v is None else f"{v:.2f}"
