"""The checks a rule set passes before an engine runs it — one function for every caller.

``Engine.reload`` (first load, SIGHUP, the rule-file watcher, ``POST /rules/reload``) and
``gpuops rules check`` both call ``load_checked``, so "OK" from the CLI means the engine loads
the files: the schema (``gpuops.model.rules.loader``), PromQL by promtool
(``gpuops.offline.promtool``), and each action's verb and params: the verbs its executor does,
and the params it refuses before any decision, as the executor registry
(``gpuops.actions.registry``) tells: an executor's own ``check_params`` (``webhook``,
``command``, a third-party executor's), else the verb table's checks of the built-in executors
(``gpuops.model.verbs.Verb.checked``: the fleet's ``downclock`` and scaling, the node agent's
``downclock``). Other params (Slurm's, the logical ``scheduler`` and ``gpu-control``'s) are
refused, if at all, when the action runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from gpuops.actions.registry import ExecutorRegistry
from gpuops.model.decisions import ActionSpec
from gpuops.model.rules.loader import load_rules
from gpuops.model.rules.model import Policy, RuleError, RulesError, RuleSet
from gpuops.offline import promtool

__all__ = ["ExecutorRegistry", "check_rules", "load_checked", "refuse_dropping_every_policy"]


def check_rules(
    rules: RuleSet,
    registry: ExecutorRegistry,
    *,
    check_promql: bool = True,
    without_promtool: Callable[[promtool.PromtoolError], None] | None = None,
) -> list[RuleError]:
    """Every problem of ``rules`` beyond the schema. Without promtool: ``without_promtool``
    is told and PromQL is not checked, or, when it is None, ``PromtoolError`` is raised."""
    errors: list[RuleError] = []
    if check_promql:
        try:
            errors += promtool.check(rules)
        except promtool.PromtoolError as exc:
            if without_promtool is None:
                raise
            without_promtool(exc)
    return errors + verb_errors(rules, registry) + params_errors(rules, registry)


def verb_errors(rules: RuleSet, registry: ExecutorRegistry) -> list[RuleError]:
    """Every action's verb is one its executor does (an unknown executor: the loader's)."""
    errors = []
    for policy in rules.policies():
        for key, action in _actions(policy):
            verbs = registry.verbs(action.executor)
            if verbs is not None and action.type not in verbs:
                errors.append(
                    _error(
                        policy,
                        key,
                        f"{policy.path}.{key}.type: executor {action.executor!r} does not "
                        f"do {action.type!r} (it does: {', '.join(sorted(verbs))})",
                    )
                )
    return errors


def params_errors(rules: RuleSet, registry: ExecutorRegistry) -> list[RuleError]:
    """Every action's params are what its executor takes for its verb, as far as can be told
    before a decision (``ExecutorRegistry.params_problems``)."""
    errors = []
    for policy in rules.policies():
        for key, action in _actions(policy):
            for problem in registry.params_problems(action.executor, action.type, action.params):
                errors.append(_error(policy, key, f"{policy.path}.{key}.params: {problem}"))
    return errors


def _actions(policy: Policy) -> list[tuple[str, ActionSpec]]:
    return [
        (key, action)
        for key, action in (("action", policy.action), ("on_clear", policy.on_clear))
        if action is not None
    ]


def _error(policy: Policy, key: str, message: str) -> RuleError:
    """``message`` at the line of ``key`` in ``policy`` (else the policy's own line)."""
    file, _, line = policy.source.rpartition(":")
    return RuleError(file, policy.key_lines.get(key, int(line or 0)), message)


def load_checked(
    paths: Sequence[Path | str],
    registry: ExecutorRegistry,
    *,
    check_promql: bool = True,
    without_promtool: Callable[[promtool.PromtoolError], None] | None = None,
) -> RuleSet:
    """The rule set at ``paths`` if it passes every check; else ``RulesError`` with all."""
    rules = load_rules(paths)
    problems = check_rules(
        rules, registry, check_promql=check_promql, without_promtool=without_promtool
    )
    if problems:
        raise RulesError(problems)
    return rules


def refuse_dropping_every_policy(running: RuleSet, new: RuleSet) -> None:
    """A reload may not replace running policies by none: a file emptied to ``groups: []`` (a
    truncated deploy, a templating slip) is far more often a mistake than the intent, and
    running no policy is what ``pause`` or stopping the engine are for. ``RulesError`` names
    the files; the running policies stay."""
    running_count = sum(1 for _ in running.policies())
    if running_count and not any(True for _ in new.policies()):
        where = new.files[0] if len(new.files) == 1 else "(rules)"
        raise RulesError(
            [
                RuleError(
                    where,
                    1,
                    f"the new rules ({', '.join(new.files) or 'no files'}) define no policy; the "
                    f"{running_count} running policies stay (to run none, pause the engine or "
                    "stop it)",
                )
            ]
        )
