"""The OpenAPI spec the running API serves gives every request and response body a schema."""

from __future__ import annotations

from tests.integration.api.harness import Harness


def test_the_spec_describes_every_body(api: Harness) -> None:
    spec = api.call(None, "GET", "/api/v1/openapi.json").json()
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                where = f"{method.upper()} {path} {status}"
                content = response.get("content")
                if path == "/metrics":
                    assert content == {"text/plain": {"schema": {"type": "string"}}}, where
                    continue
                assert content, where
                for media_type, body in content.items():
                    assert body.get("schema"), f"{where} {media_type}: no schema"
                    assert media_type == "application/json" or (
                        path.endswith("/rule-files/{name}") and method == "get" and status == "200"
                    ), f"{where}: {media_type}"
