"""What an executor asks Prometheus at the moment of acting, read from fresh series only
(docs/policies.md, "Fresh data").

An instant query answers a series' last sample for Prometheus' lookback (5 minutes) when no
staleness marker ended it (remote write, a restarted Prometheus, a relabelled exporter), so a
pod that moved or a job that ended could still be named. ``series_ages`` asks
``timestamp(SELECTOR)``, whose answer carries the evaluation time and the time of each series'
newest sample; the caller keeps the series at most its bound old. Used by the slurm executor
(the job holding a GPU, ``gpuops_gpu_allocated``) and ``gpuops.actions.kubepods`` (the pods of
a GPU, ``reclaim.gpu_series``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import requests

from gpuops.actions.base import TemporaryError


@dataclass(frozen=True)
class Aged:
    """A series the selector reads now: its labels (no ``__name__``) and how old its newest
    sample is, in seconds, when Prometheus answered."""

    labels: Mapping[str, str]
    age_s: float


def series_ages(
    url: str,
    selector: str,
    timeout_s: float,
    what: str,
    where: str = "",
    session: requests.Session | None = None,
) -> list[Aged]:
    """Each series ``selector`` reads now (those whose value also satisfies ``where``, e.g.
    ``== 1``, when given) with its age, in one query; ``TemporaryError`` saying that ``what``
    cannot be asked, and why, when Prometheus does not answer."""
    expr = f"timestamp({selector})" + (f" and {selector} {where}" if where else "")
    get = session.get if session is not None else requests.get
    try:
        resp = get(f"{url.rstrip('/')}/api/v1/query", params={"query": expr}, timeout=timeout_s)
        resp.raise_for_status()
        return [
            Aged(
                {str(k): str(v) for k, v in r["metric"].items() if k != "__name__"},
                float(r["value"][0]) - float(r["value"][1]),
            )
            for r in resp.json()["data"]["result"]
        ]
    except (requests.RequestException, ValueError, KeyError, TypeError, IndexError) as exc:
        raise TemporaryError(f"Prometheus {url}: cannot ask {what}: {exc}") from exc


def too_old(
    what: str, named: str, age_s: float, max_age_s: float, key: str, selector: str
) -> TemporaryError:
    """The error of a lookup whose every series is older than ``max_age_s`` (set by ``key``):
    nothing is acted on, the action is tried again later; ``named`` is what the newest of them
    names, ``age_s`` its age."""
    return TemporaryError(
        f"Prometheus names {what} only in series older than {key} ({max_age_s:g} s): {named} "
        f"last seen {age_s:.0f} s ago ({selector}); nothing acted on, tried again later"
    )
