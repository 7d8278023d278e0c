"""Fixtures for the NVML exporter tests: an exporter server on a free loopback port."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from gpuops.exporters.nvml.fake import FakeNvml
from gpuops.exporters.nvml.reboot import Rebooter
from gpuops.exporters.nvml.scenarios import fake_reset
from gpuops.exporters.nvml.server import ExporterServer


@pytest.fixture
def serve() -> Iterator[Callable[..., ExporterServer]]:
    """Start an ExporterServer on 127.0.0.1, port 0, over a fake (the agent on with a token,
    resetting the fake's GPUs); closed after the test."""
    started: list[ExporterServer] = []

    def start(
        fake: FakeNvml,
        token: str | None = None,
        xid_events: bool = False,
        rebooter: Rebooter | None = None,
    ) -> ExporterServer:
        server = ExporterServer(
            fake,
            host="127.0.0.1",
            port=0,
            agent_token=token,
            xid_events=xid_events,
            xid_poll_ms=20,
            reset=fake_reset(fake),
            rebooter=rebooter,
        )
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()
