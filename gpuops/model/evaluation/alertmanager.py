"""The decision of a policy triggered by Alertmanager, about one alert (``evaluate_alert``).

Called by the runtime's alert inbox (``gpuops.runtime.alerts``) for each alert of a webhook
notification; no state machine: Alertmanager's own ``for`` and resolve decide when it fires
and clears. The guardrails judge the decision like any other.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuops.model.decisions import Decision, Evidence, Target, Transition, decision_id, freeze
from gpuops.model.rules.model import Policy
from gpuops.model.rules.templating import render


def evaluate_alert(
    policy: Policy, labels: Mapping[str, str], firing: bool, episode_start: float, now: float
) -> Decision | None:
    """The decision of an Alertmanager-triggered policy about one alert; None unless the alert
    carries all the policy's ``trigger.alertmanager`` labels, or is the policy's own alert
    exported by ``gpuops rules export`` (label ``gpuops_policy``). ``episode_start`` (the alert's
    ``startsAt``) makes the id stable: a retried webhook yields the same decision."""
    match = policy.trigger_alertmanager
    exported = labels.get("gpuops_policy") == policy.name  # from `gpuops rules export`
    if not exported and (not match or any(labels.get(k) != v for k, v in match.items())):
        return None
    target = Target.from_labels(labels, policy.target)
    transition = Transition.FIRE if firing else Transition.RESOLVE
    name = labels.get("alertname", "?")
    return Decision(
        id=decision_id(policy.name, target.key, episode_start, transition.value),
        policy=policy.name,
        group=policy.group,
        target=target,
        transition=transition,
        action=policy.action if firing else policy.on_clear,
        evidence=Evidence(
            expr=f"alertmanager: {name}", value=None, pending_since=episode_start, observed_at=now
        ),
        at=now,
        episode_start=episode_start,
        mode=policy.mode,
        labels=policy.labels,
        annotations=freeze({k: render(v, labels, None) for k, v in policy.annotations.items()}),
        reason=f"alert {name} {'firing' if firing else 'resolved'}",
    )
