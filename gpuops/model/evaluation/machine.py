"""The per-target state machine: how one target of one policy moves from pending to firing, fires
again, clears, and which ``Decision`` each move makes (its stable id, reason, annotations).

Per (policy, target key) a target is ``pending`` then ``firing``, exactly like a Prometheus
alerting rule, plus hysteresis (``clear_expr``), ``keep_firing_for``, ``repeat_interval`` and
stable decision ids. Called by the evaluator's general path and by the fast paths
(``gpuops.model.evaluation.evaluator``, ``fastpath``), which decide targets the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from functools import lru_cache
from types import MappingProxyType

from gpuops.model.decisions import (
    Decision,
    Evidence,
    Sample,
    Target,
    Transition,
    Vector,
    decision_id,
    key_value,
)
from gpuops.model.evaluation.state import Status, TargetState
from gpuops.model.rules.model import Policy
from gpuops.model.rules.templating import PLACEHOLDER
from gpuops.model.telling import value_in_words


def index_targets(policy: Policy, samples: Iterable[Sample]) -> dict[str, tuple[Target, Sample]]:
    """Group samples by target key; several series of one target keep the first one seen."""
    found: dict[str, tuple[Target, Sample]] = {}
    for sample in samples:
        target = Target.from_labels(sample.labels, policy.target)
        found.setdefault(target.key, (target, sample))
    return found


def by_key(policy: Policy, samples: Iterable[Sample]) -> dict[str, Sample]:
    """``index_targets`` without building a ``Target`` per sample (most targets of an
    evaluation were seen before: their ``Target`` is built only when a decision needs it)."""
    found: dict[str, Sample] = {}
    names = policy.target
    keys = samples.target_keys(names) if isinstance(samples, Vector) else None
    if keys is not None:
        assert isinstance(samples, Vector)
        for index, key in enumerate(keys):
            if key not in found:
                found[key] = samples[index]
        return found
    if not names:
        for sample in samples:
            found.setdefault(Target.from_labels(sample.labels, names).key, sample)
        return found
    parts = _key_parts(names)
    for sample in samples:
        get = sample.labels.get
        key = ",".join([prefix + key_value(get(name, "")) for prefix, name in parts])
        if key not in found:
            found[key] = sample
    return found


@lru_cache(maxsize=4096)
def _key_parts(names: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(``name=``, name) per target label, in the order ``Target.from_labels`` keys them."""
    return tuple((f"{name}=", name) for name in sorted(set(names) - {"__name__"}))


def target_step(
    policy: Policy,
    key: str,
    prev: TargetState | None,
    sample: Sample,
    cleared: bool,
    now: float,
    max_gap_s: float,
) -> tuple[str, TargetState | None, Decision | None]:
    """One target in the answer, as the general path decides it (its shortcuts for a
    pending target seen again and a firing one with nothing to decide give the same): its
    key (interned when new: ``Target.from_labels``), its next state (None: it cleared) and
    its decision, if any."""
    target = (
        Target(key, prev.labels)
        if prev is not None
        else Target.from_labels(sample.labels, policy.target)
    )
    if prev is not None and prev.status is Status.FIRING and cleared:
        return key, None, decide(policy, target, prev, Transition.CLEAR, now, sample.value)
    if prev is not None and prev.status is Status.CLEARING:
        # the condition is back before its undo could run: the action's effect is still
        # in place, so the target is firing again without acting again
        prev = replace(
            prev,
            status=Status.FIRING,
            retry_at=None,
            repeats=prev.repeats + 1,  # the next clear is a new decision, with a new id
            fired_at=prev.fired_at or now,
            last_fire_at=prev.last_fire_at or now,  # repeat_interval goes on from here
            held=None,  # the undo's suppression is not the fire's
            held_since=None,
            held_repeats=0,
        )
    current = observe(prev, target, sample, now, max_gap_s)
    current, decision = advance(policy, target, current, now)
    return target.key, current, decision


def observe(
    prev: TargetState | None, target: Target, sample: Sample, now: float, max_gap_s: float
) -> TargetState:
    """``prev`` seen again in the answer at ``now`` (a new pending target without one)."""
    if (
        prev is not None
        and prev.status is Status.PENDING
        and prev.absent_since is not None
        and now - prev.absent_since > max_gap_s
    ):
        prev = None  # no fresh data for too long (an outage): `for` counts from now
    if prev is None:
        return TargetState(Status.PENDING, now, now, sample.value, target.labels)
    return prev.seen_again(now, sample.value)


def advance(
    policy: Policy, target: Target, current: TargetState, now: float
) -> tuple[TargetState, Decision | None]:
    """A target in the answer: fired once its ``for`` has passed, fired again after its
    retry time or ``repeat_interval``."""
    if current.status is Status.PENDING:
        if now - current.active_since < policy.for_s:
            return current, None
        current = current.but(status=Status.FIRING, fired_at=now, last_fire_at=now)
        return current, decide(policy, target, current, Transition.FIRE, now, current.value)
    held_back = current.retry_at is not None and now >= current.retry_at
    if held_back or (
        policy.repeat_interval_s is not None
        and current.last_fire_at is not None
        and now - current.last_fire_at >= policy.repeat_interval_s
    ):
        current = current.but(last_fire_at=now, repeats=current.repeats + 1, retry_at=None)
        return current, decide(policy, target, current, Transition.FIRE, now, current.value)
    return current, None


def decide(
    policy: Policy,
    target: Target,
    state: TargetState,
    transition: Transition,
    now: float,
    value: float | None,
) -> Decision:
    """The decision of ``transition`` on ``target`` in ``state``: a fire runs the policy's
    action, a clear its ``on_clear`` only when the episode's action ran."""
    fire = transition is Transition.FIRE
    # undo only what was done: a fire held back, denied or awaiting approval has nothing to undo
    action = policy.action if fire else (policy.on_clear if state.acted else None)
    repeat = state.repeats
    expr = (policy.expr or "") if fire else (policy.clear_expr or policy.expr or "")
    told = "" if value is None or not policy.annotations else value_in_words(expr, value)
    return Decision(
        id=decision_id(policy.name, target.key, state.active_since, transition.value, repeat),
        policy=policy.name,
        group=policy.group,
        target=target,
        transition=transition,
        action=action,
        evidence=Evidence(
            expr=expr,
            value=value,
            pending_since=state.active_since,
            observed_at=now,
        ),
        at=now,
        episode_start=state.active_since,
        repeat=repeat,
        mode=policy.mode,
        labels=policy.labels,
        annotations=MappingProxyType(  # ``freeze``: the dict is this one's
            {k: render_annotation(v, target.labels, told) for k, v in policy.annotations.items()}
        ),
        reason=_reason(policy, transition, state, now),
    )


@lru_cache(maxsize=4096)
def _pieces(template: str) -> tuple[str, ...]:
    """``template`` cut at ``render``'s placeholders: text, then for each placeholder its
    ``PLACEHOLDER`` groups (``value``, None; or ``labels.x``, ``x``) and the text after it."""
    return tuple(PLACEHOLDER.split(template))


def render_annotation(template: str, labels: Mapping[str, str], value: str) -> str:
    """``gpuops.model.rules.templating.render(template, labels, value)``, the template cut
    once (``_pieces``), not matched again by a regular expression at every decision (each
    decision renders its policy's annotations). ``value``: the decision's value as words
    (``gpuops.model.telling.value_in_words``: ``25%``, ``down``, ``36``; empty: no value), as
    annotations are read by people; executor params keep the number."""
    pieces = _pieces(template)
    if len(pieces) == 1:
        return template
    out = [pieces[0]]
    for n in range(1, len(pieces), 3):
        name = pieces[n + 1]
        if name is None:  # $value
            out.append(value)
        else:
            out.append(labels.get(name, ""))
        out.append(pieces[n + 2])
    return "".join(out)


def _reason(policy: Policy, transition: Transition, state: TargetState, now: float) -> str:
    if transition is Transition.FIRE:
        if state.repeats:
            return f"still firing (decision {state.repeats + 1} of this episode)"
        return f"condition held for {now - state.active_since:.0f}s (for: {policy.for_s:.0f}s)"
    if state.status is Status.CLEARING:
        return "cleared earlier; its undo was held back and is tried again"
    if policy.on_clear is not None and not state.acted:
        return "target cleared; nothing to undo (the action did not run)"
    if policy.clear_expr is not None:
        return "clear_expr matched"
    return "target left the result"
