"""gpuops: a Prometheus-native automation engine for GPU fleets.

The package is layered (see docs/architecture.md and the import-linter contracts in
pyproject.toml): ``decisions`` < ``rules`` < ``evaluation`` < ``guardrails`` < I/O modules
(``actions``, ``audit``, ``prometheus``, ``state``) < ``runtime`` < ``demo`` < ``cli``.
"""

__version__ = "0.1.0"
