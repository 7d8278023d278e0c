"""The model: pure values and functions, no I/O, no clock, no globals.

``decisions`` (samples, targets, decisions, outcomes, verdicts), ``rules`` (the YAML rule
language into frozen ``Policy`` values), ``records`` (their JSON forms), ``staleness`` and
``evaluation`` (the per-target state machine), ``guardrails`` (verdicts and the judge step).
The runtime, the backtests, the policy tests and the what-if all call them unchanged.
"""
