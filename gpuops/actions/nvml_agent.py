"""The ``nvml-agent`` executor: ``downclock`` and ``restore_clocks``, and the remediation
ladder's ``reset_gpu``, ``validate`` (a health check by NVML: a GPU found unhealthy fails it)
and ``reboot`` (of the target's node, which the request names: an agent on another node
refuses it; the agent answers with the boot it was asked in, then runs its reboot command;
this waits until the agent of that node answers again with another boot id, up to
``reboot_timeout_s``), through the node agent of the NVML exporter on the target's node
(``gpuops exporter nvml --agent``, ``--agent-reboot`` for the reboot).

``gpuops.actions.base.execute`` calls ``run``; its dispatch table (``gpuops.actions.dispatch``)
routes each verb to the agent's endpoint. This module raises ``TemporaryError`` for what may
pass on a retry (timeouts, refused connections, 5xx) and ``PermanentError`` for what will not
(4xx, with the agent's own message, e.g. that changing clocks needs root). The decision id goes
with every request, so the agent does a retried decision once (a reboot once across the reboot:
the agent keeps its ids on disk). Settings: ``NvmlAgentSettings``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Annotated, Any

import requests
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PositiveFloat,
    SecretStr,
    model_validator,
)

from gpuops.actions.base import PermanentError, TemporaryError
from gpuops.actions.config import as_text, null_is_default, read_secret, settings_of
from gpuops.actions.dispatch import Dispatch, on
from gpuops.actions.encoding import fill_url, origin, path_segment
from gpuops.actions.results import Result
from gpuops.model.decisions import Decision
from gpuops.model.verbs import (
    DOWNCLOCK,
    REBOOT,
    RESET_GPU,
    RESTORE_CLOCKS,
    VALIDATE,
    DownclockParams,
    NoParams,
    RebootParams,
    implemented_by,
)

log = logging.getLogger(__name__)

DEFAULT_URL = "http://{node}:9835"
RESET_TIMEOUT_S = 150.0
"""Seconds a reset request may take (the agent gives ``nvidia-smi --gpu-reset`` 120)."""


def _token(value: Any) -> Any:
    """The token as text: ``str()`` of a number (``token: 123456``); an empty or zero one is
    set but empty (no token is sent, and ``token_file`` is not read), as always."""
    if value is None or isinstance(value, SecretStr):
        return value
    return str(value) if value else ""


def _token_file(value: Any) -> Any:
    """Empty (``token_file: ""``) is not set: the path of nothing is no file to read."""
    if not value:
        return None
    return value if isinstance(value, PurePath) else str(value)


class NvmlAgentSettings(BaseModel):
    """``executors.nvml-agent`` in the engine configuration (keys it does not name are
    ignored; a null one takes its default)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    _nulls = model_validator(mode="before")(null_is_default)

    url: Annotated[str, BeforeValidator(as_text)] = DEFAULT_URL
    """Agent base URL, a template filled from the target's labels: a label in the host must be
    a host name or IP, one elsewhere is percent-encoded (``gpuops.actions.encoding``)."""
    token: Annotated[SecretStr | None, BeforeValidator(_token)] = None
    """The agent's bearer token (a number is its digits; empty: none)."""
    token_file: Annotated[Path | None, BeforeValidator(_token_file)] = None
    """File whose first line is the token (keeps it out of the configuration); read once, at
    start, and only when ``token`` is not set. Empty: not set."""
    gpu_label: Annotated[str, BeforeValidator(as_text)] = "uuid"
    """Target label naming the GPU, by uuid or index."""
    node_label: Annotated[str, BeforeValidator(as_text)] = "node"
    """Target label naming the node a ``reboot`` is for, as its agent knows its own name
    (``gpuops exporter nvml --node``; by default the host name up to its first dot)."""
    timeout_s: float = 10.0
    """Seconds per HTTP request."""
    reboot_timeout_s: PositiveFloat = 900.0
    """Seconds a ``reboot`` waits for the node's agent to answer again from a new boot (a
    GPU server's firmware takes minutes)."""
    reboot_poll_s: PositiveFloat = 5.0
    """Seconds between two asks of a rebooting node's agent."""


class AgentAnswer(Result):
    """What the agent on ``agent`` answered (its JSON document, as it came)."""

    agent: str
    document: dict[str, Any]

    def changed(self) -> dict[str, Any]:
        return {"agent": self.agent, **self.document}


@dataclass(frozen=True)
class Call:
    """One request to an agent, about the target's GPU (under ``/api/v1/gpus/{gpu}``)."""

    path: str
    body: dict[str, Any] = field(default_factory=dict)
    timeout_s: float | None = None
    """Seconds this request may take, when longer than the settings' (a GPU reset)."""


class NvmlAgentExecutor:
    """Locks and restores GPU clocks through the node agent."""

    name = "nvml-agent"
    verbs: frozenset[str] | None = implemented_by("nvml-agent")

    def __init__(
        self,
        settings: Mapping[str, Any] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings_of(NvmlAgentSettings, self.name, settings)
        self._sleep = sleep
        self._clock = clock
        self.url_template = self.settings.url
        self.gpu_label = self.settings.gpu_label
        self.timeout_s = self.settings.timeout_s
        secret = self.settings.token
        token = None if secret is None else secret.get_secret_value()
        if token is None and self.settings.token_file is not None:
            token = read_secret(self.name, "token_file", self.settings.token_file)
        self._token = token or None
        self._http = requests.Session()

    def lane(self, decision: Decision) -> str:
        """The origin of ``decision``'s node agent (``gpuops.actions.encoding.origin``): one
        lane per agent, so an agent that does not answer delays only its own node's actions.
        ``""`` when no URL can be formed (``run`` says why)."""
        try:
            return origin(self._base_url(decision))
        except (PermanentError, ValueError):
            return ""

    def run(self, decision: Decision) -> AgentAnswer:
        base = self._base_url(decision)
        if decision.action is not None and decision.action.type == REBOOT.name:
            rebooted = DISPATCH.run(self, decision)  # the node's, not a GPU's
            assert isinstance(rebooted, AgentAnswer), rebooted
            return rebooted
        gpu = decision.target.labels.get(self.gpu_label)
        if not gpu:
            raise PermanentError(
                f"target {decision.target.key} has no {self.gpu_label!r} label to name the GPU "
                f"(set the policy's target to include it)"
            )
        gpu = path_segment(gpu, self.gpu_label)
        call = DISPATCH.run(self, decision)
        assert isinstance(call, Call), call
        path = f"/api/v1/gpus/{gpu}{call.path}"
        body = {"decision_id": decision.id, **call.body}
        answer = self._post(base + path, body, decision.id, call.timeout_s)
        if answer.get("healthy") is False:  # a health check that found problems
            problems = "; ".join(str(p) for p in answer.get("problems") or ())
            raise PermanentError(f"GPU {gpu} on {base} is not healthy: {problems}"[:512])
        return AgentAnswer(agent=base, document=answer)

    # --- the calls, by verb (under /api/v1/gpus/{gpu}) -----------------------------------

    def _downclock(self, d: Decision, params: DownclockParams) -> Call:
        body: dict[str, Any] = {"max_clock_mhz": params.max_clock_mhz}
        if params.min_clock_mhz is not None:
            body["min_clock_mhz"] = params.min_clock_mhz
        return Call("/clocks", body)

    def _restore_clocks(self, d: Decision, _: NoParams) -> Call:
        return Call("/clocks/reset")

    def _reset_gpu(self, d: Decision, _: NoParams) -> Call:
        return Call("/reset", timeout_s=RESET_TIMEOUT_S)

    def _validate(self, d: Decision, _: NoParams) -> Call:
        return Call("/check")

    def _reboot(self, d: Decision, params: RebootParams) -> AgentAnswer:
        """Ask the node's agent to reboot it, then wait until it answers from a new boot."""
        base = self._base_url(d)
        node = d.target.labels.get(self.settings.node_label)
        if not node:
            raise PermanentError(
                f"target {d.target.key} has no {self.settings.node_label!r} label to name the"
                " node to reboot"
            )
        body = {"decision_id": d.id, "node": node}
        answer = self._post(base + "/api/v1/node/reboot", body, d.id)
        before = str(answer.get("boot_id") or "")
        if not before:
            raise PermanentError(f"nvml-agent {base} answered a reboot without a boot_id")
        if answer.get("rebooted") is True:  # this decision's reboot is behind the node
            return AgentAnswer(agent=base, document=answer)
        timeout_s = params.timeout_s or self.settings.reboot_timeout_s
        deadline = self._clock() + timeout_s
        last = "no answer yet"
        while True:
            self._sleep(self.settings.reboot_poll_s)
            try:
                found = self._get(base + "/api/v1/node")
            except TemporaryError as exc:  # down while it reboots
                found, last = {}, str(exc)
            now = str(found.get("boot_id") or "")
            other = found.get("node")
            if now and other != node:  # the address leads to another node's agent now
                now, last = "", f"the agent of node {other} answers there"
            if now and now != before:
                log.info("node %s: rebooted (boot %s, now %s)", base, before, now)
                return AgentAnswer(
                    agent=base, document={**answer, "rebooted": True, "now_boot_id": now}
                )
            if now:
                last = f"still boot {now}"
            if self._clock() > deadline:
                raise TemporaryError(
                    f"node of {base} did not come back from its reboot within {timeout_s:g} s"
                    f" ({last})"[:512]
                )

    def _base_url(self, decision: Decision) -> str:
        try:
            url = fill_url(self.url_template, decision.target.labels, _format)
        except KeyError as exc:
            raise PermanentError(
                f"nvml-agent url {self.url_template!r} needs label {exc.args[0]!r}, which target "
                f"{decision.target.key} does not have"
            ) from None
        return url.rstrip("/")

    def _get(self, url: str) -> dict[str, Any]:
        return self._request("GET", url, {}, None, self.timeout_s)

    def _post(
        self, url: str, body: Mapping[str, Any], decision_id: str, timeout_s: float | None = None
    ) -> dict[str, Any]:
        timeout = max(self.timeout_s, timeout_s or 0.0)
        return self._request("POST", url, {"Idempotency-Key": decision_id}, body, timeout)

    def _request(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        body: Mapping[str, Any] | None,
        timeout: float,
    ) -> dict[str, Any]:
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        try:
            resp = self._http.request(method, url, json=body, headers=headers, timeout=timeout)
        except requests.Timeout as exc:
            raise TemporaryError(f"nvml-agent {url} timed out after {timeout:g} s") from exc
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


DISPATCH: Dispatch[NvmlAgentExecutor, Call | AgentAnswer] = Dispatch(
    NvmlAgentExecutor.name,
    (
        on(DOWNCLOCK, NvmlAgentExecutor._downclock),
        on(RESTORE_CLOCKS, NvmlAgentExecutor._restore_clocks),
        on(RESET_GPU, NvmlAgentExecutor._reset_gpu),
        on(VALIDATE, NvmlAgentExecutor._validate),
        on(REBOOT, NvmlAgentExecutor._reboot),
    ),
)
"""The agent's verbs, each to its endpoint."""


def _format(template: str, values: Mapping[str, str]) -> str:
    return template.format_map(dict(values))


def _message(resp: requests.Response) -> str:
    """The agent's error message (its JSON ``error``), or the body, capped at 256 characters."""
    try:
        doc = resp.json()
    except ValueError:
        return resp.text[:256]
    if isinstance(doc, dict) and "error" in doc:
        return str(doc["error"])[:256]
    return resp.text[:256]
