"""Guardrails: the pure judgement that turns an evaluated decision into a verdict.

Called by ``gpuops.runtime`` and ``gpuops.offline.backtest`` (``judge_step``) after
``gpuops.model.evaluation``; hands back the decision with its verdict and the next
``GuardrailState``. Checks, in order: kill switch, pause, cooldown, ``max_per_hour``,
``max_fraction`` of the policy's population (at least one target, so a small fleet is never left
without any action), the global budget, then dry-run and approval. Undo
actions (``clear``) pass cooldown and rate limits — restoring a GPU must never be blocked by the
limits of the action it undoes; a decision without an action (a clear with nothing to undo)
passes everything, the kill switch and pause included: nothing runs, so nothing is held back. A
policy's ``schedule`` needs no check here: such a policy is only evaluated at its cron times. No
I/O, no clock.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial
from itertools import count

import promql_parser

from gpuops.model.decisions import EMPTY, Decision, Suppression, Transition, Verdict, freeze
from gpuops.model.evaluation.settling import settle_all
from gpuops.model.evaluation.state import PolicyState
from gpuops.model.rules.model import MAX_COOLDOWN_S, Policy

HOUR = 3600.0
MEMORY_S = MAX_COOLDOWN_S
"""How long the last action on a target is remembered (the longest cooldown the loader
accepts)."""
RETRY_S = 60.0
"""How soon a decision held back by the kill switch, a pause or the blast radius is decided
again (cooldown, max_per_hour and the global budget know when they will allow it)."""


@dataclass(frozen=True)
class Execution:
    at: float
    policy: str
    target: str


@dataclass(frozen=True)
class GuardrailState:
    """Executed fire actions: the last one per (policy, target) and those of the last hour."""

    last_action: Mapping[str, float] = field(default_factory=lambda: EMPTY)
    recent: tuple[Execution, ...] = ()


@dataclass(frozen=True)
class Context:
    """What the runtime knows at judgement time."""

    kill_switch: bool = False
    paused: bool = False
    engine_dry_run: bool = False
    """Engine-wide dry-run: every policy behaves as if its mode were dry-run."""
    global_max_per_hour: int | None = None
    population: int | None = None
    """How many targets the policy's selector covers now (for ``max_fraction``)."""
    approved: bool = False
    """An admin granted this decision (it was awaiting approval)."""
    unavailable: frozenset[str] | None = None
    """The targets already out of service besides the decision's own, whoever took them out
    (``Standing.unavailable``): ``max_fraction`` counts them too."""


@dataclass(frozen=True)
class Standing:
    """What an executor reads of its target at execution time, for the gate
    (``gpuops.actions.base.standing``): a veto, and what ``max_fraction`` must count."""

    veto: str | None = None
    """Why the target must not be touched (a ``gpuops.io/do-not-touch`` label), or None."""
    unavailable: frozenset[str] | None = None
    """The other targets of the executor's population already unschedulable or not ready,
    whoever made them so (None: the executor does not know)."""
    population: int | None = None
    """How many targets the executor may act on (None: the policy's population query)."""


def population_expr(policy: Policy, label_names: Iterable[str] = ()) -> str | None:
    """The query whose series count is the population ``max_fraction`` applies to:
    ``limits.population``, else every distinct combination of the target labels — the
    policy's ``target``, or (without one) ``label_names``, the labels of its targets — in
    the series of the selectors its results come from (``lead_selectors``: the GPUs that
    have the metric a policy reads, not every series that carries ``node`` and ``uuid``),
    each with ``label!=""`` per target label. Where those selectors cannot be told (a
    function that makes labels, no selector reading the present), any series with the
    target labels (``{node!="", uuid!=""}``)."""
    if policy.max_fraction is None:
        return None
    if policy.population is not None:
        return policy.population
    names = sorted(policy.target or {n for n in label_names if n != "__name__"})
    if not names:
        return None
    by = ", ".join(names)
    present = [f"{name}!={_string('')}" for name in names]
    lead = lead_selectors(policy.expr, tuple(names)) if policy.expr is not None else None
    if not lead:
        matchers = ", ".join(present)
        return f"group by ({by}) ({{{matchers}}})"
    union = " or ".join(_selector(node, present) for node in lead)
    return f"group by ({by}) ({union})"


_LABEL_MAKERS = frozenset({"label_replace", "label_join", "absent", "absent_over_time"})
"""Functions whose results carry labels no input series has (``count_values`` too)."""
_PICKERS = frozenset({"topk", "bottomk", "limitk", "limit_ratio"})
"""Aggregations that hand back some of their input series unchanged, every label kept:
``by``/``without`` only group the picking (their parameter is a number, no source)."""


@lru_cache(maxsize=256)
def lead_selectors(
    expr: str, names: tuple[str, ...] = ()
) -> tuple[promql_parser.VectorSelector, ...] | None:
    """The vector selectors whose series the results of ``expr`` (and their labels
    ``names``) come from: every selector but those on the right of ``and`` and ``unless``
    (they only filter) and those under an aggregation that drops one of ``names`` (not
    ``topk``, ``bottomk``, ``limitk``, ``limit_ratio``: they keep every label), each
    once, without those reading the past (``offset``, ``@``). None: ``expr`` does not parse,
    or has a function that makes labels (``label_replace``, ``absent``, ``count_values``)."""
    try:
        tree = promql_parser.parse(expr)
    except ValueError:
        return None
    found: dict[str, promql_parser.VectorSelector] = {}
    pp = promql_parser

    def visit(node: promql_parser.Expr) -> bool:
        if isinstance(node, pp.VectorSelector):
            if node.offset is None and node.at is None:
                found.setdefault(_selector(node, ()), node)
            return True
        if isinstance(node, pp.MatrixSelector):
            return visit(node.vector_selector)
        if isinstance(node, pp.Call):
            if node.func.name in _LABEL_MAKERS:
                return False
            return all(visit(arg) for arg in node.args)
        if isinstance(node, pp.AggregateExpr):
            if str(node.op) == "count_values":
                return False
            if str(node.op) in _PICKERS:
                return visit(node.expr)  # its results are input series, labels and all
            kept = set(node.modifier.labels) if node.modifier is not None else set()
            by = node.modifier is not None and node.modifier.type == pp.AggModifierType.By
            if (by or node.modifier is None) and not kept.issuperset(names):
                return True  # its results lack one of the labels: no target comes from it
            if not by and kept.intersection(names):
                return True
            return visit(node.expr)
        if isinstance(node, pp.BinaryExpr):
            if str(node.op) in ("and", "unless"):
                return visit(node.lhs)
            return visit(node.lhs) and visit(node.rhs)
        if isinstance(node, pp.ParenExpr | pp.UnaryExpr | pp.SubqueryExpr):
            return visit(node.expr)
        return True  # numbers and strings: no series

    try:
        if not visit(tree):
            return None
    except ValueError:  # a matcher this module cannot write: the wide query
        return None
    return tuple(found.values())


def _string(value: str) -> str:
    """``value`` as a PromQL string literal (labels are data: escaped as Go's
    ``strconv.Unquote`` reads it; ``gpuops.sources.prometheus.string_literal`` does the same above
    this layer)."""
    return json.dumps(value, ensure_ascii=False)


def _selector(node: promql_parser.VectorSelector, extra: Sequence[str]) -> str:
    """``node`` as PromQL with the matchers ``extra`` added (values escaped; each ``or``
    group of MetricsQL's ``{a="1" or b="2"}`` gets them)."""
    groups = node.matchers.or_matchers or [node.matchers.matchers]
    text = " or ".join(
        ",".join([*(f"{m.name}{_op(m)}{_string(m.value)}" for m in group), *extra])
        for group in groups
    )
    return f"{node.name or ''}{{{text}}}"


def _op(matcher: promql_parser.Matcher) -> str:
    pp = promql_parser
    for kind, text in (
        (pp.MatchOp.Equal, "="),
        (pp.MatchOp.NotEqual, "!="),
        (pp.MatchOp.Re, "=~"),
        (pp.MatchOp.NotRe, "!~"),
    ):
        if matcher.op == kind:
            return text
    raise ValueError(f"unknown label matcher {matcher.op} on {matcher.name}")


def cooldown_key(policy: str, target: str) -> str:
    return f"{policy}\x1f{target}"


@dataclass(frozen=True)
class Judgement:
    """What one judge step hands back: the decisions with their verdicts and the next states."""

    decisions: tuple[Decision, ...]
    policy_state: PolicyState | None
    """The policy's next state with the verdicts settled in (None when none was given)."""
    guardrails: GuardrailState
    repeats: frozenset[str] = frozenset()
    """Ids of the decisions that only repeat the suppression already recorded for their
    target (``gpuops.model.evaluation.settling.settle_all``): counted, not recorded or
    audited again."""


def judge_step(
    policy: Policy,
    decisions: Sequence[Decision],
    policy_state: PolicyState | None,
    guardrails: GuardrailState,
    ctx: Context,
    now: float,
) -> Judgement:
    """The one pure judge step of the live cycle, approvals, quota grants, Alertmanager
    triggers and backtests: verdicts for ``decisions`` (``judge_all``), then the verdicts fed
    back into the policy's state (``gpuops.model.evaluation.settling.settle_all``: what ran
    is undone on clear, what was held back is decided again when the guardrail may allow it,
    and a re-decision that repeats its target's recorded suppression is named in
    ``Judgement.repeats``)."""
    judged, after = judge_all(decisions, policy, guardrails, ctx, now)
    if policy_state is None:
        return Judgement(tuple(judged), None, after)
    retry: Callable[[Decision], float] = partial(retry_time, policy=policy, state=after, now=now)
    if ctx.global_max_per_hour is not None:
        retry = _budget_queue(retry, after, ctx.global_max_per_hour, now)
    settled = settle_all(policy_state, judged, retry)
    return Judgement(settled.decisions, settled.state, after, settled.repeats)


def judge(
    decision: Decision, policy: Policy, state: GuardrailState, ctx: Context, now: float
) -> tuple[Decision, GuardrailState]:
    """The verdict for ``decision`` and the state after it (which changes only on execute)."""
    (judged,), state = judge_all((decision,), policy, state, ctx, now)
    return judged, state


def judge_all(
    decisions: Sequence[Decision], policy: Policy, state: GuardrailState, ctx: Context, now: float
) -> tuple[list[Decision], GuardrailState]:
    """Judge one policy's decisions of one cycle in order, each seeing the executions approved
    before it. Linear in the number of decisions and of executions in the window."""
    window = _Window(state, policy.name, now)
    out = [_verdict(d, policy, window, ctx, now) for d in decisions]
    return out, window.state()


class _Window:
    """A working copy of the state for one judgement: the last hour, counted once."""

    def __init__(self, state: GuardrailState, policy: str, now: float) -> None:
        self.last_action = {k: t for k, t in state.last_action.items() if now - t < MEMORY_S}
        self.recent = [e for e in state.recent if now - e.at < HOUR]
        self.mine = sum(1 for e in self.recent if e.policy == policy)
        self.acted = {e.target for e in self.recent if e.policy == policy}

    def add(self, execution: Execution) -> None:
        self.last_action[cooldown_key(execution.policy, execution.target)] = execution.at
        self.recent.append(execution)
        self.mine += 1
        self.acted.add(execution.target)

    def state(self) -> GuardrailState:
        return GuardrailState(freeze(self.last_action), tuple(self.recent))


def _verdict(
    decision: Decision, policy: Policy, window: _Window, ctx: Context, now: float
) -> Decision:
    suppressed = _suppression(decision, policy, window, ctx, now)
    if suppressed is not None:
        reason, why = suppressed
        return decision.with_verdict(reason.verdict, why)
    if ctx.engine_dry_run or policy.mode == "dry-run":
        why = "engine is in dry-run" if ctx.engine_dry_run else "policy mode is dry-run"
        return decision.with_verdict(Verdict.DRY_RUN, why)
    fire = decision.transition is Transition.FIRE
    if fire and policy.approval == "required" and not ctx.approved:
        why = "policy requires approval; waiting for an admin to grant or deny it"
        return decision.with_verdict(Verdict.AWAITING_APPROVAL, why)
    if fire and decision.action is not None:
        window.add(Execution(now, decision.policy, decision.target.key))
    return decision.with_verdict(Verdict.EXECUTE, decision.reason)


def _suppression(
    decision: Decision, policy: Policy, window: _Window, ctx: Context, now: float
) -> tuple[Suppression, str] | None:
    if decision.action is None:
        return None  # nothing to run: nothing to hold back (a clear with nothing to undo)
    if ctx.kill_switch:
        return Suppression.KILL_SWITCH, "the kill switch is on: no action runs"
    if ctx.paused:
        return Suppression.PAUSED, "the engine is paused"
    if decision.transition is not Transition.FIRE:
        return None
    last = window.last_action.get(cooldown_key(decision.policy, decision.target.key))
    if last is not None and now - last < policy.cooldown_s:
        left = policy.cooldown_s - (now - last)
        return Suppression.COOLDOWN, (
            f"cooldown {policy.cooldown_s:.0f}s: last action on this target "
            f"{now - last:.0f}s ago, {left:.0f}s left"
        )
    if policy.max_per_hour is not None and window.mine >= policy.max_per_hour:
        return Suppression.MAX_PER_HOUR, (
            f"{window.mine} actions in the last hour, limit max_per_hour={policy.max_per_hour}"
        )
    if policy.max_fraction is not None:
        if ctx.population is None:
            return Suppression.MAX_FRACTION, (
                "population unknown (no population query, or it failed): blast radius unchecked"
            )
        allowed = max(1, math.floor(policy.max_fraction * ctx.population))
        acted = len(window.acted)
        if decision.target.key not in window.acted and acted >= allowed:
            return Suppression.MAX_FRACTION, (
                f"{acted} of {ctx.population} targets acted on in the last hour, limit "
                f"max_fraction={policy.max_fraction:g} allows {allowed}"
            )
        if ctx.unavailable is not None and len(ctx.unavailable) >= allowed:
            down = ", ".join(sorted(ctx.unavailable)[:10])
            return Suppression.MAX_FRACTION, (
                f"{len(ctx.unavailable)} of {ctx.population} already unschedulable or not ready "
                f"({down}), limit max_fraction={policy.max_fraction:g} allows {allowed}"
            )
    dry_run = ctx.engine_dry_run or policy.mode == "dry-run"  # runs nothing: not budgeted
    budget = ctx.global_max_per_hour
    if budget is not None and not dry_run and len(window.recent) >= budget:
        return Suppression.GLOBAL_BUDGET, (
            f"{len(window.recent)} actions in the last hour across all policies, "
            f"global budget {ctx.global_max_per_hour}"
        )
    return None


@dataclass(frozen=True)
class Windows:
    """The guardrail windows counted once (``summarize``), for the gate's checks at execution:
    one pass over the hour's executions however many actions are checked against them."""

    at: float
    last_action: Mapping[str, float]
    total: int
    """Executions in the hour, all policies."""
    mine: Mapping[str, int]
    """Executions in the hour per policy."""
    acted: Mapping[str, Mapping[str, int]]
    """Executions in the hour per policy and target."""
    latest: Mapping[tuple[str, str], float]
    """The latest execution of each (policy, target) in the hour."""


def summarize(state: GuardrailState, now: float) -> Windows:
    mine: dict[str, int] = {}
    acted: dict[str, dict[str, int]] = {}
    latest: dict[tuple[str, str], float] = {}
    total = 0
    for e in state.recent:
        if now - e.at >= HOUR:
            continue
        total += 1
        mine[e.policy] = mine.get(e.policy, 0) + 1
        targets = acted.setdefault(e.policy, {})
        targets[e.target] = targets.get(e.target, 0) + 1
        key = (e.policy, e.target)
        if latest.get(key, -math.inf) < e.at:
            latest[key] = e.at
    return Windows(now, state.last_action, total, mine, acted, latest)


class _Rechecked:
    """``Windows`` as one decision's execution-time check sees them: without the execution its
    own judgement recorded (the latest of its policy and target at or after its time) and the
    cooldown that started."""

    def __init__(self, windows: Windows, decision: Decision) -> None:
        self._windows = windows
        self._key = cooldown_key(decision.policy, decision.target.key)
        self._policy = decision.policy
        own = windows.latest.get((decision.policy, decision.target.key))
        self._own = own is not None and own >= decision.at
        self._own_at = own
        targets = windows.acted.get(decision.policy, {})
        self._target = decision.target.key
        self._others = targets.get(self._target, 0) - (1 if self._own else 0)
        self._acted = len(targets) - (1 if self._own and self._others == 0 else 0)
        self.mine = windows.mine.get(decision.policy, 0) - (1 if self._own else 0)
        self.recent = range(windows.total - (1 if self._own else 0))  # only its length is read
        self.last_action = self
        self.acted = self

    def get(self, key: str) -> float | None:
        last = self._windows.last_action.get(key)
        if key == self._key and self._own and last == self._own_at:
            return None
        return last

    def __contains__(self, target: object) -> bool:
        if target == self._target:
            return self._others > 0
        return target in self._windows.acted.get(self._policy, {})

    def __len__(self) -> int:
        return self._acted


def recheck(
    decision: Decision, policy: Policy, windows: Windows, ctx: Context, now: float
) -> tuple[Suppression, str] | None:
    """At the moment of execution (the gate): would ``decision``, judged to execute, still pass
    the policy's guardrails (cooldown, ``max_per_hour``, ``max_fraction``, the global budget) as
    they stand now — with the executions recorded since, the policy as loaded now — leaving out
    its own execution, which its judgement recorded? The reason it is held, or None.
    ``windows``: ``summarize`` of the guardrail state (the gate reuses one while it is
    unchanged)."""
    return _suppression(decision, policy, _Rechecked(windows, decision), ctx, now)  # type: ignore[arg-type]


def _without(state: GuardrailState, decision: Decision) -> GuardrailState:
    """``state`` without the execution that judging ``decision`` recorded: the latest one of
    its (policy, target) at or after its time, and the cooldown it started."""
    mine = [
        i
        for i, e in enumerate(state.recent)
        if e.policy == decision.policy and e.target == decision.target.key and e.at >= decision.at
    ]
    if not mine:
        return state
    own = max(mine, key=lambda i: state.recent[i].at)
    recent = state.recent[:own] + state.recent[own + 1 :]
    key = cooldown_key(decision.policy, decision.target.key)
    last = dict(state.last_action)
    if last.get(key) == state.recent[own].at:
        # its own action is the last on the target: what came before, its judgement saw
        # (and a later action than its own would hold it)
        del last[key]
    return GuardrailState(freeze(last), recent)


def retry_time(decision: Decision, policy: Policy, state: GuardrailState, now: float) -> float:
    """When a decision the guardrails suppressed may be decided again with a chance to pass."""
    reason = decision.verdict.suppression
    if reason is Suppression.COOLDOWN:
        last = state.last_action.get(cooldown_key(decision.policy, decision.target.key))
        if last is not None:
            return max(now, last + policy.cooldown_s)
    if reason is Suppression.MAX_PER_HOUR:
        mine = [e.at for e in state.recent if e.policy == decision.policy and now - e.at < HOUR]
        if mine:
            return max(now, min(mine) + HOUR)
    return now + RETRY_S


def budget_retry_time(state: GuardrailState, budget: int, now: float, queued: int = 0) -> float:
    """When the global budget can allow the action of a target held by it, the ``queued``-th
    (from 0) held in the same judgement: when enough of the last hour's executions have left
    the window to leave a place for it and the ``queued`` before it. Beyond the executions in
    the window, a full budget per hour is assumed. So the held targets are decided again a few
    at a time as places free up, never all of them every ``RETRY_S`` (at 50k GPUs, some
    80,000 decisions an evaluation)."""
    ats = sorted(e.at for e in state.recent if now - e.at < HOUR)
    if not ats:
        return now + (RETRY_S if budget > 0 else HOUR)
    needed = len(ats) - budget + 1 + queued  # executions that must leave the window first
    if needed <= 0:
        return now + RETRY_S  # a place now (held at the gate by a race): soon
    hours, index = divmod(needed - 1, len(ats))
    return max(now, ats[index] + HOUR * (hours + 1))


def _budget_queue(
    retry: Callable[[Decision], float], state: GuardrailState, budget: int, now: float
) -> Callable[[Decision], float]:
    """``retry`` with the targets the global budget holds in one judgement queued one after
    the other (``budget_retry_time``)."""
    queued = count()

    def retry_at(decision: Decision) -> float:
        if decision.verdict is Verdict.SUPPRESSED_GLOBAL_BUDGET:
            return budget_retry_time(state, budget, now, next(queued))
        return retry(decision)

    return retry_at


def forget_execution(state: GuardrailState, decision: Decision) -> GuardrailState:
    """``decision``'s action was held at the gate, never tried: neither its cooldown nor its
    place in the rate windows and the budget stay."""
    return _without(state, decision)


def forget_action(state: GuardrailState, decision: Decision) -> GuardrailState:
    """``decision``'s action failed: it starts no cooldown (the attempt still counts against
    the rate limits)."""
    key = cooldown_key(decision.policy, decision.target.key)
    last = state.last_action.get(key)
    if last is None or last < decision.at:  # a later grant's time is this action's too
        return state
    kept = {k: t for k, t in state.last_action.items() if k != key}
    return GuardrailState(freeze(kept), state.recent)
