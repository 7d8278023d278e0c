"""The model: pure values and functions, no I/O, no clock, no globals.

From the bottom: ``decisions`` (samples, targets, decisions, outcomes, verdicts) and ``verbs``
(what each action verb is: params, undo, labels, executors), ``rules`` (the YAML rule language
into frozen ``Policy`` values), ``records`` (their JSON forms) and ``alerts`` (an Alertmanager
alert), ``staleness``, ``evaluation`` (the per-target state machine, its fast paths, settling),
``guardrails`` (verdicts and the judge step). The runtime, the backtests, the policy tests and the
what-if all call them unchanged; the layers are an import-linter contract in pyproject.toml.
"""
