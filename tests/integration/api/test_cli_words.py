"""`gpuops decisions list|explain` tell a decision in words: the policy's summary, the value
as what it is, a multi-line expression as lines (not a literal ``\\n``), what the executor
changed as sentences, and the state (not the stored status)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from gpuops.cli import cli
from tests.fakes.prometheus import FakePrometheus
from tests.integration.api.harness import running_api

RULES = """\
groups:
  - name: words
    interval: 1h
    rules:
      - policy: queue-long
        expr: |
          sum by (pool) (gpuops_queue_pending_jobs)
            > 10
        target: [pool]
        action: {type: scale_out, executor: log, params: {nodes: 1}}
        mode: enforce
        annotations:
          summary: "{{ $value }} jobs waiting in pool {{ $labels.pool }}: adding a node"
"""
EXPR = "sum by (pool) (gpuops_queue_pending_jobs)\n  > 10"


def run(url: str, token: str, *args: str) -> str:
    env = {"GPUOPS_URL": url, "GPUOPS_TOKEN": token}
    result = CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_list_and_explain_say_the_decision_in_words(tmp_path: Path) -> None:
    prom = FakePrometheus()
    prom.results[EXPR] = [{"pool": "a"}]
    with running_api(tmp_path, rules=RULES, source=prom) as api:
        policy = api.engine.rules.policy("queue-long")
        assert policy is not None
        (decision,) = api.engine.evaluate_policy(policy)
        api.engine.wait_idle(10)
        token = api.tokens["auditor"]
        header, row = run(api.url, token, "decisions", "list").splitlines()
        assert header.split()[-4:] == ["ACTION", "VERDICT", "STATE", "EFFECT"]
        assert "  scale_out  runs     done  " in row  # the verdict in words, as explain says
        listed = run(api.url, token, "decisions", "list", "--json")
        assert '"verdict": "execute"' in listed  # machine output keeps the token
        assert row.endswith("recorded in the log only: nothing changed")
        explained = run(api.url, token, "decisions", "explain", decision.id).splitlines()
    assert explained[0] == "0.1 jobs waiting in pool a: adding a node"
    assert "because its expression returned 0.1 for this target" in explained[2]
    at = explained.index("expression:")
    assert explained[at + 1 : at + 3] == [
        "  sum by (pool) (gpuops_queue_pending_jobs)",
        "    > 10",
    ]
    assert "outcome: done after 1 attempt: recorded in the log only: nothing changed" in explained
    assert not any("\\n" in line for line in explained)
