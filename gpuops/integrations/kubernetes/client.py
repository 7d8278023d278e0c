"""The one place that calls the Kubernetes API server, for the ``kubernetes`` executor
(``gpuops.actions.kubernetes``) and the rule checks (``check_kubeconfig``).

It wraps the official ``kubernetes`` client (its kubeconfig and in-cluster loading, its path
encoding, the API server's Status bodies in ``ApiException``) and hands back objects as the API
server wrote them (JSON dicts). Every call first takes a token from a client-side bucket
(``qps``, ``burst``), so that gpuops' load on the API server stays bounded whatever the fleet
does. Names go into paths only through the client (each path parameter percent-encoded, ``/``
included) and only after ``check_name``: a name that is no Kubernetes name (``..``, ``a/b``,
``?x=``) never reaches the wire. Errors:

- ``KubeUnavailable`` (try again): the API server does not answer, answers 5xx, or the
  kubeconfig cannot be read; the message names the address (or the file);
- ``KubeForbidden`` (permanent): 403; the message names the RBAC verb and resource missing;
  ``KubeUnauthorized`` (401): the credentials refused (the executor rebuilds the client once);
- ``KubeConflict`` (409: re-read and retry), ``KubeTooManyRequests`` (429: an eviction a
  PodDisruptionBudget refuses, with the cause naming it; or API Priority and Fairness, with
  ``Retry-After``), ``KubeNotFound`` (404),
  ``KubeRejected`` (any other refusal, with the Status message).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from kubernetes.config.kube_config import (
    KUBE_CONFIG_DEFAULT_LOCATION,
    KubeConfigLoader,
    KubeConfigMerger,
)

from gpuops.integrations.kubernetes.names import verb_of

log = logging.getLogger(__name__)

T = TypeVar("T")

NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
"""A DNS-1123 subdomain: what a node, pod or workload name may be (namespaces are stricter)."""
NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

FIELD_MANAGER = "gpuops"
"""The ``fieldManager`` of every write: the node's ``managedFields`` then prove which fields
gpuops set (its cordon is gpuops' only while ``spec.unschedulable`` is owned by it)."""

CONFLICT_RETRIES = 5
"""How often a caller reads an object again after a 409 before it gives up (a temporary error)."""

EXEC_TIMEOUT_S = 30.0
"""Seconds a kubeconfig's exec credential plugin may run before it is killed (default of
``executors.kubernetes.exec_timeout_s``): long enough for one that fetches a token over the
network (aws eks get-token, gke-gcloud-auth-plugin, kubelogin), short enough that a hung one
fails its action instead of holding the executor."""

EXEC_RUNNER = Path(__file__).with_name("execplugin.py")
"""What runs the plugin with its deadline (``gpuops.integrations.kubernetes.execplugin``)."""

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class KubeError(Exception):
    """Base of what this client raises."""


class KubeUnavailable(KubeError):
    """The API server cannot be reached or is failing now (a retry may pass)."""


class KubeForbidden(KubeError):
    """401/403: the credentials or the RBAC rules do not allow the call."""


class KubeConflict(KubeError):
    """409: the object changed since it was read (or already exists)."""


class KubeUnauthorized(KubeForbidden):
    """401: the credentials were refused (an expired exec-plugin token or certificate)."""


class KubeTooManyRequests(KubeError):
    """429: the API server refused for now: an eviction a PodDisruptionBudget does not allow
    (``budget``: the cause's message naming it), or API Priority and Fairness shedding load
    (``retry_after``: the seconds it asked to wait, from ``Retry-After`` or the Status)."""

    def __init__(
        self, message: str, retry_after: float | None = None, budget: str | None = None
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.budget = budget


class KubeNotFound(KubeError):
    """404: no such object."""


class KubeRejected(KubeError):
    """Any other refusal (400, 415, 422...): trying again will not help."""


def check_name(kind: str, value: str) -> str:
    """``value`` when it is a Kubernetes object name (a namespace's when ``kind`` is
    ``namespace``); ``KubeRejected`` otherwise, naming ``kind`` and the value."""
    pattern = NAMESPACE_RE if kind == "namespace" else NAME_RE
    if not pattern.fullmatch(value):
        raise KubeRejected(f"{kind} {value!r} is not a Kubernetes name ({pattern.pattern})")
    return value


def check_kubeconfig(path: str | None, exec_timeout_s: float = EXEC_TIMEOUT_S) -> str | None:
    """What is wrong with the kubeconfig at ``path`` (None: nothing, or none given): missing,
    unreadable, no current context, or no credentials once loaded (an exec plugin that failed
    or ran past ``exec_timeout_s``: the client only logs it) (for ``gpuops rules check
    --config``)."""
    if path is None:
        return None
    file = Path(path).expanduser()
    if not file.is_file():
        return f"kubeconfig {path} does not exist"
    configuration = type.__call__(k8s.Configuration)
    try:
        failed = load_kubeconfig(str(file), None, configuration, exec_timeout_s)
    except (OSError, ConfigException, ValueError, TypeError, yaml.YAMLError) as exc:
        return f"kubeconfig {path} cannot be read: {exc}"
    if not _credentials(configuration):
        return f"kubeconfig {path} gives no credentials (no token, no client certificate): " + (
            f"its exec plugin failed: {failed}"
            if failed
            else "its exec plugin or auth provider failed, or its user has none"
        )
    return None


def load_kubeconfig(
    path: str | None, context: str | None, configuration: Any, exec_timeout_s: float
) -> str | None:
    """Load the kubeconfig at ``path`` (the client's default when None; several joined by
    ``:`` as ``KUBECONFIG``) into ``configuration``, as ``kubernetes.config.load_kube_config``
    does, but with every user's ``exec:`` plugin run through ``EXEC_RUNNER``: killed after
    ``exec_timeout_s``, at this load and at each token refresh the client makes later. What the
    plugin's failure was, when it failed here (the client logs it and goes on without
    credentials), else None. Raises what the client raises for a kubeconfig it cannot read."""
    merged = KubeConfigMerger(path or KUBE_CONFIG_DEFAULT_LOCATION)  # type: ignore[no-untyped-call]
    if merged.config is None:
        raise ConfigException("no configuration found")  # type: ignore[no-untyped-call]
    for user in merged.config.value.get("users") or []:
        spec = user.value.get("user") if isinstance(user.value, Mapping) else None
        if not isinstance(spec, Mapping):
            continue
        plugin = spec.get("exec")
        if isinstance(plugin, Mapping) and plugin.get("command"):
            bounded = {
                **plugin,
                "command": sys.executable,
                "args": [
                    "-I",
                    str(EXEC_RUNNER),
                    f"{exec_timeout_s:g}",
                    str(plugin["command"]),
                    *[str(a) for a in plugin.get("args") or []],
                ],
            }
            user.value = {**user.value, "user": {**spec, "exec": bounded}}
    loader = KubeConfigLoader(  # type: ignore[no-untyped-call]
        config_dict=merged.config,
        active_context=context,
        config_base_path=None,
        config_persister=merged.save_changes,
    )
    with _exec_errors() as errors:
        loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
    return "; ".join(errors) or None


@contextmanager
def _exec_errors() -> Iterator[list[str]]:
    """The errors the client logs in this thread meanwhile: it logs an exec plugin's failure
    (``exec: process returned 124. exec plugin 'x' gave no credentials within...``) on the root
    logger and goes on without credentials."""
    found: list[str] = []
    thread = threading.get_ident()

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.thread == thread and record.getMessage().startswith("exec:"):
                found.append(record.getMessage())

    handler = Catch(logging.ERROR)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield found
    finally:
        root.removeHandler(handler)


def _credentials(configuration: Any) -> bool:
    return bool(
        any(configuration.api_key.values())  # "BearerToken" (or "authorization" before)
        or configuration.cert_file
        or configuration.username
    )


class TokenBucket:
    """At most ``burst`` calls at once, refilled at ``qps`` per second; ``take`` waits."""

    def __init__(
        self,
        qps: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.qps = qps
        self.burst = burst
        self._tokens = float(burst)
        self._clock = clock
        self._sleep = sleep
        self._at = clock()
        self._lock = threading.Lock()

    def take(self) -> float:
        """Take one token, waiting for it; returns the seconds waited."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.qps)
            self._at = now
            self._tokens -= 1
            wait = -self._tokens / self.qps if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)
        return wait


class KubeClient:
    """The API calls the executor makes, rate limited, errors mapped (module docstring)."""

    def __init__(
        self,
        kubeconfig: str | None = None,
        context: str | None = None,
        in_cluster: bool = False,
        qps: float = 5.0,
        burst: int = 10,
        timeout_s: float = 10.0,
        bucket: TokenBucket | None = None,
        exec_timeout_s: float = EXEC_TIMEOUT_S,
    ) -> None:
        """``exec_timeout_s``: how long the kubeconfig's exec credential plugin may run, at
        this build and at each token refresh (``load_kubeconfig``); a plugin that failed or
        ran past it is ``KubeUnavailable`` saying so."""
        configuration = type.__call__(k8s.Configuration)
        where = "the in-cluster service account" if in_cluster else f"kubeconfig {kubeconfig}"
        failed = None
        try:
            if in_cluster:
                k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
            else:
                failed = load_kubeconfig(kubeconfig, context, configuration, exec_timeout_s)
        except (OSError, ConfigException, ValueError, TypeError, yaml.YAMLError) as exc:
            raise KubeUnavailable(f"{where} cannot be loaded: {exc}") from exc
        if failed and not _credentials(configuration):
            raise KubeUnavailable(f"{where}: its exec plugin gave no credentials: {failed}")
        configuration.retries = 0  # the executor's retry policy decides, not urllib3
        self.address = str(configuration.host)
        self.timeout_s = timeout_s
        self.bucket = bucket or TokenBucket(qps, burst)
        self.calls = 0
        """API calls made (for the calls-per-decision count)."""
        self._count = threading.Lock()
        api = k8s.ApiClient(configuration)
        self._api = api
        self.core = k8s.CoreV1Api(api)
        self.objects = k8s.CustomObjectsApi(api)

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]

    # --- the error mapping ----------------------------------------------------------------

    def _call(self, method: str, resource: str, group: str, fn: Callable[[], T]) -> T:
        self.bucket.take()
        with self._count:
            self.calls += 1
        try:
            return fn()
        except ApiException as exc:
            raise _mapped(exc, method, resource, group, self.address) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeUnavailable(f"API server {self.address} unreachable: {exc}") from exc
        except ValueError as exc:  # an answer the client's models do not read
            raise KubeRejected(f"{method} {resource}: unreadable answer: {exc}") from exc

    def _plain(self, value: Any) -> Any:
        return self._api.sanitize_for_serialization(value)  # type: ignore[no-untyped-call]

    def served_versions(self, group: str) -> tuple[str, ...]:
        """The versions of API group ``group`` the API server serves, its preferred one first
        (discovery, ``GET /apis``); empty when the group is not served (not installed)."""
        answer = self._call(
            "GET",
            "apis",
            "",
            lambda: k8s.ApisApi(self._api).get_api_versions(_request_timeout=self.timeout_s),
        )
        for item in self._plain(answer).get("groups") or []:
            if item.get("name") == group:
                preferred = (item.get("preferredVersion") or {}).get("version")
                versions = [str(v.get("version")) for v in item.get("versions") or []]
                return tuple(sorted(versions, key=lambda v: v != preferred))
        return ()

    # --- core/v1: nodes and pods ----------------------------------------------------------

    def nodes(self, selector: str, name: str | None = None) -> list[dict[str, Any]]:
        """The nodes ``selector`` (a label selector) matches (only node ``name``, if given: field
        selector ``metadata.name``): one LIST."""
        fields = f"metadata.name={check_name('node', name)}" if name is not None else None
        answer = self._call(
            "LIST",
            "nodes",
            "",
            lambda: self.core.list_node(
                label_selector=selector, field_selector=fields, _request_timeout=self.timeout_s
            ),
        )
        return list(self._plain(answer).get("items") or [])

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch of node ``name`` (put ``metadata.resourceVersion`` in it for a
        precondition: a stale one is a 409)."""
        check_name("node", name)
        answer = self._call(
            "PATCH",
            "nodes",
            "",
            lambda: self.core.patch_node(
                name,
                dict(patch),
                field_manager=FIELD_MANAGER,
                _content_type=MERGE_PATCH,
                _request_timeout=self.timeout_s,
            ),
        )
        return dict(self._plain(answer))

    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A strategic merge patch of node ``name``'s status (conditions merge by ``type``)."""
        check_name("node", name)
        answer = self._call(
            "PATCH",
            "nodes/status",
            "",
            lambda: self.core.patch_node_status(
                name,
                dict(patch),
                field_manager=FIELD_MANAGER,
                _content_type=STRATEGIC_MERGE_PATCH,
                _request_timeout=self.timeout_s,
            ),
        )
        return dict(self._plain(answer))

    def pods_on(self, node: str) -> list[dict[str, Any]]:
        """Every pod bound to ``node``, in all namespaces: one LIST by field selector."""
        check_name("node", node)
        answer = self._call(
            "LIST",
            "pods",
            "",
            lambda: self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={node}", _request_timeout=self.timeout_s
            ),
        )
        return list(self._plain(answer).get("items") or [])

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        check_name("namespace", namespace)
        check_name("pod", name)
        answer = self._call(
            "GET",
            "pods",
            "",
            lambda: self.core.read_namespaced_pod(name, namespace, _request_timeout=self.timeout_s),
        )
        return dict(self._plain(answer))

    def evict(self, namespace: str, name: str, uid: str | None = None) -> None:
        """POST an ``policy/v1`` Eviction of the pod: a 429 when a PodDisruptionBudget holds it;
        with ``uid``, a 409 when the pod of that name is another one now (recreated)."""
        check_name("namespace", namespace)
        check_name("pod", name)
        body = k8s.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=k8s.V1ObjectMeta(name=name, namespace=namespace),
            delete_options=_only(uid),
        )
        self._call(
            "POST",
            "pods/eviction",
            "",
            lambda: self.core.create_namespaced_pod_eviction(
                name, namespace, body, _request_timeout=self.timeout_s
            ),
        )

    def delete_pod(self, namespace: str, name: str, uid: str | None = None) -> None:
        """DELETE the pod (with ``uid``: only that pod, a 409 when it was recreated)."""
        check_name("namespace", namespace)
        check_name("pod", name)
        self._call(
            "DELETE",
            "pods",
            "",
            lambda: self.core.delete_namespaced_pod(
                name, namespace, body=_only(uid), _request_timeout=self.timeout_s
            ),
        )

    # --- any group: workloads, PDBs, Kueue, scalable resources ----------------------------

    def get(self, group: str, version: str, plural: str, namespace: str, name: str) -> Any:
        """GET a namespaced object of ``group/version`` (not the core group)."""
        check_name("namespace", namespace)
        check_name(plural, name)
        return self._call(
            "GET",
            plural,
            group,
            lambda: self.objects.get_namespaced_custom_object(
                group, version, namespace, plural, name, _request_timeout=self.timeout_s
            ),
        )

    def list_objects(
        self, group: str, version: str, plural: str, namespace: str, selector: str | None = None
    ) -> list[dict[str, Any]]:
        check_name("namespace", namespace)
        answer: Any = self._call(
            "LIST",
            plural,
            group,
            lambda: self.objects.list_namespaced_custom_object(
                group,
                version,
                namespace,
                plural,
                label_selector=selector,
                _request_timeout=self.timeout_s,
            ),
        )
        return list(dict(answer).get("items") or [])

    def patch(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
    ) -> Any:
        """A JSON merge patch (with ``metadata.resourceVersion``: a precondition)."""
        check_name("namespace", namespace)
        check_name(plural, name)
        return self._call(
            "PATCH",
            plural,
            group,
            lambda: self.objects.patch_namespaced_custom_object(
                group,
                version,
                namespace,
                plural,
                name,
                dict(patch),
                field_manager=FIELD_MANAGER,
                _content_type=MERGE_PATCH,
                _request_timeout=self.timeout_s,
            ),
        )

    def scale(self, group: str, version: str, plural: str, namespace: str, name: str) -> Any:
        """GET the ``scale`` subresource (an ``autoscaling/v1`` Scale)."""
        check_name("namespace", namespace)
        check_name(plural, name)
        return self._call(
            "GET",
            f"{plural}/scale",
            group,
            lambda: self.objects.get_namespaced_custom_object_scale(
                group, version, namespace, plural, name, _request_timeout=self.timeout_s
            ),
        )

    def replace_scale(
        self,
        group: str,
        version: str,
        plural: str,
        namespace: str,
        name: str,
        scale: Mapping[str, Any],
    ) -> Any:
        """PUT the ``scale`` subresource: its ``metadata.resourceVersion`` is the precondition
        (a 409 when the object changed since it was read)."""
        check_name("namespace", namespace)
        check_name(plural, name)
        return self._call(
            "PUT",
            f"{plural}/scale",
            group,
            lambda: self.objects.replace_namespaced_custom_object_scale(
                group,
                version,
                namespace,
                plural,
                name,
                dict(scale),
                field_manager=FIELD_MANAGER,
                _request_timeout=self.timeout_s,
            ),
        )


def _only(uid: str | None) -> k8s.V1DeleteOptions | None:
    """Delete options whose precondition is the pod's ``uid`` (None: no precondition)."""
    if uid is None:
        return None
    return k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=uid))


def _mapped(exc: ApiException, method: str, resource: str, group: str, address: str) -> KubeError:
    """``exc`` as this module's error, with the Status message of the API server."""
    status = int(exc.status or 0)
    message = _status_message(exc.body) or str(exc.reason or "")
    verb = "list" if method == "LIST" else verb_of(method)
    where = f"{resource} (apiGroup {group!r})"
    if status == 0:
        return KubeUnavailable(f"API server {address} unreachable: {exc.reason}")
    if status == 401:
        return KubeUnauthorized(
            f"API server {address} refused the credentials (401 Unauthorized): {message}"
        )
    if status == 403:
        return KubeForbidden(
            f"RBAC: gpuops needs verb {verb!r} on {where}; the API server said: {message}"
        )
    if status == 404:
        return KubeNotFound(message)
    if status == 409:
        return KubeConflict(message)
    if status == 429:
        return KubeTooManyRequests(message, _retry_after(exc), _budget_cause(exc.body))
    if status >= 500:
        return KubeUnavailable(f"API server {address}: {status} {message}")
    return KubeRejected(f"{method} {where}: {status} {message}")


def _retry_after(exc: ApiException) -> float | None:
    """The seconds a 429 asks to wait: its ``Retry-After`` header, or the Status's
    ``details.retryAfterSeconds``; None when it says nothing."""
    header = (exc.headers or {}).get("Retry-After")
    try:
        if header is not None:
            return max(0.0, float(header))
    except (TypeError, ValueError):
        pass
    seconds = _details(exc.body).get("retryAfterSeconds")
    return float(seconds) if isinstance(seconds, int | float) and seconds >= 0 else None


def _budget_cause(body: Any) -> str | None:
    """The message of a ``DisruptionBudget`` cause (an eviction a PodDisruptionBudget holds):
    ``The disruption budget <name> needs ...``; None for any other 429."""
    for cause in _details(body).get("causes") or []:
        if isinstance(cause, Mapping) and cause.get("reason") == "DisruptionBudget":
            return str(cause.get("message") or "a PodDisruptionBudget")[:256]
    return None


def _details(body: Any) -> Mapping[str, Any]:
    try:
        document = json.loads(body) if body else {}
    except (TypeError, ValueError):
        return {}
    details = document.get("details") if isinstance(document, Mapping) else None
    return details if isinstance(details, Mapping) else {}


def _status_message(body: Any) -> str:
    """The ``message`` of a ``Status`` body (capped at 256 characters)."""
    if not body:
        return ""
    try:
        document = json.loads(body)
    except (TypeError, ValueError):
        return str(body)[:256]
    if isinstance(document, Mapping):
        return str(document.get("message") or "")[:256]
    return ""
