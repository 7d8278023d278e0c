"""`gpuops engine run` tells what it does: its log holds one line per decision and one per
outcome, as sentences by default and as JSON objects with ``--log-format json``.

The engine runs as a real process against a real Prometheus; its action goes through the
`fleet` executor to the recording HTTP server of tests/integration/runtime/test_engine_restart.py.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from gpuops.sources.promproc import PrometheusServer
from tests.integration.runtime.test_engine_restart import EngineProcess, Recorder
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

RULES = """
groups:
  - name: told
    interval: 1s
    rules:
      - policy: add-a-node
        expr: label_replace(vector(36), "pool", "default", "", "")
        for: 0s
        target: [pool]
        action: {type: scale_out, executor: fleet, params: {nodes: 1}}
        mode: enforce
        annotations:
          summary: "{{ $value }} jobs waiting in pool {{ $labels.pool }}: adding a node"
"""


def test_the_engine_logs_each_decision_and_its_outcome_in_words_and_as_json(
    tmp_path: Path,
) -> None:
    recorder = Recorder()
    thread = threading.Thread(target=recorder.serve_forever, daemon=True)
    thread.start()
    prom = PrometheusServer(tmp_path / "prom", "global: {scrape_interval: 15s}\n")
    prom.start()
    try:
        for fmt in ("text", "json"):
            root = tmp_path / fmt
            (root / "rules").mkdir(parents=True)
            (root / "rules" / "told.yaml").write_text(RULES)
            config = root / "engine.yaml"
            config.write_text(
                json.dumps(
                    {
                        "prometheus": {"url": prom.url, "timeout": "2s"},
                        "rules": ["rules"],
                        "state_file": "state.sqlite",
                        "audit": {"spool_dir": "audit"},
                        "executors": {"fleet": {"url": recorder.url}},
                        "metrics_listen": None,
                        "log": {"format": fmt},
                    }
                )
            )
            engine = EngineProcess(config, 0, root / "engine.log")
            engine.start()
            try:
                log = root / "engine.log"
                wait_for(
                    lambda log=log: "node-x added" in log.read_text(),
                    60,
                    f"the outcome line ({fmt})",
                )
                text = log.read_text()
            finally:
                engine.stop()
            if fmt == "text":
                assert (
                    "add-a-node on pool=default: scale_out runs: condition held for 0s (for: 0s)"
                    " — 36 jobs waiting in pool default: adding a node [decision " in text
                )
                assert (
                    "add-a-node on pool=default: scale_out done after 1 attempt: node-x added"
                    " [decision " in text
                )
            else:
                lines = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
                told = [line for line in lines if line.get("rule.name") == "add-a-node"]
                assert [line["gpuops.state"] for line in told[:2]] == ["running", "done"]
                outcome = told[1]
                assert outcome["gpuops.target.key"] == "pool=default"
                assert outcome["event.action"] == "scale_out"
                assert outcome["gpuops.verdict"] == "execute"
                assert outcome["gpuops.effect"] == "node-x added"
                assert outcome["gpuops.decision.id"] == told[0]["gpuops.decision.id"]
    finally:
        prom.stop()
        recorder.shutdown()
        recorder.server_close()
        thread.join(timeout=5)
