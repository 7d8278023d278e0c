"""The evaluation cycle: query → evaluate → judge → commit → hand to the gate.

From the bottom up: ``clears`` (a policy's ``clear_expr`` narrowed to its firing targets),
``queries`` (what is asked of Prometheus, once per query and evaluation time), ``commit`` (the
judge step, one transaction, one hand-over to the gate: shared with approvals, quota and the
alert inbox) and ``cycle`` (``Cycle``: a policy's or a group's evaluation). Built by
``gpuops.runtime.facade.Engine``, whose scheduler runs ``Cycle.evaluate_group``.
"""

from gpuops.runtime.cycle.commit import Committed, NotGranted
from gpuops.runtime.cycle.cycle import Cycle, LastEvaluation
from gpuops.runtime.cycle.queries import age_selectors

__all__ = ["Committed", "Cycle", "LastEvaluation", "NotGranted", "age_selectors"]
