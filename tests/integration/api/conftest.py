"""The ``api`` fixture: a running engine API with users of every role (``harness``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.api.harness import Harness, running_api


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Harness]:
    with running_api(tmp_path) as harness:
        yield harness
