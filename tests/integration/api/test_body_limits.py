"""Request bodies: the Alertmanager receiver takes groups of thousands of realistic alerts, an
over-limit body is 413 however it is framed (Content-Length or chunked), and a JSON body that is
not UTF-8 is 422."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
from starlette.types import Message, Receive, Scope, Send

from gpuops.api.middleware import ApiMiddleware
from tests.integration.api.harness import Harness


def realistic(api: Harness, index: int) -> dict[str, Any]:
    """An alert as node-exporter / DCGM rules send them: ~670 bytes of JSON."""
    alert = api.alert(
        "GPUNoise",
        node=f"gpu-node-{index:05d}.cluster.example.com",
        instance=f"gpu-node-{index:05d}.cluster.example.com:9400",
        job="dcgm-exporter",
        uuid=f"GPU-{index:08x}-5d1b-4f0e-9c3b-2a7f3e8d9c41",
        gpu="3",
        pool="training-a100",
        severity="critical",
        team="ml-platform",
    )
    alert["annotations"] = {
        "summary": f"GPU 3 on gpu-node-{index:05d} fell off the bus (Xid 79)",
        "description": "The driver reported Xid 79; the GPU is unusable until the node reboots.",
        "runbook_url": "https://runbooks.example.com/gpu/xid-79",
    }
    alert["generatorURL"] = "http://prometheus:9090/graph?g0.expr=DCGM_FI_DEV_XID_ERRORS+%3D%3D+79"
    return alert


def payload(alerts: list[dict[str, Any]]) -> bytes:
    return json.dumps(
        {
            "version": "4",
            "groupKey": '{}:{alertname="GPUFellOffBus"}',
            "truncatedAlerts": 0,
            "status": "firing",
            "receiver": "gpuops",
            "groupLabels": {"alertname": "GPUFellOffBus"},
            "commonLabels": {"alertname": "GPUFellOffBus"},
            "commonAnnotations": {},
            "externalURL": "http://alertmanager:9093",
            "alerts": alerts,
        }
    ).encode()


def post(api: Harness, body: Any, path: str = "/api/v1/alertmanager", role: str = "alertmanager"):
    headers = {"Content-Type": "application/json"}
    return api.call(role, "POST", path, data=body, headers=headers)


def test_a_group_of_2000_realistic_alerts_passes_the_middleware(api: Harness) -> None:
    """The API's own middleware and settings in front of an app that only reads the body (the
    alert worker would take ~6 ms an alert to dedupe them: not what is tested here)."""
    one = len(json.dumps(realistic(api, 0)))
    assert 600 <= one <= 750  # the ~670 B/alert that docs/api.md sizes the limit with
    body = payload([realistic(api, i) for i in range(2000)])
    settings = api.context.settings
    assert len(body) > settings.max_body_bytes  # the general limit would refuse it
    read: list[int] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        size, more = 0, True
        while more:
            message = await receive()
            size, more = size + len(message.get("body", b"")), message.get("more_body", False)
        read.append(size)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    middleware = ApiMiddleware(
        app,
        api.context.tokens,
        lambda *args: None,
        settings.max_body_bytes,
        body_limits={"/api/v1/alertmanager": settings.alertmanager_max_body_bytes},
    )
    token = api.tokens["alertmanager"].encode()
    chunks = [body[at : at + 65536] for at in range(0, len(body), 65536)]
    sent: list[Message] = []

    async def call(path: str, framing: list[tuple[bytes, bytes]]) -> int:
        queue = [
            {"type": "http.request", "body": c, "more_body": n < len(chunks) - 1}
            for n, c in enumerate(chunks)
        ]

        async def receive() -> Message:
            return queue.pop(0) if queue else {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            sent.append(message)

        headers = [(b"authorization", b"Bearer " + token), (b"content-type", b"application/json")]
        scope = {"type": "http", "method": "POST", "path": path, "headers": headers + framing}
        await middleware(scope, receive, send)
        return int(next(m for m in reversed(sent) if m["type"] == "http.response.start")["status"])

    length = [(b"content-length", str(len(body)).encode())]
    assert anyio.run(call, "/api/v1/alertmanager", length) == 200
    assert anyio.run(call, "/api/v1/alertmanager", []) == 200  # chunked
    assert read == [len(body), len(body)]
    assert anyio.run(call, "/api/v1/quota-requests", length) == 413
    assert anyio.run(call, "/api/v1/quota-requests", []) == 413


def test_over_the_alertmanager_limit_is_413_with_or_without_content_length(api: Harness) -> None:
    limit = api.context.settings.alertmanager_max_body_bytes
    body = payload([realistic(api, i) for i in range(limit // 600)])
    assert len(body) > limit
    sized = post(api, body)
    assert sized.status_code == 413
    assert (
        sized.json()["detail"] == f"request body of {len(body)} bytes exceeds the limit of {limit}"
    )

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(body), 65536):
            yield body[start : start + 65536]

    chunked = post(api, chunks())
    assert chunked.status_code == 413
    assert chunked.json()["detail"] == f"request body larger than {limit} bytes"


def test_a_chunked_json_body_over_the_general_limit_is_413(api: Harness) -> None:
    big = json.dumps(
        {"project": "ml", "gpus": 1, "duration": "1h", "reason": "x" * 2_000_000}
    ).encode()

    def chunks() -> Iterator[bytes]:
        yield big[:1000]
        yield big[1000:]

    resp = post(api, chunks(), "/api/v1/quota-requests", role="developer")
    assert resp.status_code == 413
    limit = api.context.settings.max_body_bytes
    assert resp.json()["detail"] == f"request body larger than {limit} bytes"
    failures = [d for d in api.operations() if d["event"]["outcome"] == "failure"]
    assert failures and "413" in failures[-1]["error"]["message"]


def test_json_that_is_not_utf8_is_422(api: Harness) -> None:
    body = b'{"project": "ml", "gpus": 1, "duration": "1h", "reason": "caf\xe9"}'
    resp = post(api, body, "/api/v1/quota-requests", role="developer")
    assert resp.status_code == 422
    at = body.index(b"\xe9")
    assert resp.json()["detail"] == f"JSON body is not UTF-8 (byte {at} is invalid)"

    def split() -> Iterator[bytes]:  # a valid character cut between two chunks is fine
        text = json.dumps(
            {"project": "ml", "gpus": 1, "duration": "1h", "reason": "café ✓"}, ensure_ascii=False
        ).encode()
        cut = text.index("✓".encode()) + 1
        yield text[:cut]
        yield text[cut:]

    fine = post(api, split(), "/api/v1/quota-requests", role="developer")
    assert fine.status_code != 422 and fine.status_code < 500, fine.text
