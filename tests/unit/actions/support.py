"""The decision the executor tests hand their executors (not a test module); the scripted HTTP
receiver they send to is ``tests.fakes.receiver``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuops.model.decisions import ActionSpec, Decision, Evidence, Target, Transition


def make_decision(
    verb: str = "notify",
    executor: str = "webhook",
    params: Mapping[str, Any] | None = None,
    did: str = "0123456789abcdef01234567",
    **labels: str,
) -> Decision:
    target = Target.from_labels(labels or {"node": "n1", "uuid": "GPU-1"}, None)
    return Decision(
        id=did,
        policy="reclaim-idle-gpus",
        group="gpu-efficiency",
        target=target,
        transition=Transition.FIRE,
        action=ActionSpec(verb, executor, dict(params or {})),
        evidence=Evidence(
            "max_over_time(nvml_gpu_utilization_ratio[30m]) < 0.2", 0.05, 0.0, 1800.0
        ),
        at=1800.0,
        episode_start=0.0,
        reason="",
        labels={"team": "platform"},
        annotations={"summary": "GPU-1 idle"},
    )


UUID0 = "GPU-00005100-0000-4a1b-9c2d-000000000000"
"""The GPU of ``agent_decision``'s target (the fake NVML's first)."""


def agent_decision(
    verb: str, params: dict[str, Any] | None = None, did: str = "dec-1", **labels: str
) -> Decision:
    """A decision of the ``nvml-agent`` executor on node 127.0.0.1, GPU ``UUID0``."""
    target = Target.from_labels({"node": "127.0.0.1", "uuid": UUID0, **labels}, None)
    return Decision(
        id=did,
        policy="downclock-underused-gpus",
        group="gpu-efficiency",
        target=target,
        transition=Transition.FIRE if verb == "downclock" else Transition.CLEAR,
        action=ActionSpec(verb, "nvml-agent", params or {}),
        evidence=Evidence(
            "avg_over_time(nvml_gpu_utilization_ratio[10m]) < 0.30", 0.02, 0.0, 600.0
        ),
        at=600.0,
        episode_start=0.0,
    )


HOSTILE = [
    "GPU-1/../../nodes/n9/migrate#",
    "a/b",
    "x?y=1",
    "frag#ment",
    "user@evil.example",
    "127.0.0.1:19902/steal#",
    "50%",
    "%2e%2e",
    "line\nX-Injected: 1",
    "carriage\r\nreturn",
    "GPU-ü✓-三",
    "...",
]
"""Values each executor must carry as data, decoded back to themselves at the other end."""
