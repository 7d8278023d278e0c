"""The validated, frozen form of a rule set. Durations are seconds (float).

Built by ``gpuops.model.rules.loader``; read by evaluation, guardrails and the runtime.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from gpuops.model.decisions import EMPTY, ActionSpec

MAX_COOLDOWN_S = 30 * 86400.0
"""The longest cooldown: how long the guardrails remember the last action on a target
(``gpuops.model.guardrails.MEMORY_S``). A longer one is refused, never silently capped."""


@dataclass(frozen=True)
class Policy:
    """One policy of a group (docs/policies.md)."""

    name: str
    group: str
    expr: str | None
    """PromQL; None only for policies triggered by Alertmanager alone."""
    action: ActionSpec
    description: str = ""
    for_s: float = 0.0
    keep_firing_for_s: float = 0.0
    clear_expr: str | None = None
    target: tuple[str, ...] | None = None
    """Labels that identify what is acted on; None: all labels of the series."""
    on_clear: ActionSpec | None = None
    cooldown_s: float = 0.0
    repeat_interval_s: float | None = None
    """Act again while still firing after this long; None: once per episode."""
    max_per_hour: int | None = None
    max_fraction: float | None = None
    population: str | None = None
    """PromQL whose series count is the population ``max_fraction`` is a fraction of
    (``limits.population``). None: every distinct combination of the ``target`` labels in any
    series, ``count(group by (node, uuid) ({node!="", uuid!=""}))`` for ``target: [node, uuid]``."""
    mode: str = "dry-run"
    """enforce | dry-run (dry-run is the default for a new policy)."""
    on_no_data: str = "hold"
    """hold | skip: what a failed query does (neither ever acts)."""
    approval: str = "none"
    """none | required."""
    schedule: str | None = None
    """Cron expression: evaluated at these times instead of on the group interval."""
    trigger_alertmanager: Mapping[str, str] | None = None
    """Alert labels that trigger this policy through the Alertmanager webhook."""
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    source: str = ""
    """Where it was defined: ``file:line``."""
    path: str = ""
    """Where in its file: ``groups[0].rules[1]`` (for messages about it, e.g. from promtool)."""
    key_lines: Mapping[str, int] = field(default_factory=lambda: EMPTY)
    """Line of each key of the policy in its file (``{"expr": 12}``), for messages."""


def cron_time(at: float) -> float:
    """The cron time of a scheduled run that started at ``at``: the start of its minute. Cron
    times are whole minutes and the scheduler starts a job a few milliseconds after its time
    (at most its misfire grace, under a minute, late), so a run evaluated at the clock instead
    would find ``repeat_interval: 1m`` not yet over (59.99 s) at every other minute."""
    return float(at - at % 60)


@dataclass(frozen=True)
class Group:
    name: str
    interval_s: float
    policies: tuple[Policy, ...]
    source: str = ""
    max_sample_age_s: float | None = None
    """The group's own bound on sample age (None: the engine's ``prometheus.max_sample_age``)."""


@dataclass(frozen=True)
class RuleSet:
    groups: tuple[Group, ...] = ()
    files: tuple[str, ...] = ()

    def policies(self) -> Iterator[Policy]:
        for group in self.groups:
            yield from group.policies

    def policy(self, name: str) -> Policy | None:
        return next((p for p in self.policies() if p.name == name), None)


@dataclass(frozen=True)
class RuleError:
    """One problem in a rule file, printed as ``file:line: message``."""

    file: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


@dataclass
class RulesError(Exception):
    """A rule set that cannot be used; the running rules stay in place."""

    errors: list[RuleError] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)
