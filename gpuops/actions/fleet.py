"""The ``fleet`` executor: the simulated fleet's control API (``gpuops.sim.fleet``).

``gpuops.actions.base.execute`` calls ``run``; its dispatch table (``gpuops.actions.dispatch``)
routes each verb the fleet implements (``gpuops.model.verbs``) to the control call that does it.
The target's labels name the GPU (``uuid``), node (``node``) or pool (``pool``), each
percent-encoded into its path segment (``gpuops.actions.encoding``). Every call carries the
decision id, which the fleet uses to make a repeated call a no-op. 5xx, timeouts and refused
connections are temporary; 4xx are permanent. What the fleet answers it changed is the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

import requests
from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

from gpuops.actions.base import PermanentError, TemporaryError
from gpuops.actions.config import as_text, null_is_default, settings_of
from gpuops.actions.dispatch import Dispatch, on
from gpuops.actions.encoding import path_segment, target_label
from gpuops.actions.results import Answer
from gpuops.model.decisions import Decision
from gpuops.model.verbs import (
    CONSOLIDATE,
    DOWNCLOCK,
    GRANT_QUOTA,
    HOLD_CLASS,
    LEND,
    MIGRATE,
    PACK,
    REBOOT,
    RECLAIM,
    RELEASE_CLASS,
    RELEASE_QUOTA,
    RESET_GPU,
    RESTORE_CLOCKS,
    RESUME,
    SCALE_IN,
    SCALE_OUT,
    UNLEND,
    VALIDATE,
    ClassParams,
    DownclockParams,
    NoParams,
    QuotaParams,
    QuotaReleaseParams,
    RebootParams,
    ScaleParams,
    implemented_by,
)


class FleetSettings(BaseModel):
    """``executors.fleet`` in the engine configuration (keys it does not name are ignored; a
    null one takes its default)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    _nulls = model_validator(mode="before")(null_is_default)

    url: Annotated[str, BeforeValidator(as_text)] = "http://127.0.0.1:9400"
    """The fleet's control API (``gpuops fleet sim`` serves it there)."""
    timeout_s: float = 5.0
    """Seconds per request: the simulated fleet answers at once."""


@dataclass(frozen=True)
class Call:
    """One request to the control API."""

    method: str
    path: str
    body: dict[str, Any] = field(default_factory=dict)
    """Sent with the decision id."""


class FleetExecutor:
    name = "fleet"
    verbs: frozenset[str] | None = implemented_by("fleet")

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self.settings = settings_of(FleetSettings, self.name, settings)
        self.url = self.settings.url.rstrip("/")
        self.timeout_s = self.settings.timeout_s
        self.session = requests.Session()

    def run(self, decision: Decision) -> Answer:
        call = DISPATCH.run(self, decision)
        return self._call(call.method, call.path, {"decision_id": decision.id, **call.body})

    # --- the calls, by verb -------------------------------------------------------------

    def _reclaim(self, d: Decision, _: NoParams) -> Call:
        return Call("POST", f"/api/v1/gpus/{_need(d, 'uuid')}/reclaim")

    def _pack(self, d: Decision, _: NoParams) -> Call:
        return Call("POST", f"/api/v1/gpus/{_need(d, 'uuid')}/pack")

    def _consolidate(self, d: Decision, _: NoParams) -> Call:
        return Call("POST", f"/api/v1/nodes/{_need(d, 'node')}/consolidate")

    def _migrate(self, d: Decision, _: NoParams) -> Call:
        return Call("POST", f"/api/v1/nodes/{_need(d, 'node')}/migrate")

    def _resume(self, d: Decision, _: NoParams) -> Call:
        return Call("POST", f"/api/v1/nodes/{_need(d, 'node')}/resume")

    def _reset_gpu(self, d: Decision, _: NoParams) -> Call:
        return Call("POST", f"/api/v1/gpus/{_need(d, 'uuid')}/reset")

    def _reboot(self, d: Decision, _: RebootParams) -> Call:
        """The fleet's reboot keeps the node drained, as Slurm's does."""
        return Call("POST", f"/api/v1/nodes/{_need(d, 'node')}/reboot")

    def _validate(self, d: Decision, _: NoParams) -> Call:
        """The fleet's health check of the node (a node that fails it answers 409)."""
        return Call("POST", f"/api/v1/nodes/{_need(d, 'node')}/validate")

    def _lend(self, d: Decision, _: NoParams) -> Call:
        return Call("POST", f"/api/v1/pools/{_need(d, 'pool')}/lend")

    def _unlend(self, d: Decision, _: NoParams) -> Call:
        return Call("DELETE", f"/api/v1/pools/{_need(d, 'pool')}/lend")

    def _downclock(self, d: Decision, params: DownclockParams) -> Call:
        path = f"/api/v1/gpus/{_need(d, 'uuid')}/clocks"
        return Call("POST", path, {"max_clock_mhz": params.max_clock_mhz})

    def _restore_clocks(self, d: Decision, _: NoParams) -> Call:
        return Call("DELETE", f"/api/v1/gpus/{_need(d, 'uuid')}/clocks")

    def _scale_out(self, d: Decision, params: ScaleParams) -> Call:
        return Call("POST", f"/api/v1/pools/{_pool(d, params)}/scale_out", {"nodes": params.nodes})

    def _scale_in(self, d: Decision, params: ScaleParams) -> Call:
        """Of the target's node when it names one (a policy found that node idle)."""
        body: dict[str, Any] = {"nodes": params.nodes}
        if d.target.labels.get("node"):
            body["node"] = d.target.labels["node"]
        return Call("POST", f"/api/v1/pools/{_pool(d, params)}/scale_in", body)

    def _grant_quota(self, d: Decision, params: QuotaParams) -> Call:
        """An elastic quota grant (``gpuops.runtime.quota`` with ``grant_action:
        grant_quota``): the grant is named by the request."""
        project = _need(d, "project")
        body: dict[str, Any] = {
            "grant": _grant(d, params.grant),
            "pool": d.target.labels.get("pool") or _or_default(params.pool),
            "gpus": params.gpus,
        }
        if params.duration_s is not None:
            body["duration_s"] = params.duration_s
        return Call("POST", f"/api/v1/projects/{project}/grants", body)

    def _release_quota(self, d: Decision, params: QuotaReleaseParams) -> Call:
        """The end of a grant (``undo_action: release_quota``)."""
        project = _need(d, "project")
        grant = path_segment(_grant(d, params.grant), "quota_request")
        return Call("DELETE", f"/api/v1/projects/{project}/grants/{grant}")

    def _hold_class(self, d: Decision, params: ClassParams) -> Call:
        return Call("POST", _class_path(d, params))

    def _release_class(self, d: Decision, params: ClassParams) -> Call:
        return Call("DELETE", _class_path(d, params))

    def _call(self, method: str, path: str, body: Mapping[str, Any]) -> Answer:
        try:
            resp = self.session.request(method, self.url + path, json=body, timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise TemporaryError(f"fleet control API {self.url} unreachable: {exc}") from exc
        if resp.status_code >= 500:
            raise TemporaryError(f"fleet answered {resp.status_code} to {method} {path}")
        try:
            payload = resp.json()
        except ValueError:
            payload = {"error": resp.text[:256]}
        if resp.status_code >= 400:
            raise PermanentError(
                f"fleet refused {method} {path}: {resp.status_code} {payload.get('error', '')}"
            )
        changed = payload.get("changed", payload)
        return Answer(document=changed if isinstance(changed, dict) else {"result": changed})


def _verb(d: Decision) -> str:
    return d.action.type if d.action is not None else ""


def _or_default(pool: str | None) -> str:
    return "default" if pool is None else pool


def _raw(d: Decision, key: str) -> Any:
    """The param ``key`` as the policy wrote it (None: not given)."""
    return d.action.params.get(key) if d.action is not None else None


def _pool(d: Decision, params: ScaleParams) -> str:
    return _pool_segment(d, params.pool)


def _pool_segment(d: Decision, pool: str | None) -> str:
    """The target's ``pool`` label, else the param (null or left out: ``default``)."""
    return path_segment(d.target.labels.get("pool") or _or_default(pool), "pool")


def _pool_first(d: Decision) -> None:
    _pool_segment(d, as_text(_raw(d, "pool")))


def _quota_first(d: Decision) -> None:
    _need(d, "project")
    grant = _raw(d, "grant")
    _grant(d, "" if grant is None else str(grant))


def _grant(d: Decision, param: str) -> str:
    """The target's ``quota_request`` label, else the ``grant`` param."""
    grant = d.target.labels.get("quota_request") or param
    if not grant:
        raise PermanentError(f"{_verb(d)} needs a quota_request label or params.grant")
    return grant


def _class_path(d: Decision, params: ClassParams) -> str:
    name = d.target.labels.get("priority_class") or params.priority_class
    if not name:
        raise PermanentError(f"{_verb(d)} needs a priority_class label or param")
    return f"/api/v1/classes/{path_segment(name, 'priority_class')}/hold"


def _need(d: Decision, name: str) -> str:
    return path_segment(target_label(d, name), name)


DISPATCH: Dispatch[FleetExecutor, Call] = Dispatch(
    FleetExecutor.name,
    (
        on(RECLAIM, FleetExecutor._reclaim),
        on(PACK, FleetExecutor._pack),
        on(CONSOLIDATE, FleetExecutor._consolidate),
        on(MIGRATE, FleetExecutor._migrate),
        on(RESUME, FleetExecutor._resume),
        on(RESET_GPU, FleetExecutor._reset_gpu),
        on(REBOOT, FleetExecutor._reboot),
        on(VALIDATE, FleetExecutor._validate),
        on(LEND, FleetExecutor._lend),
        on(UNLEND, FleetExecutor._unlend),
        on(DOWNCLOCK, FleetExecutor._downclock, first=lambda d: _need(d, "uuid")),
        on(RESTORE_CLOCKS, FleetExecutor._restore_clocks),
        on(SCALE_OUT, FleetExecutor._scale_out, first=_pool_first),
        on(SCALE_IN, FleetExecutor._scale_in, first=_pool_first),
        on(GRANT_QUOTA, FleetExecutor._grant_quota, first=_quota_first),
        on(RELEASE_QUOTA, FleetExecutor._release_quota),
        on(HOLD_CLASS, FleetExecutor._hold_class),
        on(RELEASE_CLASS, FleetExecutor._release_class),
    ),
)
"""The fleet's verbs, each to the call that does it; what it always read before the params
first (``first``: the target's GPU, its pool, the project and the grant)."""
