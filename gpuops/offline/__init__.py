"""Policies judged without acting: ``rulecheck`` (the checks every rule set passes before it runs:
reload, ``gpuops rules check``, the API's validate) with ``promtool`` (its PromQL, by
Prometheus' own parser, in a process), ``policytest`` (``gpuops rules test``: unit tests of
policies over series written in promtool notation) and ``backtest`` (``gpuops backtest run``: the
live evaluation and guardrails over Prometheus history)."""
