"""A small, honest fake of Elasticsearch 8.x on a loopback port.

Used by the audit tests and the audit benchmark with the real ``elasticsearch`` client. It
follows the wire contract: ``X-Elastic-Product: Elasticsearch`` on every 2xx, compatible-with
media types, ``GET /``, ``PUT/POST /_bulk`` NDJSON with per-item statuses, data streams created
from matching index templates (with the built-in ``logs`` template at priority 100), op_type
``create`` only and ``@timestamp`` required in data streams, 409 on a duplicate ``_id``, field
values checked against the mapped type (400 per item), ILM policies, component and index
templates, and search (``fake_es_search``). Faults: ``fail_next(status, times, scope)`` for
request- or item-level errors, ``delay_s`` for slow answers, ``stop()``/``start()`` for an
outage on the same port.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import gzip
import io
import json
import socket
import socketserver
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import orjson

from tests.fakes.fake_es_mapping import Checker, StrictRefusal
from tests.fakes.fake_es_search import (
    Doc,
    DslError,
    Mapping_,
    aggregate,
    matcher,
    sort_key,
    values_of,
)

VERSION = "8.19.3"
_ACCEPTED_TYPES = ("application/json", "application/x-ndjson")
_BUILTIN_LOGS = {
    "index_patterns": ["logs-*-*"],
    "priority": 100,
    "data_stream": {},
    "composed_of": [],
    "template": {"mappings": {"properties": {"@timestamp": {"type": "date"}}}},
}


class HttpError(Exception):
    def __init__(self, status: int, kind: str, reason: str, product: bool = True) -> None:
        super().__init__(reason)
        self.status, self.kind, self.reason, self.product = status, kind, reason, product

    def body(self) -> dict[str, Any]:
        cause = {"type": self.kind, "reason": self.reason}
        return {"error": {"root_cause": [cause], **cause}, "status": self.status}


class Stream:
    """A data stream (or a plain index): its mapping and documents by ``_id``."""

    def __init__(self, name: str, mappings: Mapping[str, Any], data_stream: bool) -> None:
        self.name = name
        self.data_stream = data_stream
        day = datetime.now(tz=UTC).strftime("%Y.%m.%d")
        self.index = f".ds-{name}-{day}-000001" if data_stream else name
        self.mapping = Mapping_(mappings)
        self.checker = Checker(self.mapping)
        self.docs: dict[str, dict[str, Any] | None] = {}  # None: not kept (``keep_sources``)
        self.versions: dict[str, int] = {}  # of documents written more than once (op ``index``)
        self.seq_no = -1  # of the last write (one per write, as a shard's sequence numbers)
        # Every write attempt per ``_id`` (``write_tally``): 201s (a second one would be a
        # second copy), 409s (a resend of a stored document: nothing stored) and, in
        # ``versions``, the overwrites by op ``index`` (a second copy too).
        self.created: dict[str, int] = {}
        self.conflicts: dict[str, int] = {}
        self.field_copies: dict[Any, int] = {}  # stored writes per value of ``tally_field``


class FakeElasticsearch:
    """The fake cluster. ``with FakeElasticsearch() as es: es.url``."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.ilm: dict[str, Any] = {}
        self.component_templates: dict[str, Any] = {}
        self.index_templates: dict[str, Any] = {"logs": _BUILTIN_LOGS}
        self.streams: dict[str, Stream] = {}
        self.requests: list[tuple[str, str]] = []
        self.delay_s = 0.0
        self.validate = True  # False: no mapping checks (benchmarks of the client side only)
        self.keep_sources = True  # False: keep only the ids (benchmarks; search finds nothing)
        self.tally_field: str | None = None
        """A dotted field (``event.id``) whose value in every stored write is counted per
        stream (``write_tally``): a document stored twice under two ``_id`` is seen too."""
        self._faults: list[tuple[str, int]] = []
        self.bulk_active = 0
        """Bulk requests being answered now (past their fault check: a request that takes no
        fault is counted until it stored its documents)."""
        self._server: _Server | None = None
        self.connections: set[socket.socket] = set()
        self._thread: threading.Thread | None = None
        self.port = 0

    # -- control ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeElasticsearch:
        server = _Server(("127.0.0.1", self.port), _Connection, bind_and_activate=False)
        server.es = self
        server.block_on_close = False
        try:
            server.server_bind()
            server.server_activate()
        except OSError:
            server.server_close()
            raise
        self.port = server.server_address[1]
        self._server = server
        # polled every 50 ms for ``stop()`` (the default 0.5 s was half a second per stop: per
        # test that uses the fake, per outage)
        serve = functools.partial(server.serve_forever, poll_interval=0.05)
        self._thread = threading.Thread(target=serve, name="fake-es", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the listener (connections are refused until ``start()``); data is kept."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        with self.lock:  # a real outage also breaks the client's keep-alive connections
            for conn in list(self.connections):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
            self.connections.clear()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @contextmanager
    def outage(self) -> Iterator[None]:
        self.stop()
        try:
            yield
        finally:
            self.start()

    def __enter__(self) -> FakeElasticsearch:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def fail_next(self, status: int, times: int = 1, scope: str = "request") -> None:
        """Answer the next ``times`` bulk requests (scope ``request``) or bulk items (``item``)
        with ``status`` (429, 503, 400...)."""
        with self.lock:
            self._faults.extend([(scope, status)] * times)

    def clear_faults(self) -> None:
        """Forget the faults not yet taken."""
        with self.lock:
            self._faults.clear()

    def take_fault(self, scope: str) -> int | None:
        with self.lock:
            for i, (where, status) in enumerate(self._faults):
                if where == scope:
                    del self._faults[i]
                    return status
        return None

    def documents(self, stream: str) -> list[dict[str, Any]]:
        with self.lock:
            found = self.streams.get(stream)
            return [d for d in found.docs.values() if d is not None] if found else []

    def ids(self, stream: str) -> list[str]:
        """The ``_id`` of every document of ``stream`` (kept whether or not sources are)."""
        with self.lock:
            found = self.streams.get(stream)
            return list(found.docs) if found else []

    def write_tally(self, stream: str) -> dict[str, Any]:
        """What the writes to ``stream`` did, for counting duplicates (benchmarks): ``ids``
        stored; ``stored_more_than_once``, the ``_id`` stored by more than one write (two
        201s, or an op ``index`` over a stored one) with their number of stored writes;
        ``resends``, the 409s (a ``create`` of a stored ``_id``: nothing stored) and
        ``resent_ids``, how many ``_id`` had one; with ``tally_field`` set, ``field_values``
        (the values stored) and ``field_more_than_once`` (those in more than one stored
        write, and how many)."""
        with self.lock:
            found = self.streams.get(stream)
            if found is None:
                found = Stream(stream, {}, False)
            stored = {i: n + found.versions.get(i, 1) - 1 for i, n in found.created.items()}
            return {
                "ids": list(found.docs),
                "stored_more_than_once": {i: n for i, n in stored.items() if n > 1},
                "resends": sum(found.conflicts.values()),
                "resent_ids": len(found.conflicts),
                "field": self.tally_field,
                "field_values": list(found.field_copies) if self.tally_field else [],
                "field_more_than_once": {str(v): n for v, n in found.field_copies.items() if n > 1},
            }

    # -- templates and streams --------------------------------------------------------------

    def template_for(self, name: str) -> dict[str, Any] | None:
        matching = [
            t
            for t in self.index_templates.values()
            if any(fnmatch.fnmatchcase(name, p) for p in _patterns(t))
        ]
        return max(matching, key=lambda t: int(t.get("priority", 0)), default=None)

    def effective_mappings(self, template: Mapping[str, Any]) -> dict[str, Any]:
        merged: dict[str, Any] = {"properties": {}, "dynamic_templates": []}
        parts = [self.component_templates[c]["template"] for c in template.get("composed_of", [])]
        for part in [*parts, template.get("template") or {}]:
            mappings = part.get("mappings") or {}
            _merge(merged["properties"], mappings.get("properties") or {})
            merged["dynamic_templates"] += mappings.get("dynamic_templates") or []
            if "dynamic" in mappings:
                merged["dynamic"] = mappings["dynamic"]
        return merged

    def stream(self, name: str) -> Stream:
        with self.lock:
            if name not in self.streams:
                template = self.template_for(name) or {}
                is_ds = "data_stream" in template
                self.streams[name] = Stream(name, self.effective_mappings(template), is_ds)
            return self.streams[name]

    def resolve(self, expression: str, allow_no_indices: bool) -> list[Stream]:
        found: list[Stream] = []
        for part in expression.split(","):
            hits = [
                s
                for s in self.streams.values()
                if fnmatch.fnmatchcase(s.name, part) or fnmatch.fnmatchcase(s.index, part)
            ]
            if not hits and "*" not in part and not allow_no_indices and part != "_all":
                raise HttpError(404, "index_not_found_exception", f"no such index [{part}]")
            found += [h for h in hits if h not in found]
        return found


def _patterns(template: Mapping[str, Any]) -> list[str]:
    raw = template.get("index_patterns") or []
    return [raw] if isinstance(raw, str) else list(raw)


def _merge(into: dict[str, Any], props: Mapping[str, Any]) -> None:
    for key, spec in props.items():
        if key in into and "properties" in spec and "properties" in into[key]:
            _merge(into[key]["properties"], spec["properties"])
        else:
            into[key] = json.loads(json.dumps(spec))


class _Headers(dict[str, str]):
    """Request headers by lower-cased name (``get`` is case-insensitive, as http.server's)."""

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(name.lower(), default)


_REASONS = {200: "OK", 201: "Created", 400: "Bad Request", 404: "Not Found", 406: "Not Acceptable"}


class _Server(socketserver.ThreadingTCPServer):
    """A small HTTP/1.1 server with keep-alive: one thread per connection, requests parsed by
    hand (``http.server`` parses headers with ``email.parser``, which costs more than a bulk
    of small documents)."""

    daemon_threads = True
    allow_reuse_address = True
    es: FakeElasticsearch


class _Connection(socketserver.StreamRequestHandler):
    """One client connection: requests read one after another until the client closes."""

    server: _Server
    disable_nagle_algorithm = True
    rbufsize = 1 << 16

    def setup(self) -> None:
        super().setup()
        with self.server.es.lock:
            self.server.es.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.es.lock:
            self.server.es.connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def handle(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            while self._one():
                pass

    def _one(self) -> bool:
        """Serve one request; False when the connection is over."""
        rfile = self.rfile
        line = rfile.readline(65537)
        while line in (b"\r\n", b"\n"):  # tolerated between requests, as http.server does
            line = rfile.readline(65537)
        if not line:
            return False
        try:
            method, target, version = line.decode("latin-1").split()
        except ValueError:
            self._write(400, b'{"error":"bad request line"}', _Headers(), {})
            return False
        headers = _Headers()
        while True:
            raw = rfile.readline(65537)
            if raw in (b"\r\n", b"\n", b""):
                break
            name, _, value = raw.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = self._chunked()
        else:
            declared = headers.get("content-length") or "0"
            if not declared.isascii() or not declared.isdigit():  # negative, or no number
                # the body's end is unknown: answered 400 and the connection closed, as
                # Elasticsearch's HTTP layer does (nothing of the request is run)
                reason = f"invalid Content-Length [{declared}]"
                error = HttpError(400, "illegal_argument_exception", reason)
                self._write(400, orjson.dumps(error.body()), headers, {"Connection": "close"})
                return False
            length = int(declared)
            body = self._body(length) if length else b""
        if headers.get("content-encoding", "").lower() == "gzip":
            body = gzip.decompress(body)
        request = _Request(self.server.es, method, target, headers, body)
        status, data, extra = request.answer()
        self._write(status, data, headers, extra, head=method == "HEAD")
        keep = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
        return keep

    def _body(self, length: int) -> bytes:
        """The request body: what the buffer holds, then the rest straight from the socket
        with ``MSG_WAITALL``, so that a body of megabytes is one wait in the kernel (reading
        it in 64 KiB pieces made this thread take the GIL from the one answering another
        bulk request a hundred times per request)."""
        buffered = cast(io.BufferedReader, self.rfile)
        head = buffered.read(len(buffered.peek(length)[:length]))  # buffered: no read
        if len(head) >= length or not head:
            return head
        body = bytearray(length)
        body[: len(head)] = head
        view = memoryview(body)[len(head) :]
        while view:
            got = self.connection.recv_into(view, len(view), socket.MSG_WAITALL)
            if not got:
                raise ConnectionError("the client closed the connection within a body")
            view = view[got:]
        return bytes(body)

    def _chunked(self) -> bytes:
        parts: list[bytes] = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            parts.append(self.rfile.read(size))
            self.rfile.readline()

    def _write(
        self,
        status: int,
        data: bytes,
        headers: _Headers,
        extra: Mapping[str, str],
        head: bool = False,
    ) -> None:
        compat = "compatible-with=8" in (headers.get("accept") or "")
        ctype = (
            "application/vnd.elasticsearch+json;compatible-with=8" if compat else "application/json"
        )
        lines = [
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
            f"Content-Type: {ctype}",
            f"Content-Length: {len(data)}",
            *(f"{k}: {v}" for k, v in extra.items()),
        ]
        out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.wfile.write(out if head else out + data)


class _Request:
    """One request to the fake: routed, answered as (status, JSON bytes, extra headers)."""

    def __init__(
        self, es: FakeElasticsearch, method: str, target: str, headers: _Headers, raw: bytes
    ) -> None:
        self.es = es
        self.method = method
        self.path = target
        self.headers = headers
        self.raw = raw

    def answer(self) -> tuple[int, bytes, dict[str, str]]:
        method, raw = self.method, self.raw
        split = urlsplit(self.path)
        params = {k: v[-1] for k, v in parse_qs(split.query).items()}
        parts = [p for p in split.path.split("/") if p]
        self.es.requests.append((method, split.path))
        if self.es.delay_s:
            time.sleep(self.es.delay_s)
        try:
            self._check_media_types(raw)
            status, body = self._route(method, parts, params, raw)
            if "filter_path" in params and isinstance(body, dict):
                body = filter_path(body, params["filter_path"])
        except HttpError as exc:
            return self._answer(exc.status, exc.body(), product=exc.product)
        except DslError as exc:
            return self._answer(400, HttpError(400, exc.kind, exc.reason).body())
        return self._answer(status, body)

    def _check_media_types(self, raw: bytes) -> None:
        for header in ("Accept", "Content-Type"):
            value = self.headers.get(header) or ""
            if "compatible-with=" in value and value.split("compatible-with=")[1][:1] not in "78":
                raise HttpError(400, "media_type_header_exception", f"Invalid {header} [{value}]")
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if raw and ctype.replace("vnd.elasticsearch+", "") not in _ACCEPTED_TYPES:
            raise HttpError(
                406, "media_type_header_exception", f"Content-Type [{ctype}] is not supported"
            )

    @staticmethod
    def _answer(status: int, body: Any, product: bool = True) -> tuple[int, bytes, dict[str, str]]:
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        extra = {}
        if product and (200 <= status < 300 or status == 429 or status < 500):
            extra["X-Elastic-Product"] = "Elasticsearch"
        return status, data, extra

    def _route(
        self, method: str, parts: list[str], params: dict[str, str], raw: bytes
    ) -> tuple[int, Any]:
        es = self.es
        if not parts and method in ("GET", "HEAD"):
            return 200, _info()
        if parts[-1] == "_bulk" and method in ("PUT", "POST"):
            return self._bulk(parts[0] if len(parts) == 2 else None, raw)
        if parts[-1] == "_search" and method in ("GET", "POST"):
            return 200, self._search(parts[0] if len(parts) == 2 else "*", params, raw)
        if len(parts) == 3 and parts[1] in ("_create", "_doc") and method in ("PUT", "POST"):
            op = "create" if parts[1] == "_create" or params.get("op_type") == "create" else "index"
            item = self._bulk_item(op, {"_index": parts[0], "_id": parts[2]}, json.loads(raw), None)
            if item["status"] >= 300:
                error = item["error"]
                raise HttpError(item["status"], error["type"], error["reason"])
            return 201, {k: v for k, v in item.items() if k != "status"}
        if parts[-1] == "_refresh":
            return 200, {"_shards": {"total": 1, "successful": 1, "failed": 0}}
        stores = {
            ("_ilm", "policy"): es.ilm,
            ("_component_template",): es.component_templates,
            ("_index_template",): es.index_templates,
            ("_data_stream",): None,
        }
        key = tuple(parts[:-1])
        if key in stores and method in ("PUT", "POST"):
            return self._put_object(parts, stores[key], raw)
        if key in stores and method == "GET":
            return self._get_object(parts, stores[key])
        raise HttpError(
            400, "illegal_argument_exception", f"no handler for [{method} /{'/'.join(parts)}]"
        )

    def _put_object(
        self, parts: list[str], store: dict[str, Any] | None, raw: bytes
    ) -> tuple[int, Any]:
        if store is None:
            raise HttpError(400, "illegal_argument_exception", "data streams come from templates")
        body = json.loads(raw or b"{}")
        name = parts[-1]
        if parts[0] == "_ilm" and "policy" not in body:
            raise HttpError(400, "x_content_parse_exception", "required [policy] is missing")
        if parts[0] == "_component_template" and "template" not in body:
            raise HttpError(400, "x_content_parse_exception", "required [template] is missing")
        if parts[0] == "_index_template":
            if not _patterns(body):
                raise HttpError(
                    400, "action_request_validation_exception", "index patterns are missing"
                )
            missing = [
                c for c in body.get("composed_of", []) if c not in self.es.component_templates
            ]
            if missing:
                raise HttpError(
                    400,
                    "invalid_index_template_exception",
                    f"index template [{name}] specifies component templates {missing} "
                    "that do not exist",
                )
        with self.es.lock:
            store[name] = body
        return 200, {"acknowledged": True}

    def _get_object(self, parts: list[str], store: dict[str, Any] | None) -> tuple[int, Any]:
        name = parts[-1]
        if store is None:
            found = [s for s in self.es.streams.values() if s.name == name and s.data_stream]
            if not found:
                raise HttpError(404, "index_not_found_exception", f"no such index [{name}]")
            return 200, {
                "data_streams": [{"name": name, "indices": [{"index_name": found[0].index}]}]
            }
        if name not in store:
            raise HttpError(404, "resource_not_found_exception", f"[{name}] not found")
        if parts[0] == "_ilm":
            return 200, {name: {"version": 1, "policy": store[name]["policy"]}}
        label = "component_templates" if parts[0] == "_component_template" else "index_templates"
        kind = "component_template" if parts[0] == "_component_template" else "index_template"
        return 200, {label: [{"name": name, kind: store[name]}]}

    def _bulk(self, default_index: str | None, raw: bytes) -> tuple[int, Any]:
        with self.es.lock:
            self.es.bulk_active += 1
        try:
            return self._bulk_counted(default_index, raw)
        finally:
            with self.es.lock:
                self.es.bulk_active -= 1

    def _bulk_counted(self, default_index: str | None, raw: bytes) -> tuple[int, Any]:
        status = self.es.take_fault("request")
        if status is not None:
            if status == 429:
                raise HttpError(
                    429, "es_rejected_execution_exception", "rejected execution of bulk"
                )
            raise HttpError(status, "fake_fault", f"injected {status}", product=False)
        lines = list(filter(None, raw.split(b"\n")))  # without blank lines (in C: ``strip``
        if any(map(bytes.isspace, lines)):  # would copy every line)
            lines = [line for line in lines if not line.isspace()]
        started = time.monotonic()
        # Every action line is parsed before any item runs: real Elasticsearch refuses a
        # malformed action line (or a missing source) with a 400 for the whole request and
        # stores none of its items. A source is parsed when its item runs: a malformed one
        # fails that item only (document_parsing_exception), as in Elasticsearch.
        operations: list[tuple[str, Any, bytes | None]] = []
        i = 0
        while i < len(lines):
            try:
                action = _loads(lines[i])
                ((op, meta),) = action.items()
                source_line = lines[i + 1] if op != "delete" else None
            except (ValueError, IndexError, AttributeError) as exc:
                raise HttpError(
                    400,
                    "illegal_argument_exception",
                    f"Malformed action/metadata line [{i + 1}]",
                ) from exc
            if type(meta) is not dict:  # ``{"create": "x"}``: Elasticsearch's parser wants an
                raise HttpError(  # object after the action's name
                    400,
                    "illegal_argument_exception",
                    f"Malformed action/metadata line [{i + 1}], expected START_OBJECT but found "
                    f"[{_token(meta)}]",
                )
            if op not in ("create", "index", "delete", "update"):
                raise HttpError(
                    400,
                    "illegal_argument_exception",
                    f"Malformed action/metadata line [{i + 1}], expected one of [create, "
                    f"delete, index, update] but found [{op}]",
                )
            i += 1 if op == "delete" else 2
            operations.append((op, meta, source_line))
        items: list[dict[str, Any]] = []
        errors = False
        bulk_item, loads, add = self._item, orjson.loads, items.append
        with self.es.lock:  # one bulk at a time, as one shard's write thread would
            for op, meta, source_line in operations:
                try:
                    if source_line is None:
                        source = None
                    else:
                        try:
                            source = loads(source_line)
                        except orjson.JSONDecodeError:  # beyond orjson (big integers)?
                            source = json.loads(source_line)
                except ValueError as exc:
                    known = meta if isinstance(meta, dict) else {}
                    doc_id = str(known.get("_id") or "")
                    index = str(known.get("_index") or default_index or "")
                    reason = f"failed to parse: {exc}"
                    item = _item_error(400, "document_parsing_exception", reason, index, doc_id)
                else:
                    item = bulk_item(op, meta, source, default_index)
                if item["status"] >= 300:
                    errors = True
                add({op: item})
        took = int((time.monotonic() - started) * 1000)
        return 200, {"errors": errors, "took": took, "items": items}

    def _bulk_item(
        self, op: str, meta: Mapping[str, Any], source: Any, default_index: str | None
    ) -> dict[str, Any]:
        """One bulk item (or a single-document request): its answer, and what it stored."""
        with self.es.lock:
            return self._item(op, meta, source, default_index)

    def _item(
        self, op: str, meta: Mapping[str, Any], source: Any, default_index: str | None
    ) -> dict[str, Any]:
        """``_bulk_item`` with the lock held."""
        es = self.es
        name = meta.get("_index") or default_index or ""
        doc_id = meta.get("_id")
        if not doc_id:
            doc_id = uuid.uuid4().hex[:20]
        elif type(doc_id) is not str:
            doc_id = str(doc_id)
        if es._faults:
            fault = es.take_fault("item")
            if fault is not None:
                reason = "injected item fault"
                return _item_error(fault, "es_rejected_execution_exception", reason, name, doc_id)
        stream = es.streams.get(name) or es.stream(name)
        index = stream.index
        if stream.data_stream:
            if op != "create":
                reason = "only write ops with an op_type of create are allowed in data streams"
                return _item_error(400, "illegal_argument_exception", reason, index, doc_id)
            stamp = source.get("@timestamp") if type(source) is dict else None
            kind = type(stamp)
            if kind is not str and kind is not int and kind is not float:
                if not _has_timestamp(source):
                    reason = "data stream timestamp field [@timestamp] is missing"
                    return _item_error(400, "document_parsing_exception", reason, index, doc_id)
        if es.validate:
            problem = stream.checker.check(source)
            if problem:
                error = (
                    "strict_dynamic_mapping_exception"
                    if type(problem) is StrictRefusal
                    else "document_parsing_exception"
                )
                return _item_error(400, error, problem, index, doc_id)
        docs = stream.docs
        exists = doc_id in docs
        if exists and op == "create":
            conflicts = stream.conflicts
            conflicts[doc_id] = conflicts.get(doc_id, 0) + 1
            reason = (
                f"[{doc_id}]: version conflict, document already exists (current version "
                f"[{stream.versions.get(doc_id, 1)}])"
            )
            return _item_error(409, "version_conflict_engine_exception", reason, index, doc_id)
        docs[doc_id] = source if es.keep_sources else None
        if exists:  # op ``index`` overwrites, as Elasticsearch does: a new version
            version = stream.versions[doc_id] = stream.versions.get(doc_id, 1) + 1
            result, status = "updated", 200
        else:
            created = stream.created
            created[doc_id] = created.get(doc_id, 0) + 1
            version, result, status = 1, "created", 201
        if es.tally_field is not None:
            value = _field(source, es.tally_field)
            copies = stream.field_copies
            copies[value] = copies.get(value, 0) + 1
        seq = stream.seq_no = stream.seq_no + 1
        return {
            "_index": index,
            "_id": doc_id,
            "_version": version,
            "result": result,
            "_shards": _SHARDS,  # one shard: the same for every item (read only)
            "_seq_no": seq,
            "_primary_term": 1,
            "status": status,
        }

    def _search(self, expression: str, params: dict[str, str], raw: bytes) -> dict[str, Any]:
        body = json.loads(raw or b"{}")
        allow = (
            params.get("allow_no_indices", "true") == "true"
            or params.get("ignore_unavailable") == "true"
        )
        with self.es.lock:
            streams = self.es.resolve(expression, allow)
            docs: list[tuple[Doc, Stream, str]] = [
                ((src, s.mapping), s, i)
                for s in streams
                for i, src in s.docs.items()
                if src is not None
            ]
        test = matcher(body.get("query") or {"match_all": {}})
        hits = [entry for entry in docs if test(entry[0])]
        if "sort" in body:
            hits.sort(key=lambda e: sort_key(body["sort"])(e[0]))
        start, size = int(body.get("from", 0)), int(body.get("size", 10))
        out: dict[str, Any] = {
            "took": 1,
            "timed_out": False,
            "_shards": {
                "total": len(streams),
                "successful": len(streams),
                "skipped": 0,
                "failed": 0,
            },
            "hits": {
                "total": {
                    "value": min(len(hits), 10000),
                    "relation": "eq" if len(hits) <= 10000 else "gte",
                },
                "max_score": None,
                "hits": [
                    {"_index": s.index, "_id": i, "_score": None, "_source": d[0]}
                    for d, s, i in hits[start : start + size]
                ],
            },
        }
        aggs = body.get("aggs") or body.get("aggregations")
        if aggs:
            out["aggregations"] = aggregate(aggs, [d for d, _, _ in hits])
        return out


_DROP = object()
_SHARDS = {"total": 1, "successful": 1, "failed": 0}


def _token(value: Any) -> str:
    """The name of the JSON token Elasticsearch's parser reports for ``value``."""
    if value is None:
        return "VALUE_NULL"
    if isinstance(value, bool):
        return "VALUE_BOOLEAN"
    if isinstance(value, int):
        return "VALUE_NUMBER_INT"
    if isinstance(value, float):
        return "VALUE_NUMBER_FLOAT"
    if isinstance(value, list):
        return "START_ARRAY"
    return "VALUE_STRING"


def _item_error(status: int, kind: str, reason: str, index: str, doc_id: str) -> dict[str, Any]:
    return {
        "_index": index,
        "_id": doc_id,
        "status": status,
        "error": {"type": kind, "reason": reason},
    }


def filter_path(body: dict[str, Any], spec: str) -> Any:
    """``body`` with only the fields ``filter_path`` names (Elasticsearch's response filtering:
    comma-separated dotted paths, ``*`` matching one key, arrays passed through; empty
    objects dropped). Exclusions (``-path``) and ``**`` are not implemented: a 400."""
    kept = _path_filter(spec).apply(body)
    return {} if kept is _DROP else kept


@functools.lru_cache(maxsize=64)
def _path_filter(spec: str) -> _PathFilter:
    patterns = tuple(tuple(p.strip().split(".")) for p in spec.split(",") if p.strip())
    if any(p[0].startswith("-") or "**" in p for p in patterns):
        raise HttpError(
            400, "illegal_argument_exception", f"filter_path [{spec}]: the fake does not do it"
        )
    return _PathFilter(patterns)


class _PathFilter:
    """What is left of the ``filter_path`` patterns at one depth; which keys of an object they
    keep is remembered per tuple of the object's keys (a bulk answer's thousands of items have
    the same few)."""

    __slots__ = ("_children", "_patterns", "_plans", "_whole")

    def __init__(self, patterns: tuple[tuple[str, ...], ...]) -> None:
        self._patterns = patterns
        self._whole = () in patterns  # a path ends here: the whole value is kept
        self._plans: dict[tuple[str, ...], list[tuple[str, _PathFilter]]] = {}
        self._children: dict[tuple[tuple[str, ...], ...], _PathFilter] = {}

    def apply(self, value: Any) -> Any:
        if self._whole:
            return value
        if isinstance(value, list):
            items = [v for v in map(self.apply, value) if v is not _DROP]
            return items if items else _DROP
        if not isinstance(value, dict):
            return _DROP
        keys = tuple(value)
        plan = self._plans.get(keys)
        if plan is None:
            plan = self._plan(keys)
        out = {}
        for key, child in plan:
            if child._whole:
                out[key] = value[key]
                continue
            kept = child.apply(value[key])
            if kept is not _DROP:
                out[key] = kept
        return out if out else _DROP

    def _plan(self, keys: tuple[str, ...]) -> list[tuple[str, _PathFilter]]:
        plan = []
        for key in keys:
            rest = tuple(p[1:] for p in self._patterns if p and fnmatch.fnmatchcase(key, p[0]))
            if rest:
                if rest not in self._children:
                    self._children[rest] = _PathFilter(rest)
                plan.append((key, self._children[rest]))
        if len(self._plans) < 1024:
            self._plans[keys] = plan
        return plan


def _loads(line: bytes) -> Any:
    """A JSON line, parsed in C (orjson); what orjson refuses and Python's parser takes
    (integers beyond 64 bits) falls back to ``json``."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line)


def _field(source: Any, dotted: str) -> Any:
    """The value at a dotted path of a source (nested objects; None where there is none)."""
    value = source
    for part in _parts(dotted):
        value = value.get(part) if type(value) is dict or isinstance(value, dict) else None
    kind = type(value)
    if kind is str or value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


@functools.lru_cache(maxsize=64)
def _parts(dotted: str) -> tuple[str, ...]:
    return tuple(dotted.split("."))


def _has_timestamp(source: Any) -> bool:
    if isinstance(source, dict):
        value = source.get("@timestamp")
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            return True
    return bool(values_of(source, "@timestamp"))


def _info() -> dict[str, Any]:
    return {
        "name": "fake-node",
        "cluster_name": "fake",
        "cluster_uuid": "fakeclusteruuid000000",
        "version": {
            "number": VERSION,
            "build_flavor": "default",
            "build_type": "docker",
            "build_hash": "0" * 40,
            "build_date": "2025-01-01T00:00:00.000Z",
            "build_snapshot": False,
            "lucene_version": "9.12.0",
            "minimum_wire_compatibility_version": "7.17.0",
            "minimum_index_compatibility_version": "7.0.0",
        },
        "tagline": "You Know, for Search",
    }
