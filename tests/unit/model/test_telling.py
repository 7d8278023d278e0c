"""Decisions in words (``gpuops.model.telling``): values as what they are, what executors
changed as sentences, whether an action did its verb, true states, plurals."""

from __future__ import annotations

from typing import Any

import pytest

from gpuops.model.decisions import Outcome, OutcomeStatus, Verdict
from gpuops.model.telling import (
    State,
    effect,
    expr_lines,
    outcome_words,
    plural,
    state,
    value_in_words,
)


@pytest.mark.parametrize(
    ("expr", "value", "words"),
    [
        ('up{job="gpu-nodes"} == 0', 0.0, "down"),
        ("max_over_time(nvml_gpu_utilization_ratio[30m]) < 0.20", 0.24980943717528903, "25%"),
        ("avg(nvml_gpu_utilization_ratio) < 0.2", 0.031, "3.1%"),
        ("sum by (pool) (gpuops_queue_pending_jobs) > 10", 36.0, "36"),
        ("some_metric > 1", 1234.5678, "1235"),
        ("some_metric > 1", None, "no value"),
    ],
)
def test_values_are_told_as_what_they_are(expr: str, value: float | None, words: str) -> None:
    assert value_in_words(expr, value) == words


def test_multi_line_promql_is_told_as_lines() -> None:
    expr = "max_over_time(x[6s]) < 0.20\n  and on (uuid) gpuops_gpu_allocated == 1\n"
    assert expr_lines(expr) == [
        "max_over_time(x[6s]) < 0.20",
        "  and on (uuid) gpuops_gpu_allocated == 1",
    ]


@pytest.mark.parametrize(
    ("verb", "changed", "text", "did"),
    [
        (
            "migrate",
            {"node": "node-3", "state": "drained", "moved": [], "requeued": ["job-1"]},
            "node-3 drained; job-1 requeued: no free node; no job moved",
            False,
        ),
        (
            "migrate",
            {"node": "n", "moved": [{"job": "job-1", "from": "n", "to": "m"}], "requeued": []},
            "n drained; job-1 moved to m",
            True,
        ),
        (
            "migrate",
            {"node": "gpu-a", "drained": True, "reason": "gpuops:x:1", "requeued_jobs": ["7", "8"]},
            "gpu-a drained; jobs 7 and 8 requeued to run elsewhere",
            True,
        ),
        (
            "downclock",
            {"uuid": "GPU-1", "node": "n1", "max_clock_mhz": 1100, "previous": 1980},
            "clocks of GPU-1 on n1 capped at 1100 MHz, were 1980",
            True,
        ),
        (
            "downclock",
            {"uuid": "GPU-1", "max_clock_mhz": 1100, "previous": None},
            "clocks of GPU-1 capped at 1100 MHz, were not capped",
            True,
        ),
        (
            "restore_clocks",
            {"uuid": "GPU-1", "max_clock_mhz": None, "previous": 1100},
            "clock cap of GPU-1 removed (was 1100 MHz)",
            True,
        ),
        (
            "scale_in",
            {"pool": "gpu", "powered_down": []},
            "no node powered down in pool gpu",
            False,
        ),
        (
            "scale_in",
            {"pool": "gpu", "powered_down": [], "why": "no idle node gpuops powered up"},
            "no node powered down in pool gpu: no idle node gpuops powered up",
            False,
        ),
        (
            "scale_out",
            {"pool": "gpu", "powered_up": ["cloud-1"]},
            "cloud-1 powered up in pool gpu",
            True,
        ),
        (
            "scale_out",
            {"pool": "a", "added": ["n-9"], "executor": "fleet"},
            "n-9 added to pool a",
            True,
        ),
        ("reclaim", {}, "nothing changed: already so, or nothing to do", False),
        (
            "reclaim",
            {
                "job": "job-1",
                "project": "p",
                "released_gpus": [],
                "requeued": True,
                "restarted_on": ["G"],
            },
            "job-1 of p requeued; it started again on G",
            False,
        ),
        (
            "reclaim",
            {"job": "22", "reclaimed": True, "how": "requeue", "user": "ann"},
            "job 22 (user ann) requeued: its GPU is free",
            True,
        ),
        (
            "notify",
            {"job": "22", "warned": True, "already": True},
            "job 22 was warned before",
            False,
        ),
        ("hold_class", {"priority_class": "low", "held": True}, "low held", True),
        ("anything", {"logged": True}, "recorded in the log only: nothing changed", True),
        (
            "custom",
            {"ticket": "OPS-1", "tags": ["a", "b"], "x": None},
            "ticket: OPS-1; tags: a and b; x: none",
            True,
        ),
    ],
)
def test_what_an_executor_changed_is_told_in_sentences(
    verb: str, changed: dict[str, Any], text: str, did: bool
) -> None:
    told = effect(verb, changed)
    assert (told.text, told.did) == (text, did)
    assert "[]" not in told.text and "None" not in told.text and "{" not in told.text


def test_states_are_true() -> None:
    ok = Outcome(
        OutcomeStatus.SUCCESS, attempts=1, changed={"node": "n", "moved": [], "requeued": ["j"]}
    )
    assert (
        state(Verdict.AWAITING_APPROVAL, has_action=True, started=False, outcome=None)
        is State.WAITING
    )
    assert (
        state(Verdict.SUPPRESSED_COOLDOWN, has_action=True, started=False, outcome=None)
        is State.HELD
    )
    assert state(Verdict.EXECUTE, has_action=True, started=True, outcome=None) is State.RUNNING
    for verdict, settled in (
        (Verdict.SUPPRESSED_DENIED, "denied"),
        (Verdict.SUPPRESSED_APPROVAL_EXPIRED, "expired"),
        (Verdict.SUPPRESSED_APPROVAL_CANCELLED, "cancelled"),
    ):
        assert state(verdict, has_action=True, started=False, outcome=None) == settled
    assert (
        state(Verdict.EXECUTE, has_action=True, started=False, outcome=ok, verb="migrate")
        is State.NO_EFFECT
    )
    moved = Outcome(
        OutcomeStatus.SUCCESS, attempts=1, changed={"node": "n", "moved": [{"job": "j", "to": "m"}]}
    )
    assert (
        state(Verdict.EXECUTE, has_action=True, started=False, outcome=moved, verb="migrate")
        is State.DONE
    )
    assert (
        state(
            Verdict.EXECUTE,
            has_action=True,
            started=False,
            outcome=moved,
            verb="migrate",
            undone=True,
        )
        is State.UNDONE
    )
    failed = Outcome(OutcomeStatus.FAILURE, attempts=3, error="boom")
    assert state(Verdict.EXECUTE, has_action=True, started=False, outcome=failed) is State.FAILED
    assert state(Verdict.DRY_RUN, has_action=True, started=False, outcome=None) is State.DRY_RUN


def test_plurals_are_right() -> None:
    assert plural(1, "attempt") == "1 attempt"
    assert plural(2, "decision") == "2 decisions"
    assert plural(0, "decision") == "0 decisions"
    one = Outcome(OutcomeStatus.FAILURE, attempts=1, error="refused", permanent=True)
    assert outcome_words(one, "reclaim") == "failed for good after 1 attempt: refused"
