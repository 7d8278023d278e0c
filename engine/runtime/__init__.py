"""The runtime: the one package that sees the whole flow (DESIGN.md section 2).

``facade.Engine`` builds and wires the collaborators — ``rulebook`` (load, watch, reload),
``cycle`` (query → evaluate → judge → commit), ``gate`` (the only executor caller: write-ahead
audit, checks at execution time, workers per executor, outcomes, resume), ``approvals``,
``quota`` and ``alerts`` (the Alertmanager inbox) — and owns their threads. The judge step
itself is pure (``engine.guardrails.judge_step``), shared with ``engine.backtest``.
"""

from engine.runtime.cycle import collect_less
from engine.runtime.facade import Engine
from engine.runtime.gate import DecisionListener
from engine.runtime.rulebook import ReloadResult

__all__ = ["DecisionListener", "Engine", "ReloadResult", "collect_less"]
