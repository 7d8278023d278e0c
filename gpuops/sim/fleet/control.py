"""The control API of the simulated fleet: JSON over HTTP, plus the fleet's /metrics.

Served by ``gpuops.sim.fleet.sim`` on the control port; called by the engine's ``fleet``
executor, the demo and the end-to-end tests. Routes (all under /api/v1) map onto
``gpuops.sim.fleet.operations``. Every mutating call accepts ``decision_id`` in its JSON body: a
repeated id returns the first successful call's response with no second effect. Errors answer
``{"error": reason}``: 400 bad input, 404 unknown uuid/node/pool/job, 405 wrong method, 409 the
fleet's state forbids it. Bad input never produces a 500.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gpuops.sim.fleet import operations as ops
from gpuops.sim.fleet.cluster import Cluster
from gpuops.sim.fleet.config import JobSpec
from gpuops.sim.fleet.errors import BadRequest, FleetError, NotFound
from gpuops.sim.fleet.listener import QuietHandler

log = logging.getLogger(__name__)

Body = dict[str, Any]
Route = Callable[[Cluster, list[str], Body], dict[str, object]]
MAX_BODY = 1 << 20


class Idempotency:
    """Responses of successful mutating calls by ``decision_id`` (oldest forgotten first)."""

    def __init__(self, capacity: int = 10_000) -> None:
        self.capacity = capacity
        self.lock = threading.Lock()
        self._seen: OrderedDict[str, tuple[int, dict[str, object]]] = OrderedDict()

    def get(self, key: str) -> tuple[int, dict[str, object]] | None:
        return self._seen.get(key)

    def put(self, key: str, status: int, response: dict[str, object]) -> None:
        self._seen[key] = (status, response)
        while len(self._seen) > self.capacity:
            self._seen.popitem(last=False)


# --- field readers: each names the field and what it wanted --------------------------------


def _int(body: Body, key: str, default: int | None = None) -> int:
    value = body.get(key, default)
    if value is None:
        raise BadRequest(f"field {key!r} is required (an integer)")
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"field {key!r} must be an integer, got {value!r}")
    return value


def _float(body: Body, key: str, default: float | None = None) -> float | None:
    value = body.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequest(f"field {key!r} must be a number, got {value!r}")
    return float(value)


def _str(body: Body, key: str, default: str | None = None) -> str:
    value = body.get(key, default)
    if not isinstance(value, str) or not value:
        raise BadRequest(f"field {key!r} must be a non-empty string, got {value!r}")
    return value


def _node(body: Body) -> str | None:
    value = body.get("node")
    if value is not None and (not isinstance(value, str) or not value):
        raise BadRequest(f"field 'node' must be a non-empty string, got {value!r}")
    return value


def _pool(body: Body) -> str:
    value = body.get("pool", "default")
    if not isinstance(value, str):
        raise BadRequest(f"field 'pool' must be a string, got {value!r}")
    return value  # "": any pool the job's priority class allows


# --- routes --------------------------------------------------------------------------------


def _submit(cluster: Cluster, _: list[str], body: Body) -> dict[str, object]:
    uuids = body.get("gpu_uuids") or []
    if not isinstance(uuids, list) or not all(isinstance(u, str) for u in uuids):
        raise BadRequest(f"field 'gpu_uuids' must be a list of strings, got {uuids!r}")
    node = body.get("node")
    if node is not None and not isinstance(node, str):
        raise BadRequest(f"field 'node' must be a string, got {node!r}")
    spec = JobSpec(
        profile=_str(body, "profile", "training"),
        gpus=_int(body, "gpus", len(uuids) or None),
        project=_str(body, "project", "default"),
        pool=_pool(body),
        duration_s=_float(body, "duration_s"),
        priority=_int(body, "priority", 0),
        memory_fraction=_float(body, "memory_fraction"),
        node=node,
        gpu_uuids=tuple(uuids),
        priority_class=str(body.get("priority_class") or ""),
        memory_gib=_float(body, "memory_gib"),
        checkpoint_interval_s=_float(body, "checkpoint_interval_s"),
    )
    with cluster.lock:
        return {"job": cluster.submit(spec).to_json()}


def _arrivals(cluster: Cluster, _: list[str], body: Body) -> dict[str, object]:
    rate = _float(body, "rate_per_min")
    if rate is None:
        raise BadRequest("field 'rate_per_min' is required (a number >= 0)")
    previous = cluster.set_arrival_rate(rate)
    changed = {} if previous == rate else {"rate_per_min": rate, "previous": previous}
    return {"changed": changed}


def _changed(fn: Callable[[Cluster, list[str], Body], dict[str, object]]) -> Route:
    return lambda c, a, b: {"changed": fn(c, a, b)}


ROUTES: list[tuple[str, re.Pattern[str], Route]] = [
    ("GET", re.compile(r"/api/v1/state"), lambda c, a, b: c.state()),
    ("POST", re.compile(r"/api/v1/jobs"), _submit),
    ("POST", re.compile(r"/api/v1/arrivals"), _arrivals),
    (
        "POST",
        re.compile(r"/api/v1/jobs/([^/]+)/profile"),
        _changed(lambda c, a, b: ops.set_profile(c, a[0], _str(b, "profile"))),
    ),
    (
        "POST",
        re.compile(r"/api/v1/gpus/([^/]+)/reclaim"),
        _changed(lambda c, a, b: ops.reclaim(c, a[0])),
    ),
    (
        "POST",
        re.compile(r"/api/v1/gpus/([^/]+)/pack"),
        _changed(lambda c, a, b: ops.pack(c, a[0])),
    ),
    (
        "POST",
        re.compile(r"/api/v1/pools/([^/]+)/lend"),
        _changed(lambda c, a, b: ops.lend(c, a[0])),
    ),
    (
        "DELETE",
        re.compile(r"/api/v1/pools/([^/]+)/lend"),
        _changed(lambda c, a, b: ops.unlend(c, a[0])),
    ),
    (
        "POST",
        re.compile(r"/api/v1/gpus/([^/]+)/clocks"),
        _changed(lambda c, a, b: ops.lock_clocks(c, a[0], _int(b, "max_clock_mhz"))),
    ),
    (
        "DELETE",
        re.compile(r"/api/v1/gpus/([^/]+)/clocks"),
        _changed(lambda c, a, b: ops.reset_clocks(c, a[0])),
    ),
    (
        "POST",
        re.compile(r"/api/v1/pools/([^/]+)/scale_out"),
        _changed(lambda c, a, b: ops.scale_out(c, a[0], _int(b, "nodes", 1))),
    ),
    (
        "POST",
        re.compile(r"/api/v1/pools/([^/]+)/scale_in"),
        _changed(lambda c, a, b: ops.scale_in(c, a[0], _int(b, "nodes", 1), _node(b))),
    ),
    (
        "POST",
        re.compile(r"/api/v1/pools/([^/]+)/burst"),
        _changed(
            lambda c, a, b: ops.burst(
                c, a[0], _int(b, "count"), _int(b, "gpus", 1), _float(b, "duration_s")
            )
        ),
    ),
    (
        "POST",
        re.compile(r"/api/v1/projects/([^/]+)/grants"),
        _changed(
            lambda c, a, b: ops.grant_quota(
                c,
                a[0],
                _str(b, "grant"),
                _str(b, "pool"),
                _int(b, "gpus"),
                _float(b, "duration_s"),
            )
        ),
    ),
    (
        "DELETE",
        re.compile(r"/api/v1/projects/([^/]+)/grants/([^/]+)"),
        _changed(lambda c, a, b: ops.release_quota(c, a[0], a[1])),
    ),
    (
        "POST",
        re.compile(r"/api/v1/classes/([^/]+)/hold"),
        _changed(lambda c, a, b: ops.hold_class(c, a[0])),
    ),
    (
        "DELETE",
        re.compile(r"/api/v1/classes/([^/]+)/hold"),
        _changed(lambda c, a, b: ops.release_class(c, a[0])),
    ),
    (
        "POST",
        re.compile(r"/api/v1/nodes/([^/]+)/migrate"),
        _changed(lambda c, a, b: ops.migrate(c, a[0])),
    ),
    (
        "POST",
        re.compile(r"/api/v1/nodes/([^/]+)/resume"),
        _changed(lambda c, a, b: ops.resume(c, a[0])),
    ),
    (
        "POST",
        re.compile(r"/api/v1/gpus/([^/]+)/reset"),
        _changed(lambda c, a, b: ops.reset_gpu(c, a[0])),
    ),
    (
        "POST",
        re.compile(r"/api/v1/nodes/([^/]+)/reboot"),
        _changed(lambda c, a, b: ops.reboot(c, a[0])),
    ),
    (
        "POST",
        re.compile(r"/api/v1/nodes/([^/]+)/validate"),
        _changed(lambda c, a, b: ops.validate(c, a[0])),
    ),
    (
        "POST",
        re.compile(r"/api/v1/nodes/([^/]+)/consolidate"),
        _changed(lambda c, a, b: ops.consolidate(c, a[0])),
    ),
    (
        "POST",
        re.compile(r"/api/v1/nodes/([^/]+)/fail"),
        _changed(lambda c, a, b: ops.fail(c, a[0])),
    ),
    (
        "POST",
        re.compile(r"/api/v1/nodes/([^/]+)/restore"),
        _changed(lambda c, a, b: ops.restore(c, a[0])),
    ),
]


def dispatch(
    cluster: Cluster, idem: Idempotency, method: str, path: str, raw: bytes
) -> tuple[int, dict[str, object]]:
    """Answer one API call: (status, JSON document). Never raises on bad input."""
    allowed = []
    for route_method, pattern, route in ROUTES:
        match = pattern.fullmatch(path)
        if match is None:
            continue
        if route_method != method:
            allowed.append(route_method)
            continue
        args = [unquote(g) for g in match.groups()]
        try:
            body = _parse(raw) if method != "GET" else {}
            key = body.get("decision_id")
            if key is not None and not isinstance(key, str):
                raise BadRequest(f"field 'decision_id' must be a string, got {key!r}")
            if key is None:
                return 200, route(cluster, args, body)
            with idem.lock:
                seen = idem.get(key)
                if seen is not None:
                    log.debug("decision %s seen before: replaying its response", key)
                    return seen
                with cluster.causes.acting(key):
                    response = route(cluster, args, body)
                idem.put(key, 200, response)
                return 200, response
        except FleetError as exc:
            return exc.status, {"error": exc.message}
    if allowed:
        return 405, {"error": f"{method} is not allowed on {path}; use {', '.join(allowed)}"}
    return NotFound(f"no route {method} {path}").status, {"error": f"no route {method} {path}"}


def _parse(raw: bytes) -> Body:
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"body must be a JSON object, got {type(body).__name__}")
    return body


def control_handler(
    cluster: Cluster, registry: CollectorRegistry, idem: Idempotency
) -> type[QuietHandler]:
    """The handler class of the control port: /metrics and /api/v1/..."""

    class ControlHandler(QuietHandler):
        def _answer(self) -> None:
            path = self.path.split("?")[0].rstrip("/") or "/"
            if path == "/metrics" and self.command in ("GET", "HEAD"):
                self.send_body(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            doc: dict[str, object]
            if not 0 <= length <= MAX_BODY:
                status, doc = 400, {"error": f"Content-Length must be within [0, {MAX_BODY}]"}
            else:
                raw = self.rfile.read(length) if length else b""
                try:
                    status, doc = dispatch(cluster, idem, self.command, path, raw)
                except Exception as exc:  # a bug, not bad input: answer rather than hang up
                    log.exception("control API failed on %s %s", self.command, path)
                    status, doc = 500, {"error": f"{type(exc).__name__}: {exc}"}
            body = json.dumps(doc).encode()
            self.send_body(status, body, "application/json")

        do_GET = do_POST = do_DELETE = do_PUT = do_HEAD = _answer

    return ControlHandler
