"""The runtime: the one package that sees the whole flow.

``facade.Engine`` builds and wires the collaborators — ``rulebook`` (load, watch, reload),
``cycle`` (query → evaluate → judge → commit), ``gate`` (the only executor caller: write-ahead
audit, checks at execution time, workers per executor, outcomes, resume), ``approvals``,
``quota`` and ``alerts`` (the Alertmanager inbox) — and owns their threads. The judge step
itself is pure (``gpuops.model.guardrails.judge_step``), shared with ``gpuops.offline.backtest``.
"""

from gpuops.runtime.cycle import collect_less
from gpuops.runtime.facade import Engine
from gpuops.runtime.gate import DecisionListener
from gpuops.runtime.rulebook import ReloadResult

__all__ = ["DecisionListener", "Engine", "ReloadResult", "collect_less"]
