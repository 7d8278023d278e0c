"""The ``nvml-agent`` executor: ``downclock`` and ``restore_clocks`` through the node agent of
the NVML exporter on the target's node (``gpuops exporter nvml --agent``).

``gpuops.actions.base.execute`` calls ``run``; this module raises ``TemporaryError`` for what may
pass on a retry (timeouts, refused connections, 5xx) and ``PermanentError`` for what will not
(4xx, with the agent's own message, e.g. that changing clocks needs root). The decision id goes
with every request, so the agent does a retried decision once.

Settings (from the engine configuration):

- ``url``: agent base URL, a template filled from the target's labels (default
  ``http://{node}:9835``): a label in the host must be a host name or IP, one elsewhere is
  percent-encoded (``gpuops.actions.encoding``).
- ``token`` or ``token_file``: the agent's bearer token (a file keeps it out of the config).
- ``gpu_label``: target label naming the GPU, by uuid or index (default ``uuid``).
- ``timeout_s``: seconds per HTTP request (default 10).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import requests

from gpuops.actions.base import PermanentError, TemporaryError
from gpuops.actions.encoding import fill_url, origin, path_segment
from gpuops.model.decisions import Decision

log = logging.getLogger(__name__)

DEFAULT_URL = "http://{node}:9835"


class NvmlAgentExecutor:
    """Locks and restores GPU clocks through the node agent."""

    name = "nvml-agent"
    verbs: frozenset[str] | None = frozenset({"downclock", "restore_clocks"})

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        settings = dict(settings or {})
        self.url_template = str(settings.get("url", DEFAULT_URL))
        self.gpu_label = str(settings.get("gpu_label", "uuid"))
        self.timeout_s = float(settings.get("timeout_s", 10.0))
        token = settings.get("token")
        if token is None and settings.get("token_file"):
            path = Path(str(settings["token_file"]))
            lines = path.read_text(encoding="utf-8").splitlines()
            token = lines[0].strip() if lines else ""
        self._token = str(token) if token else None
        self._http = requests.Session()

    @staticmethod
    def check_params(verb: str, params: Mapping[str, Any]) -> list[str]:
        """What ``run`` would refuse in ``params`` whatever the target (rules check, reload)."""
        if verb != "downclock":
            return []
        problems = []
        for key in ("max_clock_mhz", "min_clock_mhz"):
            if key == "min_clock_mhz" and params.get(key) is None:
                continue
            try:
                _mhz(params, key)
            except PermanentError as exc:
                problems.append(str(exc))
        return problems

    def lane(self, decision: Decision) -> str:
        """The origin of ``decision``'s node agent (``gpuops.actions.encoding.origin``): one
        lane per agent, so an agent that does not answer delays only its own node's actions.
        ``""`` when no URL can be formed (``run`` says why)."""
        try:
            return origin(self._base_url(decision))
        except (PermanentError, ValueError):
            return ""

    def run(self, decision: Decision) -> Mapping[str, Any]:
        verb = decision.action.type if decision.action else ""
        params = dict(decision.action.params) if decision.action else {}
        base = self._base_url(decision)
        gpu = decision.target.labels.get(self.gpu_label)
        if not gpu:
            raise PermanentError(
                f"target {decision.target.key} has no {self.gpu_label!r} label to name the GPU "
                f"(set the policy's target to include it)"
            )
        gpu = path_segment(gpu, self.gpu_label)
        body: dict[str, Any] = {"decision_id": decision.id}
        if verb == "downclock":
            body["max_clock_mhz"] = _mhz(params, "max_clock_mhz")
            if params.get("min_clock_mhz") is not None:
                body["min_clock_mhz"] = _mhz(params, "min_clock_mhz")
            path = f"/api/v1/gpus/{gpu}/clocks"
        elif verb == "restore_clocks":
            path = f"/api/v1/gpus/{gpu}/clocks/reset"
        else:
            raise PermanentError(f"nvml-agent does not support action {verb!r}")
        result = self._post(base + path, body, decision.id)
        return {"agent": base, **result}

    def _base_url(self, decision: Decision) -> str:
        try:
            url = fill_url(self.url_template, decision.target.labels, _format)
        except KeyError as exc:
            raise PermanentError(
                f"nvml-agent url {self.url_template!r} needs label {exc.args[0]!r}, which target "
                f"{decision.target.key} does not have"
            ) from None
        return url.rstrip("/")

    def _post(self, url: str, body: Mapping[str, Any], decision_id: str) -> dict[str, Any]:
        headers = {"Idempotency-Key": decision_id}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        try:
            resp = self._http.post(url, json=body, headers=headers, timeout=self.timeout_s)
        except requests.Timeout as exc:
            raise TemporaryError(f"nvml-agent {url} timed out after {self.timeout_s:g} s") from exc
        except requests.ConnectionError as exc:
            raise TemporaryError(f"nvml-agent {url} unreachable: {exc}"[:512]) from exc
        except requests.RequestException as exc:
            raise PermanentError(f"nvml-agent {url}: {exc}"[:512]) from exc
        message = _message(resp)
        if resp.status_code >= 500 or resp.status_code == 429:
            raise TemporaryError(f"nvml-agent {url} answered {resp.status_code}: {message}")
        if resp.status_code >= 400:
            raise PermanentError(f"nvml-agent {url} answered {resp.status_code}: {message}")
        try:
            doc = resp.json()
        except ValueError:
            raise PermanentError(f"nvml-agent {url} answered non-JSON: {message}") from None
        return dict(doc) if isinstance(doc, dict) else {"response": doc}


def _format(template: str, values: Mapping[str, str]) -> str:
    return template.format_map(dict(values))


def _mhz(params: Mapping[str, Any], key: str) -> int:
    value = params.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise PermanentError(
            f"downclock needs params.{key} as a positive integer (MHz), got {value!r}"
        )
    return value


def _message(resp: requests.Response) -> str:
    """The agent's error message (its JSON ``error``), or the body, capped at 256 characters."""
    try:
        doc = resp.json()
    except ValueError:
        return resp.text[:256]
    if isinstance(doc, dict) and "error" in doc:
        return str(doc["error"])[:256]
    return resp.text[:256]
