"""The cycle's ``clear_expr`` for the firing targets (``_narrowed_clear``) is what
``narrowed`` gives over all of them (or the wide ``clear_expr`` where it gives None), also
where it stops reading early (more values of a label than are narrowed to)."""

from __future__ import annotations

from gpuops.model.decisions import freeze
from gpuops.model.evaluation.state import PolicyState, Status, TargetState
from gpuops.runtime.cycle.clears import narrowed_clear as _narrowed_clear
from gpuops.sources.promql import NARROW_MAX_TARGETS, narrowed

EXPR = 'avg_over_time(DCGM_FI_DEV_GPU_UTIL{job="dcgm"}[5m]) > 30'


def a_state(labels: list[dict[str, str]], pending_every: int = 0) -> PolicyState:
    targets = {}
    for n, item in enumerate(labels):
        pending = pending_every and n % pending_every == 0
        status = Status.PENDING if pending else Status.FIRING
        targets[",".join(f"{k}={v}" for k, v in item.items())] = TargetState(
            status, 1.0, 1.0, 0.1, freeze(item)
        )
    return PolicyState(freeze(targets))


def reference(names: tuple[str, ...], state: PolicyState) -> str | None:
    firing = [t.labels for t in state.base.values() if t.status is not Status.PENDING]
    return (narrowed(EXPR, names, firing) or EXPR) if firing else None


def test_the_clear_query_is_narrowed_s_over_every_firing_target() -> None:
    many = 2 * NARROW_MAX_TARGETS + 50
    cases = [
        (("uuid",), a_state([])),
        (("uuid",), a_state([{"uuid": "u0"}], pending_every=1)),  # none fires
        (("node", "uuid"), a_state([{"node": f"n{i // 4}", "uuid": f"u{i}"} for i in range(40)])),
        (("uuid",), a_state([{"uuid": f"u{i}"} for i in range(many)], pending_every=3)),
        # more targets than NARROW_MAX_TARGETS, but no label with more values: narrowed
        (
            ("node", "gpu"),
            a_state([{"node": f"n{i // 4}", "gpu": str(i % 4)} for i in range(3600)]),
        ),
        # a label past the limit only after the first 2 * NARROW_MAX_TARGETS + 1
        (
            ("node",),
            a_state([{"node": f"n{i % 900 if i < many else i}"} for i in range(many + 200)]),
        ),
        (("__name__", "uuid"), a_state([{"uuid": f"u{i}"} for i in range(5)])),
    ]
    kinds = set()
    for names, state in cases:
        got = _narrowed_clear(EXPR, names, state)
        assert got == reference(names, state), names
        kinds.add("none" if got is None else "wide" if got == EXPR else "narrowed")
    assert kinds == {"none", "wide", "narrowed"}
