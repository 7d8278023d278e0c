"""gpuops: a Prometheus-native automation engine for GPU fleets.

The folders are the architecture (docs/architecture.md; the import-linter contracts in
pyproject.toml keep it so), from the bottom up: ``model`` (pure values, the rule language,
evaluation, guardrails), ``integrations`` (the one Slurm client), ``exporters`` (the NVML and
Slurm collectors), ``actions``/``audit``/``sources``/``store`` (I/O: executors, the audit
trail, Prometheus, the state backends), ``offline`` and ``settings`` (backtests, policy tests,
rule checks; the engine configuration), ``runtime`` (the engine and its one gate), ``api`` (REST
and the console), ``sim`` (the simulated fleet, the what-if, the demos) and ``cli``.
"""

__version__ = "0.1.0"
