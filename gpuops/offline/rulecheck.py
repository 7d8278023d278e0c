"""The checks a rule set passes before an engine runs it — one function for every caller.

``Engine.reload`` (first load, SIGHUP, the rule-file watcher, ``POST /rules/reload``) and
``gpuops rules check`` both call ``load_checked``, so "OK" from the CLI means the engine loads
the files: the schema (``gpuops.model.rules.loader``), PromQL by promtool
(``gpuops.model.rules.promql``),
and, from the executor registry, each action's verb and params (``gpuops.actions.base``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from gpuops.actions.base import ExecutorRegistry
from gpuops.model.rules import promql
from gpuops.model.rules.loader import load_rules
from gpuops.model.rules.model import RuleError, RulesError, RuleSet

__all__ = ["ExecutorRegistry", "check_rules", "load_checked", "refuse_dropping_every_policy"]


def check_rules(
    rules: RuleSet,
    registry: ExecutorRegistry,
    *,
    check_promql: bool = True,
    without_promtool: Callable[[promql.PromtoolError], None] | None = None,
) -> list[RuleError]:
    """Every problem of ``rules`` beyond the schema. Without promtool: ``without_promtool``
    is told and PromQL is not checked, or, when it is None, ``PromtoolError`` is raised."""
    errors: list[RuleError] = []
    if check_promql:
        try:
            errors += promql.check(rules)
        except promql.PromtoolError as exc:
            if without_promtool is None:
                raise
            without_promtool(exc)
    return errors + registry.check_verbs(rules) + registry.check_params(rules)


def load_checked(
    paths: Sequence[Path | str],
    registry: ExecutorRegistry,
    *,
    check_promql: bool = True,
    without_promtool: Callable[[promql.PromtoolError], None] | None = None,
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
