"""``promtool check metrics`` finds nothing to say about a scrape of every fake NVML scenario,
including a lost GPU with its XID and a GPU with locked clocks."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
import requests

from gpuops.exporters.nvml.scenarios import SCENARIOS
from gpuops.exporters.nvml.server import ExporterServer

pytestmark = pytest.mark.integration
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def promtool_check(text: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_promtool_accepts_every_scenario(name: str) -> None:
    server = ExporterServer(
        SCENARIOS[name](), host="127.0.0.1", port=0, agent_token="t", xid_poll_ms=20
    )
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}"
        if name != "library-missing":
            locked = requests.post(
                f"{url}/api/v1/gpus/0/clocks",
                json={"max_clock_mhz": 1005},
                headers={"Authorization": "Bearer t"},
                timeout=5,
            )
            assert locked.status_code == (403 if name == "no-permission" else 200), locked.text
        texts = [requests.get(f"{url}/metrics", timeout=5).text for _ in range(3)]
        if name == "gpu-lost":  # wait for the XID 79 of the GPU that fell off the bus
            deadline = time.monotonic() + 5
            while 'xid="79"' not in texts[-1]:
                assert time.monotonic() < deadline, "no XID 79 before the deadline"
                time.sleep(0.02)
                texts.append(requests.get(f"{url}/metrics", timeout=5).text)
            assert 'nvml_gpu_up{gpu="3"' in texts[-1]
    finally:
        server.close()
    for text in texts:
        result = promtool_check(text)
        assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_promtool_would_complain() -> None:
    """The check can fail: promtool flags a counter without _total."""
    bad = "# HELP x_errors bad\n# TYPE x_errors counter\nx_errors 1\n"
    result = promtool_check(bad)
    assert 'counter metrics should have "_total" suffix' in result.stdout + result.stderr
