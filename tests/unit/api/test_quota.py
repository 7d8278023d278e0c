"""Every status a quota request can have in the store is one the API's ``status`` filter takes.
The quota flow through the running API: tests/integration/api/test_quota.py."""

from __future__ import annotations

from typing import get_args

from gpuops.api.routes.quota import Status
from gpuops.store.interface import QuotaStatus


def test_every_quota_status_can_be_asked_for() -> None:
    assert set(get_args(Status)) == {s.value for s in QuotaStatus}
