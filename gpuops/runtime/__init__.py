"""The runtime: the one package that sees the whole flow.

``facade.Engine`` opens the state backend (``backend``), builds and wires the collaborators —
``rulebook`` (load, watch, reload), ``cycle`` (query → evaluate → judge → commit), ``gate`` (the
only executor caller: write-ahead audit, checks at execution time, workers per executor,
outcomes, resume), ``approvals``, ``quota`` and ``alerts`` (the Alertmanager inbox) — and owns
their threads: the scheduled jobs (``jobs`` on ``clock``'s scheduler), the inbox's worker and
``leadership``. ``controls`` holds the kill switch, pause and the lock order; ``reloaded`` what
becomes of fires held while their policy was away; ``metrics`` the engine's own metrics;
``process`` the settings of the engine's process. The judge step itself is pure
(``gpuops.model.guardrails.judge_step``), shared with ``gpuops.offline.backtest``. The layers
among these modules are an import-linter contract in pyproject.toml.
"""

from gpuops.runtime.facade import Engine
from gpuops.runtime.gate import DecisionListener, ExecutorsRefused
from gpuops.runtime.process import collect_less
from gpuops.runtime.rulebook import ReloadResult

__all__ = ["DecisionListener", "Engine", "ExecutorsRefused", "ReloadResult", "collect_less"]
