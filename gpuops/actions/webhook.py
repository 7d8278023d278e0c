"""The ``webhook`` executor: an HTTP POST of the decision as JSON to a receiver, for the
free-form actions a team handles itself (a ticket, a chat message, a runbook).

``gpuops.actions.base.execute`` calls ``run`` (and retries it); this module raises
``TemporaryError`` for what may pass on a retry (timeouts, refused connections, 5xx, 429, 408,
with the receiver's ``Retry-After`` as the delay) and ``PermanentError`` for what will not
(other 4xx, redirects, bad parameters). Every request carries ``X-Gpuops-Decision-Id``: a retried
or replayed decision has the same id, so the receiver can do it once.

Settings (engine configuration, ``executors.webhook``), validated by ``WebhookSettings``:
``url``, ``headers``, ``token`` / ``token_file``, ``hmac_secret`` / ``hmac_secret_file``,
``timeout_s``, ``verify``. Params (the policy's ``action.params``): ``url``, ``headers``,
``timeout_s`` override the settings; the other params are sent to the receiver in the body.
Label values are encoded by ``gpuops.actions.encoding``: percent-encoded in the URL's path and
query, a host name or IP where they are the host, percent-encoded controls in header values.

``lane`` names the receiver's origin (``scheme://host:port``), so the gate runs each receiver's
actions on workers of its own: a slow or failing receiver delays only its own actions.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import time
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import requests
from pydantic import (
    BaseModel,
    ConfigDict,
    PositiveFloat,
    SecretStr,
    ValidationError,
    model_validator,
)

from gpuops.actions.base import PermanentError, TemporaryError
from gpuops.actions.config import SecretFileError, problems, read_secret, settings_of
from gpuops.actions.encoding import fill_url, header_value, origin
from gpuops.actions.results import Result
from gpuops.model.decisions import Decision
from gpuops.model.rules.templating import render

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Gpuops-Signature"
DECISION_ID_HEADER = "X-Gpuops-Decision-Id"
TRANSPORT_PARAMS = frozenset({"url", "headers", "timeout_s"})
"""Params that configure the request and are not sent in the body (headers may hold keys)."""
TEMPORARY_STATUSES = frozenset({408, 429})
"""4xx statuses that mean "later": request timeout, too many requests (5xx are all temporary)."""
BODY_CAP = 256
"""Characters of a receiver's answer kept in an error message."""


class WebhookSettings(BaseModel):
    """``executors.webhook`` in the engine configuration. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str | None = None
    """Receiver URL, may use ``{{ $labels.x }}``; a policy's ``params.url`` wins."""
    headers: dict[str, str] = {}
    """Extra request headers (a policy's ``params.headers`` are added over them)."""
    token: SecretStr | None = None
    """Bearer token, sent as ``Authorization: Bearer <token>``; never logged."""
    token_file: Path | None = None
    """File whose first line is the bearer token; read for every request, so rotation works."""
    hmac_secret: SecretStr | None = None
    """Key of the ``X-Gpuops-Signature: sha256=<hex>`` HMAC over the exact body bytes."""
    hmac_secret_file: Path | None = None
    """File whose first line is the HMAC key; read for every request."""
    timeout_s: PositiveFloat = 10.0
    """Seconds to connect and, separately, to wait for the answer. Long enough for a slow
    receiver, short enough that a hung one cannot hold an action slot for long."""
    verify: bool | str = True
    """TLS verification: true, false, or the path of a CA bundle."""

    @model_validator(mode="after")
    def _one_source_per_secret(self) -> WebhookSettings:
        for name in ("token", "hmac_secret"):
            if getattr(self, name) is not None and getattr(self, f"{name}_file") is not None:
                raise ValueError(f"set {name} or {name}_file, not both")
        return self


class WebhookParams(BaseModel):
    """The params a policy gives a webhook action; keys other than these go to the receiver."""

    model_config = ConfigDict(extra="allow", frozen=True)

    url: str | None = None
    headers: dict[str, str] = {}
    timeout_s: PositiveFloat | None = None


class Delivered(Result):
    """The receiver's answer (2xx) and the URL it was sent to (without credentials)."""

    status: int
    url: str


class WebhookExecutor:
    """POSTs decisions to an HTTP receiver; any verb (free-form: its params are
    ``WebhookParams``)."""

    name = "webhook"
    verbs: frozenset[str] | None = None

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self.settings = settings_of(WebhookSettings, self.name, settings)
        for key in ("token_file", "hmac_secret_file"):  # readable now; read again per request
            path = getattr(self.settings, key)
            if path is not None:
                read_secret(self.name, key, path)

    @staticmethod
    def check_params(verb: str, params: Mapping[str, Any]) -> list[str]:
        """What ``run`` would refuse in ``params`` whatever the target (rules check, reload)."""
        try:
            WebhookParams.model_validate(dict(params))
        except ValidationError as exc:
            return [f"webhook params: {problems(exc)}"]
        return []

    def lane(self, decision: Decision) -> str:
        """The origin of ``decision``'s receiver, ``scheme://host:port`` (the scheme's port when
        the URL has none), the gate's unit of isolation (``gpuops.actions.base.lane``). The
        origin and not the URL: a path or query may hold label values (a URL per target), and
        what is slow or down is the server. ``""`` when no URL can be formed (``run`` says
        why)."""
        try:
            return origin(self._url(_params(decision), decision))
        except (PermanentError, ValueError):  # ValueError: no server, a port out of range
            return ""

    def run(self, decision: Decision) -> Delivered:
        params = _params(decision)
        url = self._url(params, decision)
        body = encode(decision)
        headers = {"Content-Type": "application/json", "User-Agent": "gpuops-webhook"}
        labels, value = decision.target.labels, decision.evidence.value
        encoded = {k: header_value(v) for k, v in labels.items()}  # no header can be added
        for name, template in {**self.settings.headers, **params.headers}.items():
            headers[name] = render(template, encoded, value)
        headers[DECISION_ID_HEADER] = decision.id
        token = _secret(self.settings.token, self.settings.token_file, "token_file")
        if token:
            headers["Authorization"] = f"Bearer {token}"
        key = _secret(self.settings.hmac_secret, self.settings.hmac_secret_file, "hmac_secret_file")
        if key:
            headers[SIGNATURE_HEADER] = signature(key.encode(), body)
        timeout = params.timeout_s or self.settings.timeout_s
        shown = redact(url)
        try:
            resp = requests.post(
                url,
                data=body,
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
                verify=self.settings.verify,
            )
        except requests.Timeout as exc:
            raise TemporaryError(f"webhook {shown} timed out after {timeout:g} s") from exc
        except requests.ConnectionError as exc:
            raise TemporaryError(f"webhook {shown} unreachable: {exc}"[:512]) from exc
        except (requests.RequestException, ValueError) as exc:
            raise PermanentError(f"webhook {shown}: {exc}"[:512]) from exc
        with resp:
            status = resp.status_code
            if status >= 500 or status in TEMPORARY_STATUSES:
                delay = retry_after(resp.headers.get("Retry-After"))
                raise TemporaryError(
                    f"webhook {shown} answered {status}: {resp.text[:BODY_CAP]}", delay=delay
                )
            if status >= 300:
                where = f" (redirect to {resp.headers['Location']})" if status < 400 else ""
                raise PermanentError(
                    f"webhook {shown} answered {status}{where}: {resp.text[:BODY_CAP]}"
                )
        log.info("webhook %s for decision %s: %d", shown, decision.id, status)
        return Delivered(status=status, url=shown)

    def _url(self, params: WebhookParams, decision: Decision) -> str:
        template = params.url or self.settings.url
        if not template:
            raise PermanentError(
                "webhook has no url: set params.url in the policy's action or url in the "
                "engine's executors.webhook settings"
            )
        # Label values are percent-encoded, so a value cannot add path segments, a query or a
        # fragment to the URL; one in the host must be a host name.
        value = decision.evidence.value
        url = fill_url(template, decision.target.labels, lambda t, v: render(t, v, value))
        if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
            raise PermanentError(
                f"webhook url {redact(url)!r} (from {redact(template)!r}) is not an http(s) URL"
            )
        return url


def _params(decision: Decision) -> WebhookParams:
    try:
        return WebhookParams.model_validate(dict(decision.action.params) if decision.action else {})
    except ValidationError as exc:
        raise PermanentError(f"webhook params: {problems(exc)}") from None


def payload(decision: Decision) -> dict[str, Any]:
    """The JSON document sent for ``decision`` (params rendered with the target's labels)."""
    labels, value = decision.target.labels, decision.evidence.value
    action = decision.action
    evidence = decision.evidence
    return {
        "id": decision.id,
        "policy": decision.policy,
        "group": decision.group,
        "target": {"key": decision.target.key, "labels": dict(decision.target.labels)},
        "transition": str(decision.transition),
        "action": None
        if action is None
        else {
            "type": action.type,
            "params": {
                k: _render_all(v, labels, value)
                for k, v in action.params.items()
                if k not in TRANSPORT_PARAMS
            },
        },
        "evidence": {
            "expr": evidence.expr,
            "value": _finite(evidence.value),
            "pending_since": evidence.pending_since,
            "observed_at": evidence.observed_at,
        },
        "reason": decision.reason,
        "labels": dict(decision.labels),
        "annotations": dict(decision.annotations),
        "at": decision.at,
    }


def encode(decision: Decision) -> bytes:
    """The exact body bytes (the signature is computed over these)."""
    try:
        text = json.dumps(payload(decision), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise PermanentError(
            f"webhook cannot encode decision {decision.id} as JSON: {exc}"
        ) from None
    return text.encode("utf-8")


def signature(key: bytes, body: bytes) -> str:
    """The ``X-Gpuops-Signature`` value: ``sha256=`` and the hex HMAC-SHA256 of ``body``."""
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def retry_after(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta seconds or an HTTP date); None if absent
    or unreadable."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    return max(0.0, seconds) if math.isfinite(seconds) else None


def redact(url: str) -> str:
    """``url`` without the user and password it may carry (for logs and outcomes)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


def _secret(value: SecretStr | None, path: Path | None, key: str) -> str | None:
    if value is not None:
        return value.get_secret_value()
    if path is None:
        return None
    try:
        return read_secret("webhook", key, path) or None
    except SecretFileError as exc:
        raise PermanentError(str(exc)) from None


def _render_all(value: Any, labels: Mapping[str, str], number: float | None) -> Any:
    if isinstance(value, str):
        return render(value, labels, number)
    if isinstance(value, Mapping):
        return {k: _render_all(v, labels, number) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_render_all(v, labels, number) for v in value]
    return value


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
