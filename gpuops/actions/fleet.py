"""The ``fleet`` executor: the simulated fleet's control API (``gpuops.sim.fleet``).

Maps verbs to control endpoints; the target's labels name the GPU (``uuid``), node (``node``)
or pool (``pool``), each percent-encoded into its path segment (``gpuops.actions.encoding``).
Every call carries the decision id, which the fleet uses to make a repeated call a no-op. 5xx,
timeouts and refused connections are temporary; 4xx are permanent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import requests

from gpuops.actions.base import PermanentError, TemporaryError
from gpuops.actions.encoding import path_segment
from gpuops.model.decisions import Decision


class FleetExecutor:
    name = "fleet"
    verbs: frozenset[str] | None = frozenset(
        {
            "reclaim",
            "downclock",
            "restore_clocks",
            "scale_out",
            "scale_in",
            "migrate",
            "grant_quota",
            "release_quota",
            "hold_class",
            "release_class",
            "pack",
            "lend",
            "unlend",
            "consolidate",
        }
    )

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        settings = dict(settings or {})
        self.url = str(settings.get("url", "http://127.0.0.1:9400")).rstrip("/")
        self.timeout_s = float(settings.get("timeout_s", 5.0))
        self.session = requests.Session()

    @staticmethod
    def check_params(verb: str, params: Mapping[str, Any]) -> list[str]:
        """What ``run`` would refuse in ``params`` whatever the target (rules check, reload)."""
        problems = []
        if verb == "downclock" and not _whole(params.get("max_clock_mhz"), 1):
            problems.append("downclock needs max_clock_mhz, a whole number of MHz above 0")
        if verb in ("scale_out", "scale_in") and not _whole(params.get("nodes", 1), 1):
            problems.append(f"{verb} needs nodes, a whole number above 0")
        return problems

    def run(self, decision: Decision) -> Mapping[str, Any]:
        assert decision.action is not None
        verb = decision.action.type
        params = dict(decision.action.params)
        labels = decision.target.labels
        body: dict[str, Any] = {"decision_id": decision.id}
        if verb == "reclaim":
            method, path = "POST", f"/api/v1/gpus/{_need(labels, 'uuid', verb)}/reclaim"
        elif verb == "pack":
            method, path = "POST", f"/api/v1/gpus/{_need(labels, 'uuid', verb)}/pack"
        elif verb == "consolidate":
            method, path = "POST", f"/api/v1/nodes/{_need(labels, 'node', verb)}/consolidate"
        elif verb in ("lend", "unlend"):
            method = "POST" if verb == "lend" else "DELETE"
            path = f"/api/v1/pools/{_need(labels, 'pool', verb)}/lend"
        elif verb == "downclock":
            method, path = "POST", f"/api/v1/gpus/{_need(labels, 'uuid', verb)}/clocks"
            if "max_clock_mhz" not in params:
                raise PermanentError("downclock needs params.max_clock_mhz")
            body["max_clock_mhz"] = int(params["max_clock_mhz"])
        elif verb == "restore_clocks":
            method, path = "DELETE", f"/api/v1/gpus/{_need(labels, 'uuid', verb)}/clocks"
        elif verb in ("scale_out", "scale_in"):
            pool = path_segment(labels.get("pool") or str(params.get("pool", "default")), "pool")
            method, path = "POST", f"/api/v1/pools/{pool}/{verb}"
            body["nodes"] = int(params.get("nodes", 1))
            if verb == "scale_in" and labels.get("node"):
                body["node"] = labels["node"]  # that node only (a policy found it idle)
        elif verb in ("grant_quota", "release_quota"):
            method, path = _quota_call(verb, labels, params, body)
        elif verb in ("hold_class", "release_class"):
            name = labels.get("priority_class") or str(params.get("priority_class", ""))
            if not name:
                raise PermanentError(f"{verb} needs a priority_class label or param")
            method = "POST" if verb == "hold_class" else "DELETE"
            path = f"/api/v1/classes/{path_segment(name, 'priority_class')}/hold"
        else:  # migrate
            method, path = "POST", f"/api/v1/nodes/{_need(labels, 'node', verb)}/migrate"
        return self._call(method, path, body)

    def _call(self, method: str, path: str, body: Mapping[str, Any]) -> Mapping[str, Any]:
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
        return changed if isinstance(changed, dict) else {"result": changed}


def _quota_call(
    verb: str, labels: Mapping[str, str], params: Mapping[str, Any], body: dict[str, Any]
) -> tuple[str, str]:
    """An elastic quota grant or its release (``gpuops.runtime.quota`` with ``grant_action:
    grant_quota``, ``undo_action: release_quota``): the grant is named by the request."""
    project = _need(labels, "project", verb)
    grant = labels.get("quota_request") or str(params.get("grant", ""))
    if not grant:
        raise PermanentError(f"{verb} needs a quota_request label or params.grant")
    if verb == "release_quota":
        return "DELETE", f"/api/v1/projects/{project}/grants/{path_segment(grant, 'quota_request')}"
    body["grant"] = grant
    body["pool"] = labels.get("pool") or str(params.get("pool", "default"))
    body["gpus"] = int(params.get("gpus", 0))
    if params.get("duration_s") is not None:
        body["duration_s"] = float(params["duration_s"])
    return "POST", f"/api/v1/projects/{project}/grants"


def _whole(value: Any, least: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= least


def _need(labels: Mapping[str, str], name: str, verb: str) -> str:
    value = labels.get(name)
    if not value:
        raise PermanentError(
            f"{verb} needs the target label {name!r}; the target has {dict(labels)}"
        )
    return path_segment(value, name)
