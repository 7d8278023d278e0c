"""A fake Kubernetes API server on a loopback port 0 (stdlib ``http.server`` in a thread): the
wire contract the ``kubernetes`` executor relies on, as the API reference and kube-apiserver
define it, for the official ``kubernetes`` client to talk to.

What it serves: ``/api/v1`` nodes (list by label selector, get, merge and strategic merge
patch, ``/status``), pods (list by field selector ``spec.nodeName``, get, delete with a grace
period: ``deletionTimestamp`` set, the pod stays, as without a kubelet; ``/eviction`` as
``policy/v1`` Eviction: 429 Status with a ``DisruptionBudget`` cause when a matching PDB's
``status.disruptionsAllowed`` is 0, 500 when more than one PDB matches); ``/apis/<group>/<v>``
namespaced objects (list by label selector, get, merge patch; strategic merge patch only for
built-in groups, 415 for custom resources) and the ``/scale`` subresource (``autoscaling/v1``
Scale over ``spec.replicas``, PUT with a ``resourceVersion`` precondition). Every write bumps
a cluster-wide ``resourceVersion``; a patch or PUT naming a stale one is a 409 Conflict.
Bearer tokens: none or unknown is a 401, a call outside ``allowed`` (RBAC rules) a 403 with the
API server's message. ``GET /apis`` is discovery; a version a group does not serve is a 404.
Writes record ``metadata.managedFields`` (the ``fieldManager`` query, else the user agent) for
``spec``, labels and annotations; a label or taint value that is no label value is a 422; an
eviction of a Pending, finished or terminating pod ignores PodDisruptionBudgets, and a PDB
whose ``status.observedGeneration`` is behind its ``generation`` answers 429 (``retryAfterSeconds``
10), an unready pod goes without using a disruption when the budget is met (or with
``unhealthyPodEvictionPolicy: AlwaysAllow``), and an evicted pod gets the ``DisruptionTarget``
condition. ``throttle``
answers the next requests 429 with ``Retry-After`` (API Priority and Fairness). Not served:
watches, JSON patch, server-side apply, admission, controllers (a Deployment's pods are not
created; a PDB's status is what the test sets), generateName, CRD conversion webhooks.
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

BUILT_IN_GROUPS = frozenset({"", "apps", "batch", "policy"})
MERGE_KEYS: Mapping[str, str] = {"conditions": "type"}
"""The lists strategic merge patch merges by a key (Node ``status.conditions``: ``patchMergeKey``
in the API reference); every other list is replaced, ``spec.taints`` included (it has no
``patchStrategy`` in k8s.io/api core/v1)."""
SERVED: Mapping[str, tuple[str, ...]] = {
    "apps": ("v1",),
    "batch": ("v1",),
    "policy": ("v1",),
    "kueue.x-k8s.io": ("v1beta2",),
    "cluster.x-k8s.io": ("v1beta2", "v1beta1"),
}
"""The versions each API group serves, the preferred first (Kueue 0.16 and later serve
v1beta2; Cluster API serves v1beta1 through its conversion webhook)."""
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
"""``validation.IsValidLabelValue``: at most 63 characters, alphanumeric at both ends."""
DEFAULT_MANAGER = "OpenAPI-Generator"
"""The field manager of a write without ``fieldManager``: the client's user agent, cut at
its first ``/`` (as kube-apiserver does)."""

Key = tuple[str, str, str, str]
"""(group, plural, namespace, name); namespace ``""`` for cluster-scoped objects."""


@dataclass
class Request:
    method: str
    path: str
    content_type: str
    at: float = field(default_factory=time.monotonic)
    """When it came (``time.monotonic``), for the end-to-end timings."""
    status: int = 0
    """What it was answered."""


@dataclass
class FakeApiServer:
    """The objects by key; ``allowed``: (verb, group, resource) the token may call (None: all)."""

    token: str = "gpuops-token"
    allowed: set[tuple[str, str, str]] | None = None
    objects: dict[Key, dict[str, Any]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    version: int = 100
    serves_only: set[str] | None = None
    """The API groups served (None: any): a group not served is a 404, as a CRD not installed."""
    served: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(SERVED))
    """The versions each group serves (discovery; any other version is a 404)."""
    throttle: int = 0
    """The next so many requests are answered 429 by API Priority and Fairness
    (``Retry-After: 1``), as a busy API server sheds load."""
    before: Callable[[str, str], None] | None = None
    """Called with (method, path) before each request is served: a test's concurrent writer."""

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._manager = DEFAULT_MANAGER
        """The field manager of the request being served."""
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server._handle(self, "GET")

            def do_POST(self) -> None:
                server._handle(self, "POST")

            def do_PUT(self) -> None:
                server._handle(self, "PUT")

            def do_PATCH(self) -> None:
                server._handle(self, "PATCH")

            def do_DELETE(self) -> None:
                server._handle(self, "DELETE")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def kubeconfig(self, token: str | None = None) -> str:
        """A kubeconfig (YAML is JSON) that points the client at this server."""
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                "users": [{"name": "gpuops", "user": {"token": token or self.token}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "gpuops"}}],
                "current-context": "fake",
            }
        )

    # --- objects, for tests ------------------------------------------------------------------

    def put(self, group: str, plural: str, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Store ``obj`` (created now: uid, resourceVersion, creationTimestamp)."""
        with self._lock:
            stored = copy.deepcopy(dict(obj))
            meta = stored.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            meta["resourceVersion"] = self._bump()
            key = (group, plural, str(meta.get("namespace") or ""), str(meta["name"]))
            self.objects[key] = stored
            return copy.deepcopy(stored)

    def get(self, group: str, plural: str, name: str, namespace: str = "") -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self.objects[(group, plural, namespace, name)])

    def has(self, group: str, plural: str, name: str, namespace: str = "") -> bool:
        with self._lock:
            return (group, plural, namespace, name) in self.objects

    def edit(
        self,
        group: str,
        plural: str,
        name: str,
        namespace: str = "",
        *,
        manager: str = "kubectl",
        **merge: Any,
    ) -> None:
        """A change by someone else (field manager ``manager``: ``kubectl``, as ``kubectl
        cordon``, ``uncordon`` or ``edit``): ``merge`` merge-patched into the object."""
        with self._lock:
            key = (group, plural, namespace, name)
            current = self.objects[key]
            merged = _merge(current, merge)
            _manage(merged, current, merge, manager)
            self.objects[key] = merged
            self.objects[key]["metadata"]["resourceVersion"] = self._bump()

    def writes(self) -> list[Request]:
        return [r for r in self.requests if r.method != "GET"]

    def _bump(self) -> str:
        self.version += 1
        return str(self.version)

    # --- the wire ------------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(h.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        content_type = (h.headers.get("Content-Type") or "").split(";")[0].strip()
        with self._lock:
            request = Request(method, parts.path, content_type)
            self.requests.append(request)
            if self.before is not None:
                self.before(method, parts.path)
            headers = {}
            if h.headers.get("Authorization") != f"Bearer {self.token}":
                code, doc = 401, _status(401, "Unauthorized", "Unauthorized")
            elif self.throttle > 0:
                self.throttle -= 1
                code, doc = (
                    429,
                    _status(
                        429,
                        "TooManyRequests",
                        "Too many requests, please try again later.",
                        {"retryAfterSeconds": 1},
                    ),
                )
                headers["Retry-After"] = "1"
            else:
                agent = (h.headers.get("User-Agent") or DEFAULT_MANAGER).split("/")[0]
                self._manager = query.get("fieldManager") or agent
                try:
                    code, doc = self._route(method, parts.path, query, body, content_type)
                except _Failure as failure:
                    code, doc = failure.code, failure.doc
            after = (doc.get("details") or {}).get("retryAfterSeconds")
            if after:  # as kube-apiserver's responsewriters write it
                headers["Retry-After"] = str(after)
            request.status = code
        payload = json.dumps(doc).encode()
        h.send_response(code)
        for name, value in headers.items():
            h.send_header(name, value)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)

    def _route(
        self, method: str, path: str, query: Mapping[str, str], body: bytes, content_type: str
    ) -> tuple[int, dict[str, Any]]:
        # path segments are percent-decoded one by one: an encoded "/" stays inside its name
        segments = [unquote(s) for s in path.strip("/").split("/")]
        if segments == ["apis"] and method == "GET":
            return 200, self._discovery()
        if segments[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", segments[2:]
        elif segments[:1] == ["apis"] and len(segments) >= 3:
            group, version, rest = segments[1], segments[2], segments[3:]
        else:
            raise _Failure(404, _status(404, "NotFound", "the server could not find the request"))
        if group and (not self._serves(group) or version not in self.served.get(group, ())):
            raise _Failure(404, _status(404, "NotFound", "the server could not find the request"))
        namespace = ""
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        if not rest or len(rest) > 3:
            raise _Failure(404, _status(404, "NotFound", "the server could not find the request"))
        plural = rest[0]
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
        resource = f"{plural}/{sub}" if sub else plural
        verb = {"GET": "get" if name else "list", "POST": "create", "PUT": "update"}.get(
            method, method.lower()
        )
        self._authorize(verb, group, resource, name, namespace)
        if not name:
            if method != "GET":
                raise _Failure(405, _status(405, "MethodNotAllowed", "method not allowed"))
            return 200, self._list(group, version, plural, namespace, query)
        key = (group, plural, namespace, name)
        if method == "POST" and sub == "eviction" and plural == "pods":
            return self._evict(key, json.loads(body or b"{}"))
        obj = self.objects.get(key)
        if obj is None:
            raise _Failure(404, _not_found(plural, name, group))
        if sub == "scale":
            return self._scale(method, key, body)
        if sub not in ("", "status"):
            raise _Failure(404, _status(404, "NotFound", "the server could not find the request"))
        if method == "GET":
            return 200, copy.deepcopy(obj)
        if method == "PATCH":
            return 200, self._patch(key, json.loads(body), content_type, sub)
        if method == "DELETE":
            _precondition(obj, json.loads(body or b"{}"))
            return 200, self._delete(key)
        raise _Failure(405, _status(405, "MethodNotAllowed", "method not allowed"))

    def _serves(self, group: str) -> bool:
        return group in self.served and (self.serves_only is None or group in self.serves_only)

    def _discovery(self) -> dict[str, Any]:
        """``GET /apis``: an ``APIGroupList`` of the groups served."""
        groups = []
        for name, versions in sorted(self.served.items()):
            if not self._serves(name):
                continue
            listed = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
            groups.append({"name": name, "versions": listed, "preferredVersion": listed[0]})
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def _authorize(self, verb: str, group: str, resource: str, name: str, namespace: str) -> None:
        if self.allowed is None or (verb, group, resource) in self.allowed:
            return
        what = (
            f'{resource.split("/")[0]} "{name}" is forbidden'
            if name
            else f"{resource} is forbidden"
        )
        scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
        raise _Failure(
            403,
            _status(
                403,
                "Forbidden",
                f'{what}: User "system:serviceaccount:gpuops:gpuops" cannot {verb} resource '
                f'"{resource}" in API group "{group}" {scope}',
                {"name": name, "kind": resource.split("/")[0]},
            ),
        )

    def _list(
        self, group: str, version: str, plural: str, namespace: str, query: Mapping[str, str]
    ) -> dict[str, Any]:
        selector = parse_selector(query.get("labelSelector", ""))
        fields = parse_fields(query.get("fieldSelector", ""))
        items = []
        for (g, p, ns, _), obj in sorted(self.objects.items()):
            if g != group or p != plural or (namespace and ns != namespace):
                continue
            if not matches(selector, obj["metadata"].get("labels") or {}):
                continue
            if not all(_field(obj, k) == v for k, v in fields.items()):
                continue
            items.append(copy.deepcopy(obj))
        kind = (items[0].get("kind") if items else None) or "List"
        return {
            "kind": f"{kind}List" if kind != "List" else kind,
            "apiVersion": f"{group}/{version}" if group else version,
            "metadata": {"resourceVersion": str(self.version)},
            "items": items,
        }

    def _patch(
        self, key: Key, patch: Mapping[str, Any], content_type: str, sub: str
    ) -> dict[str, Any]:
        group, plural, _, name = key
        if content_type == "application/strategic-merge-patch+json":
            if group not in BUILT_IN_GROUPS:
                raise _Failure(
                    415,
                    _status(
                        415,
                        "UnsupportedMediaType",
                        "the body of the request was in an unknown format - accepted media "
                        "types include: application/json-patch+json, "
                        "application/merge-patch+json, application/apply-patch+yaml",
                    ),
                )
            strategic = True
        elif content_type == "application/merge-patch+json":
            strategic = False
        else:
            raise _Failure(415, _status(415, "UnsupportedMediaType", f"{content_type} not served"))
        current = self.objects[key]
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
            raise _Failure(409, _conflict(plural, name, group))
        if sub == "status":
            patch = {"status": patch.get("status")} if "status" in patch else {}
        else:
            patch = {k: v for k, v in patch.items() if k != "status"}
        merged = _merge(current, patch, strategic)
        _validate(plural, name, merged)
        _manage(merged, current, patch, self._manager)
        merged["metadata"]["resourceVersion"] = self._bump()
        merged["metadata"]["uid"] = current["metadata"]["uid"]
        self.objects[key] = merged
        return copy.deepcopy(merged)

    def _delete(self, key: Key, disrupted: bool = False) -> dict[str, Any]:
        obj = self.objects[key]
        if disrupted:  # an eviction marks the pod first (the DisruptionTarget condition)
            conditions = obj.setdefault("status", {}).setdefault("conditions", [])
            conditions.append(
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "EvictionByEvictionAPI",
                    "message": "Eviction API: evicting",
                    "lastTransitionTime": _now(),
                }
            )
        if key[1] == "pods":  # graceful: the kubelet would remove it; without one it stays
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = _now()
                obj["metadata"]["deletionGracePeriodSeconds"] = 30
                obj["metadata"]["resourceVersion"] = self._bump()
            return copy.deepcopy(obj)
        del self.objects[key]
        return _status(200, "", "", status="Success")

    def _evict(self, key: Key, body: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
        _, _, namespace, name = key
        if body.get("kind") != "Eviction" or body.get("apiVersion") not in ("policy/v1",):
            raise _Failure(400, _status(400, "BadRequest", "expected a policy/v1 Eviction"))
        if (body.get("metadata") or {}).get("name") != name:
            raise _Failure(
                400,
                _status(400, "BadRequest", "name in URL does not match name in Eviction object"),
            )
        pod = self.objects.get(key)
        if pod is None:
            raise _Failure(404, _not_found("pods", name, ""))
        _precondition(pod, body.get("deleteOptions") or {})
        if pod["metadata"].get("deletionTimestamp"):
            return 201, _status(201, "", "", status="Success")
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed", "Pending"):
            self._delete(key, disrupted=True)  # canIgnorePDB: no budget counts it
            return 201, _status(201, "", "", status="Success")
        labels = pod["metadata"].get("labels") or {}
        pdbs = [
            (k, obj)
            for k, obj in self.objects.items()
            if k[:3] == ("policy", "poddisruptionbudgets", namespace)
            and matches(_from_label_selector(obj["spec"].get("selector") or {}), labels)
        ]
        if len(pdbs) > 1:
            raise _Failure(
                500,
                _status(
                    500,
                    "InternalError",
                    "Internal error occurred: This pod has more than one PodDisruptionBudget, "
                    "which the eviction subresource does not support.",
                ),
            )
        if pdbs:
            pdb_key, pdb = pdbs[0]
            status = pdb.setdefault("status", {})
            if not _ready(pod) and (
                pdb["spec"].get("unhealthyPodEvictionPolicy") == "AlwaysAllow"
                or int(status.get("currentHealthy") or 0)
                >= int(status.get("desiredHealthy") or 0)
                > 0
            ):  # an unready pod the budget does not count: evicted, nothing decremented
                self._delete(key, disrupted=True)
                return 201, _status(201, "", "", status="Success")
            generation = int(pdb["metadata"].get("generation") or 0)
            if int(status.get("observedGeneration") or generation) < generation:
                raise _Failure(
                    429,
                    _status(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        {
                            "retryAfterSeconds": 10,
                            "causes": [
                                {
                                    "reason": "DisruptionBudget",
                                    "message": f"The disruption budget {pdb_key[3]} is still "
                                    "being processed by the server.",
                                }
                            ],
                        },
                    ),
                )
            if int(status.get("disruptionsAllowed") or 0) <= 0:
                raise _Failure(
                    429,
                    _status(
                        429,
                        "TooManyRequests",
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                        {
                            "causes": [
                                {
                                    "reason": "DisruptionBudget",
                                    "message": f"The disruption budget {pdb_key[3]} needs "
                                    f"{status.get('desiredHealthy', 0)} healthy pods and has "
                                    f"{status.get('currentHealthy', 0)} currently",
                                }
                            ]
                        },
                    ),
                )
            status["disruptionsAllowed"] = int(status["disruptionsAllowed"]) - 1
            pdb["metadata"]["resourceVersion"] = self._bump()
        self._delete(key, disrupted=True)
        return 201, _status(201, "", "", status="Success")

    def _scale(self, method: str, key: Key, body: bytes) -> tuple[int, dict[str, Any]]:
        group, plural, namespace, name = key
        obj = self.objects[key]
        if "replicas" not in (obj.get("spec") or {}) and plural not in (
            "deployments",
            "statefulsets",
            "replicasets",
            "machinedeployments",
        ):
            raise _Failure(404, _status(404, "NotFound", "the server could not find the request"))
        if method == "PUT":
            scale = json.loads(body)
            wanted = (scale.get("metadata") or {}).get("resourceVersion")
            if wanted and wanted != obj["metadata"]["resourceVersion"]:
                raise _Failure(409, _conflict(plural, name, group))
            replicas = (scale.get("spec") or {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                raise _Failure(
                    422,
                    _status(
                        422,
                        "Invalid",
                        f'Scale.autoscaling "{name}" is invalid: spec.replicas: Invalid value: '
                        f"{replicas}: must be greater than or equal to 0",
                    ),
                )
            obj.setdefault("spec", {})["replicas"] = replicas
            obj["metadata"]["resourceVersion"] = self._bump()
        elif method != "GET":
            raise _Failure(405, _status(405, "MethodNotAllowed", "method not allowed"))
        spec = obj.get("spec") or {}
        selector = spec.get("selector") or {}
        return 200, {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": obj["metadata"]["uid"],
                "resourceVersion": obj["metadata"]["resourceVersion"],
                "creationTimestamp": obj["metadata"]["creationTimestamp"],
            },
            "spec": {"replicas": int(spec.get("replicas", 1))},
            "status": {
                "replicas": int((obj.get("status") or {}).get("replicas", 0)),
                "selector": ",".join(
                    f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()
                ),
            },
        }


class _Failure(Exception):
    def __init__(self, code: int, doc: dict[str, Any]) -> None:
        super().__init__(doc.get("message"))
        self.code = code
        self.doc = doc


def _status(
    code: int,
    reason: str,
    message: str,
    details: Mapping[str, Any] | None = None,
    status: str = "Failure",
) -> dict[str, Any]:
    """A ``metav1.Status`` as kube-apiserver writes it."""
    doc: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": status}
    if message:
        doc["message"] = message
    if reason:
        doc["reason"] = reason
    if details:
        doc["details"] = dict(details)
    doc["code"] = code
    return doc


def _not_found(plural: str, name: str, group: str) -> dict[str, Any]:
    what = f"{plural}.{group}" if group else plural
    return _status(
        404,
        "NotFound",
        f'{what} "{name}" not found',
        {"name": name, "group": group, "kind": plural},
    )


def _conflict(plural: str, name: str, group: str) -> dict[str, Any]:
    what = f"{plural}.{group}" if group else plural
    return _status(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {what} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        {"name": name, "group": group, "kind": plural},
    )


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _merge(current: Mapping[str, Any], patch: Mapping[str, Any], strategic: bool = False) -> Any:
    """RFC 7386 JSON merge patch (null deletes, objects merge, lists are replaced); strategic:
    the lists of ``MERGE_KEYS`` merge item by item on their key."""
    out = copy.deepcopy(dict(current))
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(out[k], v, strategic)
        elif strategic and k in MERGE_KEYS and isinstance(v, list):
            out[k] = _merge_list(list(out.get(k) or []), v, MERGE_KEYS[k])
        else:
            out[k] = _merge({}, v, strategic) if isinstance(v, Mapping) else copy.deepcopy(v)
    return out


def _merge_list(current: list[Any], patch: Iterable[Any], key: str) -> list[Any]:
    out = list(current)
    for item in patch:
        index = next((i for i, c in enumerate(out) if c.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if index is not None:
                out.pop(index)
        elif index is None:
            out.append(copy.deepcopy(item))
        else:
            out[index] = _merge(out[index], item, True)
    return out


# --- validation and field managers -----------------------------------------------------------


def _ready(pod: Mapping[str, Any]) -> bool:
    """The pod's Ready condition is True (none: not ready, as the disruption controller reads
    it)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _precondition(obj: Mapping[str, Any], options: Mapping[str, Any]) -> None:
    """409 when ``options.preconditions.uid`` names another object than ``obj``."""
    uid = (options.get("preconditions") or {}).get("uid")
    if uid is not None and uid != obj["metadata"]["uid"]:
        raise _Failure(
            409,
            _status(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                f"{obj['metadata']['uid']}",
            ),
        )


def _validate(plural: str, name: str, obj: Mapping[str, Any]) -> None:
    """422 for a label value or a node taint value that is no label value, as kube-apiserver's
    validation (``IsValidLabelValue``) refuses it."""
    found = [
        (f"metadata.labels: {key}", value)
        for key, value in ((obj.get("metadata") or {}).get("labels") or {}).items()
    ]
    if plural == "nodes":
        taints = (obj.get("spec") or {}).get("taints") or []
        found += [(f"spec.taints[{i}].value", t.get("value") or "") for i, t in enumerate(taints)]
    for where, value in found:
        if len(str(value)) > 63 or not LABEL_VALUE.fullmatch(str(value)):
            kind = {"nodes": "Node", "pods": "Pod"}.get(plural, plural)
            raise _Failure(
                422,
                _status(
                    422,
                    "Invalid",
                    f'{kind} "{name}" is invalid: {where}: Invalid value: "{value}": a valid '
                    "label must be an empty string or consist of alphanumeric characters, '-', "
                    "'_' or '.', and must start and end with an alphanumeric character, at most "
                    "63 characters",
                    {"name": name, "kind": plural},
                ),
            )


def _manage(
    merged: dict[str, Any], current: Mapping[str, Any], patch: Mapping[str, Any], manager: str
) -> None:
    """``metadata.managedFields`` after an update by ``manager``: it owns every field the
    update changed (taken from the others); a field removed is owned by no one."""
    changed = {p for p in _leaves(merged) if _at(merged, p) != _at(current, p)}
    removed = {p for p in _leaves(current) if _at(merged, p) is _MISSING}
    owned: dict[str, set[tuple[str, ...]]] = {}
    for entry in (current.get("metadata") or {}).get("managedFields") or []:
        owned[entry["manager"]] = _paths(entry.get("fieldsV1") or {})
    for paths in owned.values():
        paths -= changed | removed
    owned.setdefault(manager, set()).update(changed)
    merged["metadata"]["managedFields"] = [
        {
            "manager": who,
            "operation": "Update",
            "apiVersion": str(merged.get("apiVersion") or "v1"),
            "time": _now(),
            "fieldsType": "FieldsV1",
            "fieldsV1": _fields(paths),
        }
        for who, paths in sorted(owned.items())
        if paths
    ]


_MISSING = object()


def _leaves(obj: Mapping[str, Any]) -> set[tuple[str, ...]]:
    """The fields managers own: ``spec``'s leaves (a list is one leaf), labels, annotations."""
    out: set[tuple[str, ...]] = set()

    def walk(value: Any, path: tuple[str, ...]) -> None:
        if isinstance(value, Mapping) and value:
            for k, v in value.items():
                walk(v, (*path, str(k)))
        else:
            out.add(path)

    walk(obj.get("spec") or {}, ("spec",))
    meta = obj.get("metadata") or {}
    for part in ("labels", "annotations"):
        walk(meta.get(part) or {}, ("metadata", part))
    return {p for p in out if len(p) > 1 and not (len(p) == 2 and p[0] == "metadata")}


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if not isinstance(obj, Mapping) or part not in obj:
            return _MISSING
        obj = obj[part]
    return obj


def _paths(fields: Mapping[str, Any], path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = set()
    for k, v in fields.items():
        here = (*path, k.removeprefix("f:"))
        out |= _paths(v, here) if v else {here}
    return out


def _fields(paths: Iterable[tuple[str, ...]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in sorted(paths):
        level = out
        for part in path:
            level = level.setdefault(f"f:{part}", {})
    return out


# --- selectors ------------------------------------------------------------------------------

Requirement = tuple[str, str, frozenset[str]]
"""(key, operator, values): operator one of ``=``, ``!=``, ``in``, ``notin``, ``exists``,
``!``."""


def parse_selector(text: str) -> list[Requirement]:
    """A label selector as ``labels.Parse`` reads it (equality- and set-based)."""
    out: list[Requirement] = []
    for part in re.split(r",(?![^()]*\))", text.strip()) if text.strip() else []:
        part = part.strip()
        if m := re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)", part):
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            out.append((m.group(1), m.group(2), values))
        elif m := re.fullmatch(r"([\w./-]+)\s*(==|=|!=)\s*([\w.-]*)", part):
            out.append((m.group(1), "!=" if m.group(2) == "!=" else "=", frozenset({m.group(3)})))
        elif m := re.fullmatch(r"!\s*([\w./-]+)", part):
            out.append((m.group(1), "!", frozenset()))
        elif re.fullmatch(r"[\w./-]+", part):
            out.append((part, "exists", frozenset()))
        else:
            raise _Failure(
                400, _status(400, "BadRequest", f"unable to parse requirement: {part!r}")
            )
    return out


def _from_label_selector(selector: Mapping[str, Any]) -> list[Requirement]:
    out: list[Requirement] = [
        (k, "=", frozenset({str(v)})) for k, v in (selector.get("matchLabels") or {}).items()
    ]
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for expr in selector.get("matchExpressions") or []:
        out.append((expr["key"], ops[expr["operator"]], frozenset(expr.get("values") or ())))
    return out


def matches(selector: list[Requirement], labels: Mapping[str, str]) -> bool:
    for key, op, values in selector:
        value = labels.get(key)
        ok = {
            "=": value in values,
            "in": value in values,
            "!=": value not in values,
            "notin": value not in values,
            "exists": value is not None,
            "!": value is None,
        }[op]
        if not ok:
            return False
    return True


def parse_fields(text: str) -> dict[str, str]:
    out = {}
    for part in text.split(",") if text else []:
        name, _, value = part.partition("=")
        if name not in ("spec.nodeName", "metadata.name", "metadata.namespace", "status.phase"):
            raise _Failure(
                400,
                _status(400, "BadRequest", f"field label not supported: {name}"),
            )
        out[name] = value
    return out


def _field(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = (value or {}).get(part)
    return "" if value is None else str(value)
