"""The engine's own Prometheus metrics, on a registry the runtime owns (never the global one).

Created by ``gpuops.runtime.facade.Engine`` (or handed to it) and counted by every runtime
module; served by the engine's metrics listener and by the API.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass(frozen=True)
class EngineMetrics:
    registry: CollectorRegistry
    evaluations: Counter
    evaluation_duration: Histogram
    query_failures: Counter
    state_errors: Counter
    decisions: Counter
    actions: Counter
    action_duration: Histogram
    rules_loaded: Gauge
    reloads: Counter
    last_reload_success: Gauge
    kill_switch: Gauge
    paused: Gauge
    held: Counter
    suppressed: Counter
    audit_write_failures: Counter
    audit_healthy: Gauge
    permanent_failures: Counter
    clock_steps: Counter
    leader: Gauge
    leadership_changes: Counter

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None) -> EngineMetrics:
        r = registry or CollectorRegistry()
        return cls(
            registry=r,
            evaluations=Counter(
                "gpuops_engine_evaluations", "Policy evaluations.", ["group", "policy"], registry=r
            ),
            evaluation_duration=Histogram(
                "gpuops_engine_evaluation_duration_seconds",
                "Wall time of one evaluation of a group, queries and judgement included.",
                ["group"],
                buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
                registry=r,
            ),
            query_failures=Counter(
                "gpuops_engine_query_failures",
                "Queries that failed; their evaluations were skipped and changed no state.",
                ["policy"],
                registry=r,
            ),
            state_errors=Counter(
                "gpuops_engine_state_errors",
                "Evaluations skipped because the policy's stored state could not be decoded.",
                ["policy"],
                registry=r,
            ),
            decisions=Counter(
                "gpuops_engine_decisions",
                "Decisions by policy, transition and verdict.",
                ["policy", "transition", "verdict"],
                registry=r,
            ),
            actions=Counter(
                "gpuops_engine_actions",
                "Executed actions by executor, action type and outcome (success, no_effect: it"
                " ran and changed nothing its verb promises, failure, skipped).",
                ["executor", "action", "outcome"],
                registry=r,
            ),
            action_duration=Histogram(
                "gpuops_engine_action_duration_seconds",
                "Wall time of executed actions, retries included.",
                ["executor"],
                registry=r,
            ),
            rules_loaded=Gauge(
                "gpuops_engine_policies", "Policies in the running rule set.", registry=r
            ),
            reloads=Counter(
                "gpuops_engine_rule_reloads", "Rule reloads by result.", ["result"], registry=r
            ),
            last_reload_success=Gauge(
                "gpuops_engine_last_reload_success_timestamp_seconds",
                "When the running rule set was loaded.",
                registry=r,
            ),
            kill_switch=Gauge(
                "gpuops_engine_kill_switch", "1 while the kill switch is on.", registry=r
            ),
            paused=Gauge("gpuops_engine_paused", "1 while the engine is paused.", registry=r),
            held=Counter(
                "gpuops_engine_actions_held",
                "Actions the gate held at the moment of execution, by reason (kill_switch, "
                "paused, dry_run, global_budget, audit_unwritable).",
                ["reason"],
                registry=r,
            ),
            suppressed=Counter(
                "gpuops_engine_suppressed",
                "Decisions the guardrails held back, by policy and reason, each re-decision "
                "counted: a suppression is recorded once when it starts or its reason changes, "
                "its repeats only here and in the next record's held_repeats.",
                ["policy", "reason"],
                registry=r,
            ),
            audit_write_failures=Counter(
                "gpuops_engine_audit_write_failures",
                "Intents or outcomes the gate could not write to the audit spool (an intent "
                "not written: its action did not run and waits for the spool).",
                ["what"],
                registry=r,
            ),
            audit_healthy=Gauge(
                "gpuops_engine_audit_writable",
                "1 while the gate can write intents to the audit spool (0: no action runs).",
                registry=r,
            ),
            permanent_failures=Counter(
                "gpuops_engine_permanent_failures",
                "Actions that failed permanently (not retried within the episode).",
                ["policy"],
                registry=r,
            ),
            clock_steps=Counter(
                "gpuops_engine_clock_steps",
                "Wall-clock steps the scheduler detected (wall minus monotonic jumped); each "
                "re-anchored the group grids and cron schedules.",
                ["direction"],
                registry=r,
            ),
            leader=Gauge(
                "gpuops_engine_leader",
                "1 while this replica is the leader (evaluates and acts), 0 while a standby "
                "(docs/ha.md); a single engine on SQLite is always the leader.",
                registry=r,
            ),
            leadership_changes=Counter(
                "gpuops_engine_leadership_changes",
                "Times this replica became the leader or stopped leading.",
                ["change"],
                registry=r,
            ),
        )
