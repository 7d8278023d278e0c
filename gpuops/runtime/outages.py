"""``OutOfService``: which nodes of the fleet are out of service now, for any reason, as the
scheduler sees them — asked of Prometheus with ``health.ladder.pacing.unavailable``.

Asked by the remediation ladder (``gpuops.runtime.ladder``) before a repair starts in a domain
that ``max_fraction`` bounds; the counting per domain is pure (``gpuops.model.health.pacing``).
Fresh data only: a failed query, an input series whose newest sample is older than
``max_sample_age`` or an empty answer raises ``OutagesUnknown`` with the reason, and the
repair waits, saying it. One answer serves the repairs that start within ``REUSE_S``.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping

from gpuops.sources import MetricsSource, QueryError
from gpuops.sources.promql import AGE_LABEL, input_selectors

log = logging.getLogger(__name__)

REUSE_S = 5.0
"""Seconds an answer serves the repairs that start after it (a tick kicks many at once)."""

Nodes = tuple[tuple[Mapping[str, str], bool], ...]
"""Each node's labels and whether it is out of service."""


class OutagesUnknown(Exception):
    """Which nodes are out of service cannot be told now; the message says why."""


class OutOfService:
    """Reads ``expr`` (one series per node: 1 out of service, 0 in) on fresh data only."""

    def __init__(
        self,
        source: MetricsSource,
        expr: str,
        *,
        max_sample_age: float,
        clock: Callable[[], float],
    ) -> None:
        self.expr = expr
        self.max_sample_age = max_sample_age
        self._source = source
        self._clock = clock
        self._lock = threading.Lock()
        self._kept: tuple[float, Nodes] | None = None

    def nodes(self) -> Nodes:
        """Every node of the answer with its labels and whether it is out of service;
        ``OutagesUnknown`` when the answer failed, is stale or is empty."""
        now = self._clock()
        with self._lock:
            kept = self._kept
        if kept is not None and 0.0 <= now - kept[0] < REUSE_S:
            return kept[1]
        found = self._ask(now)
        with self._lock:
            self._kept = (now, found)
        return found

    def _ask(self, now: float) -> Nodes:
        try:
            samples = self._source.query(self.expr, at=now)
            stale = self._source.stale_series(
                input_selectors(self.expr), self.max_sample_age, at=now
            )
        except QueryError as exc:
            raise OutagesUnknown(f"the query failed: {exc}") from exc
        for selector, series in stale.items():
            if series:
                names = ", ".join(_name(s.labels) for s in series[:3])
                raise OutagesUnknown(
                    f"{len(series)} series of {selector} older than"
                    f" {self.max_sample_age:g}s ({names})"
                )
        nodes = []
        for sample in samples:
            labels = dict(sample.labels)
            if not labels.get("node") or math.isnan(sample.value):
                continue
            nodes.append((labels, sample.value != 0))
        if not nodes:
            raise OutagesUnknown("its answer has no node (a series with a node label)")
        return tuple(nodes)


def _name(labels: Mapping[str, str]) -> str:
    """A stale series as the probe found it, without the probe's own label."""
    shown = sorted((k, v) for k, v in labels.items() if k != AGE_LABEL)
    return "{" + ", ".join(f"{k}={v!r}" for k, v in shown) + "}"
