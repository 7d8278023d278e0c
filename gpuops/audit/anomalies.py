"""``gpuops audit anomalies``: patterns in the audit trail that an SRE should look at.

Called by ``gpuops.cli.audit``. Every check is a filter plus a nested ``terms`` grouping (and a
``filter`` sub-aggregation): aggregations a Basic licence has, run server-side by the
Elasticsearch backend and locally by the spool backend, with the same results. The saved
searches in ``elk/kibana`` show the same patterns in Kibana.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuops.audit.query import AnyOf, Exists, Phrase, Term, TimeRange, all_of
from gpuops.audit.search import Backend, Level

OOM_PHRASES = ("out of memory", "oom", "cuda_error_out_of_memory", "outofmemoryerror")
"""Phrases of ``message`` / ``error.message`` that mean a GPU ran out of memory."""


@dataclass(frozen=True)
class AnomalySettings:
    """Thresholds of the checks; the window is [since, until] (epoch seconds)."""

    since: float
    until: float
    flap_min_episodes: int = 3
    """Episodes (first fires) of one policy on one target: firing and clearing this often
    in the window is flapping (a threshold too close to the noise, or a missing clear_expr)."""
    repeat_min_actions: int = 3
    """Executed runs of one action on one target."""
    node_min_failures: int = 3
    """Failed actions of one type on one node."""
    oom_min_failures: int = 2
    """Out-of-memory events of one job (and of one user's jobs, of jobs on one node)."""
    user_recent_s: float = 3600.0
    """A user's recent operations are those of the last hour of the window..."""
    user_min_ops: int = 20
    """...flagged when there are at least this many..."""
    user_factor: float = 3.0
    """...and this many times the user's average per hour over the rest of the window..."""
    user_min_history_ops: int = 3
    """...when the user has a history to compare with: at least this many operations in the
    window that are ``user_min_history_s`` or more older than the recent hour. Without one (the
    only user of a fresh install, a new user) there is no baseline, and nothing is flagged."""
    user_min_history_s: float = 6 * 3600.0
    """How much older than the recent hour a user's operations must be to count as history."""


@dataclass(frozen=True)
class Finding:
    """One anomaly: which check, the keys it is about, counts, and a sentence."""

    check: str
    keys: dict[str, str]
    count: int
    message: str
    extra: dict[str, float] = field(default_factory=dict)
    """Other figures of the finding by name (a target's actions in all, a user's baseline)."""


def find_anomalies(backend: Backend, settings: AnomalySettings) -> list[Finding]:
    """Run every check; findings in check order, then by count (as the aggregations order)."""
    window = TimeRange("@timestamp", settings.since, settings.until)
    return [
        *_flapping(backend, settings, window),
        *_repeated_targets(backend, settings, window),
        *_failing_on_node(backend, settings, window),
        *_oom_jobs(backend, settings, window),
        *_unusual_users(backend, settings, window),
    ]


def _flapping(backend: Backend, s: AnomalySettings, window: TimeRange) -> list[Finding]:
    groups = backend.group(
        # one document per episode: its first fire's intent (an executed one also has an
        # outcome document, type change); clears with nothing to undo are not recorded
        all_of(
            window,
            Term("gpuops.transition", ("fire",)),
            Term("gpuops.decision.repeat", ("0",)),
            Term("event.type", ("info",)),
        ),
        "decision",
        [Level("rule.name", 1000), Level("gpuops.target.key", 50, s.flap_min_episodes)],
    )
    return [
        Finding(
            "flapping_policy",
            {"policy": g.keys[0], "target": g.keys[1]},
            g.counts[1],
            f"policy {g.keys[0]} fired {g.counts[1]} times (episodes) on {g.keys[1]}",
        )
        for g in groups
    ]


def _repeated_targets(backend: Backend, s: AnomalySettings, window: TimeRange) -> list[Finding]:
    groups = backend.group(
        all_of(window, Term("event.outcome", ("success", "failure"))),
        "decision",
        [
            Level("gpuops.target.key", 100, s.repeat_min_actions),
            Level("event.action", 10, s.repeat_min_actions),  # the same action, again and again
        ],
    )
    return [
        Finding(
            "repeated_target",
            {"target": g.keys[0], "action": g.keys[1]},
            g.counts[1],
            f"{g.keys[1]} ran {g.counts[1]} times on {g.keys[0]} "
            f"({g.counts[0]} actions on it in all)",
            {"actions_on_target": g.counts[0]},
        )
        for g in groups
    ]


def _failing_on_node(backend: Backend, s: AnomalySettings, window: TimeRange) -> list[Finding]:
    groups = backend.group(
        all_of(window, Term("event.outcome", ("failure",))),
        "decision",
        [Level("labels.node", 1000), Level("event.action", 20, s.node_min_failures)],
    )
    return [
        Finding(
            "failing_on_node",
            {"node": g.keys[0], "action": g.keys[1]},
            g.counts[1],
            f"{g.keys[1]} failed {g.counts[1]} times on node {g.keys[0]}",
        )
        for g in groups
    ]


def _oom_jobs(backend: Backend, s: AnomalySettings, window: TimeRange) -> list[Finding]:
    """GPU out-of-memory events (failed actions, Slurm job runs: ``gpuops.audit.jobs``) that
    repeat for one job, one user or one node."""
    oom = AnyOf(
        tuple(Phrase(f, p) for f in ("message", "error.message") for p in OOM_PHRASES)
        + (Term("labels.reason", ("oom", "OOM", "out_of_memory", "OutOfMemory")),)
    )
    found: list[Finding] = []
    for check, key in (("oom_job", "job"), ("oom_user", "user"), ("oom_node", "node")):
        groups = backend.group(
            all_of(window, Exists("labels.job"), oom),
            "all",
            [Level(f"labels.{key}", 100, s.oom_min_failures)],
        )
        found += [
            Finding(
                check,
                {key: g.keys[0]},
                g.counts[0],
                f"{'job' if key == 'job' else f'jobs of {key}'} {g.keys[0]} hit GPU "
                f"out-of-memory {g.counts[0]} times",
            )
            for g in groups
        ]
    return found


def _unusual_users(backend: Backend, s: AnomalySettings, window: TimeRange) -> list[Finding]:
    recent_since = max(s.since, s.until - s.user_recent_s)
    groups = backend.group(
        window,
        "audit",
        [Level("user.name", 1000)],
        recent=TimeRange("@timestamp", recent_since, s.until),
    )
    history_until = recent_since - s.user_min_history_s
    history: dict[str, int] = {}
    if history_until > s.since:
        old = backend.group(
            window,
            "audit",
            [Level("user.name", 1000)],
            recent=TimeRange("@timestamp", s.since, history_until),
        )
        history = {g.keys[0]: g.recent or 0 for g in old}
    earlier_hours = max((recent_since - s.since) / s.user_recent_s, 1.0)
    found: list[Finding] = []
    for g in groups:
        recent = g.recent or 0
        baseline = (g.counts[0] - recent) / earlier_hours
        known = history.get(g.keys[0], 0) >= s.user_min_history_ops
        if known and recent >= s.user_min_ops and recent > s.user_factor * baseline:
            found.append(
                Finding(
                    "unusual_user_operations",
                    {"user": g.keys[0]},
                    recent,
                    f"user {g.keys[0]} made {recent} operations in the last "
                    f"{s.user_recent_s / 3600:g}h, {baseline:.1f} per {s.user_recent_s / 3600:g}h "
                    "before",
                    {"baseline": round(baseline, 3)},
                )
            )
    return found
