"""The stale-series probe: one query for the input series whose newest sample is too old.

The instant result of a query carries the evaluation time, not its samples' times, so every
series a policy's selectors read (``gpuops.sources.promql.inputs``) is asked about in one
query (docs/policies.md, "Fresh data"). A series read through a range selector or a subquery
keeps answering for the whole window after its exporter died (Prometheus' staleness marker
ends only what instant selectors read), and a SIGKILLed Prometheus that restarts serves its
old samples until it scrapes again (no staleness markers were written): the age of their
newest sample is what tells them apart.

Asked instantly by ``gpuops.sources.prometheus.PrometheusClient.stale_series`` and the
what-if (``gpuops.sim``), as a range query by ``gpuops.offline.backtest``; each series of the
answer names its input by index (``AGE_LABEL``).
"""

from __future__ import annotations

import math
from functools import lru_cache

from gpuops.sources.promql.inputs import split_input, windowed

AGE_LABEL = "gpuops_input"
"""The label that tells the parts of a ``stale_expr`` answer apart (the input's index)."""

NAME_LABEL = "gpuops_name"
"""The label a stale series of a selector without a literal metric name carries its name in."""


@lru_cache(maxsize=1024)
def stale_expr(inputs: tuple[str, ...], bound_s: float) -> str | None:
    """One query for the series of each of ``inputs`` whose newest sample is older than
    ``bound_s``, labelled with the input's index (``AGE_LABEL``). An instant selector's series
    are those it reads with a sample older than the bound (``time() - timestamp(s) > bound``:
    the value is the age); a windowed one's, those with a sample in the window and none within
    the bound (``last_over_time(s[window]) unless last_over_time(s[bound])``: ``timestamp()``
    of a function's result is the evaluation time, not the sample's, so the age cannot be
    asked; the value is the series' last one). A window no longer than the bound cannot read
    a stale sample and is not asked. A selector without a literal metric name
    (``{__name__=~"a|b"}``) has its series' names copied into ``NAME_LABEL`` on both sides,
    since ``unless`` (and ``timestamp``) leave ``__name__`` out: ``a`` and ``b`` with the same
    other labels are two series. None: nothing to ask (no input, or no bound)."""
    if not math.isfinite(bound_s):
        return None
    parts = []
    for i, text in enumerate(inputs):
        selector, window = split_input(text)
        recent = f"last_over_time({windowed(selector, bound_s)})"
        if selector.startswith("{"):
            read = text if window is None else f"last_over_time({text})"
            if window is not None and window <= bound_s:
                continue
            part = f"{_named(read)} unless {_named(recent)}"
        elif window is None:
            part = f"time() - timestamp({selector}) > {bound_s!r}"
        elif window > bound_s:
            part = f"last_over_time({text}) unless {recent}"
        else:
            continue
        parts.append(f'label_replace({part}, "{AGE_LABEL}", "{i}", "", "")')
    return " or ".join(parts) or None


def _named(expr: str) -> str:
    return f'label_replace({expr}, "{NAME_LABEL}", "$1", "__name__", "(.+)")'
