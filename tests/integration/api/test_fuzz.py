"""Fuzzing the API against its own OpenAPI spec (schemathesis + hypothesis), once per role:
no answer is a 5xx, none contains a token, every 4xx says why, and every answer is one the spec
declares (its status, its media type, its body's schema). Bounded: a few examples per operation,
so the whole run takes well under a minute."""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.builders import USERS
from tests.integration.api.harness import Harness

EXAMPLES = 6


@pytest.mark.parametrize("role", sorted(USERS))
def test_fuzz_every_operation(api: Harness, role: str) -> None:
    spec = api.call(None, "GET", "/api/v1/openapi.json").json()
    schema = schemathesis.openapi.from_dict(spec)
    headers = {"Authorization": f"Bearer {api.tokens[role]}"}
    seen: dict[str, int] = {}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def check(case: Any) -> None:
            response = case.call(base_url=api.url, session=api.session, headers=headers)
            where = f"{role}: {case.method} {case.formatted_path} -> {response.status_code}"
            assert response.status_code < 500, f"{where}: {response.text[:300]}"
            assert not any(token in response.text for token in api.tokens.values()), where
            if response.status_code >= 400:
                detail = response.json().get("detail")
                assert detail, f"{where}: 4xx without a reason: {response.text[:300]}"
            case.validate_response(
                response,
                checks=[
                    status_code_conformance,
                    content_type_conformance,
                    response_schema_conformance,
                ],
                headers=headers,
            )
            label = f"{case.method} {case.path}"
            seen[label] = seen.get(label, 0) + 1

        check()
    assert len(seen) == len(operations)
