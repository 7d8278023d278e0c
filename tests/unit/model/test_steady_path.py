"""The fast paths of the evaluation (``gpuops.model.evaluation.fastpath``): answers as columns
(``Vector``), target keys made in C, a quiet state seen again without a ``TargetState`` per
target, and the store writing only the rows whose refresh is due. Each is checked against the
general path it stands in for: the same decisions and the same states, evaluation after
evaluation."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from gpuops.model.decisions import ActionSpec, Sample, Target, Vector, Verdict, freeze
from gpuops.model.evaluation.evaluator import evaluate
from gpuops.model.evaluation.settling import settle
from gpuops.model.evaluation.state import PolicyState, Status, TargetState
from gpuops.model.evaluation.step import QueryResult, Step
from gpuops.model.rules.model import Policy
from gpuops.model.staleness import StaleInput
from gpuops.sources import QueryError
from gpuops.sources.prometheus import decode_vector
from gpuops.store.sql.policy_seen import REFRESH_S
from gpuops.store.sqlite import StateStore

POLICY = Policy(
    name="reclaim",
    group="g",
    expr="util < 0.2",
    clear_expr="util > 0.5",
    action=ActionSpec("reclaim", "fleet"),
    on_clear=ActionSpec("restore_clocks", "fleet"),
    for_s=60,
    target=("node", "uuid"),
    mode="enforce",
)


def series(uuids: list[str], value: float = 0.1) -> list[dict[str, object]]:
    return [
        {"metric": {"node": f"n{u}", "uuid": u, "job": "x"}, "value": [0, f"{value}"]}
        for u in uuids
    ]


def both(raw: list[dict[str, object]]) -> tuple[Vector, tuple[Sample, ...]]:
    """The same answer as columns (the steady path may run) and as samples (it may not)."""
    vector = decode_vector(raw, "q")
    return vector, tuple(vector)


def test_target_keys_are_those_of_target_from_labels_or_none() -> None:
    raw = series(["a", "b"]) + [{"metric": {"uuid": "c", "node": "n"}, "value": [1, "2"]}]
    vector = decode_vector(raw, "q")
    assert vector.target_keys(("uuid", "node", "__name__")) == [
        Target.from_labels(s.labels, ("uuid", "node")).key for s in vector
    ]
    assert vector.target_keys(("uuid",)) == ["uuid=a", "uuid=b", "uuid=c"]
    assert vector.target_keys(("pool",)) is None  # a series without it: asked one by one
    assert vector.target_keys(None) is None  # all labels
    comma = decode_vector([{"metric": {"uuid": "a,b"}, "value": [1, "1"]}], "q")
    assert comma.target_keys(("uuid",)) is None  # key_value escapes it


def test_decode_vector_checks_every_series_and_says_which_is_bad() -> None:
    vector = decode_vector(
        [
            {"metric": {"uuid": "a"}, "value": [1.5, "0.25"]},
            {"metric": {"uuid": "b"}, "value": [2, "NaN"]},  # left out
            {"metric": {"uuid": "c", "n": 7}, "value": [3, "-Inf"]},
        ],
        "q",
    )
    assert list(vector) == [
        Sample(freeze({"uuid": "a"}), 0.25, 1.5),
        Sample(freeze({"uuid": "c", "n": "7"}), float("-inf"), 3.0),
    ]
    for bad, why in (
        ({"metric": {}, "value": [True, "1"]}, "malformed series"),
        ({"metric": {}, "value": [1, " 1"]}, "not a number: ' 1'"),
        ({"metric": {}, "value": [1, "1\n2"]}, "not a number"),
        ({"metric": {}, "value": [1, "1", 2]}, "malformed series"),
        ({"metric": [], "value": [1, "1"]}, "malformed series"),
    ):
        with pytest.raises(QueryError, match=why):
            decode_vector([*series(["a"]), bad], "q")


def test_the_steady_path_gives_what_the_general_path_gives() -> None:
    """Rounds of one policy fed the same answers as columns and as samples: pending, firing
    (the fire settled as held back, with a retry time), seen again quietly, the retry,
    another target coming and one cleared by clear_expr."""
    uuids = [f"u{i}" for i in range(6)]
    rounds: list[tuple[float, list[str], list[str]]] = [
        (0, uuids, []),
        (30, uuids, []),
        (60, uuids, []),  # fire
        (90, uuids, []),
        (120, uuids, []),  # quiet: the steady path
        (150, uuids, []),
        (200, uuids, []),  # the retry time of the held fires
        (230, [*uuids, "new"], []),
        (260, [*uuids, "new"], ["u1"]),  # u1 clears
        (290, [u for u in uuids if u != "u1"] + ["new"], []),
    ]
    states = [PolicyState(), PolicyState()]
    steady = 0
    for now, present, clearing in rounds:
        outcomes = []
        for which, state in enumerate(states):
            vector, samples = both(series(present))
            clear_v, clear_s = both(series(clearing, 0.9))
            answer = (vector, clear_v) if which == 0 else (samples, clear_s)
            step = evaluate(POLICY, QueryResult(*answer), state, now)
            if which == 0 and step.state.base is state.base and state.base:
                steady += 1
            held = [replace(d, verdict=Verdict.SUPPRESSED_MAX_PER_HOUR) for d in step.decisions]
            states[which] = settle(step.state, held, lambda d: 200.0)
            outcomes.append(([(d.id, d.transition, d.evidence.value) for d in held], step))
        (fast, fast_step), (slow, slow_step) = outcomes
        assert fast == slow, now
        assert fast_step.state == slow_step.state, now
        assert dict(states[0].targets) == dict(states[1].targets), now
    assert steady == 4  # 30, 90 (the fire settled quiet), 120, 150; the others decided or changed
    assert states[0].targets["node=nu0,uuid=u0"].last_seen == 290


def test_both_paths_order_the_state_and_the_clears_as_the_answer_came() -> None:
    """An answer in a new order is ordered as the answer came on every path, so that the
    clears of absent targets (judged in order, each seeing the budget used before it) come
    out in the same order in the live engine and in the what-if."""
    policy = replace(POLICY, for_s=0, clear_expr=None, on_clear=None, target=("uuid",))
    rounds = [(0, ["u0", "u1", "u2"]), (30, ["u0", "u1", "u2"]), (60, ["u2", "u0", "u1"])]
    orders: list[list[list[str]]] = [[], []]
    for which in (0, 1):
        state = PolicyState()
        for now, present in [*rounds, (90, [])]:
            vector, samples = both(series(present))
            step = evaluate(policy, QueryResult(vector if which == 0 else samples), state, now)
            state = settle(
                step.state,
                [replace(d, verdict=Verdict.EXECUTE) for d in step.decisions],
                lambda d: 0,
            )
            orders[which].append(list(state.targets) or [d.target.key for d in step.decisions])
    assert orders[0] == orders[1]
    assert orders[0][-1] == ["uuid=u2", "uuid=u0", "uuid=u1"]  # the clears, in the last order


def test_states_sharing_a_base_are_equal_only_when_seen_at_the_same_time() -> None:
    """Two states sharing a base with the same values are not equal when seen at different
    times (their targets' ``last_seen`` differ)."""
    base = freeze(
        {"k": TargetState(Status.FIRING, active_since=0, last_seen=0, value=0.1, labels=freeze({}))}
    )
    early = PolicyState(base, seen=[0.1], seen_at=100.0)
    late = PolicyState(base, seen=[0.1], seen_at=900.0)
    assert early.targets != late.targets
    assert early != late
    assert early == PolicyState(base, seen=[0.1], seen_at=100.0)
    assert early != PolicyState(base, seen=[0.2], seen_at=100.0)
    assert PolicyState(base) == PolicyState(base, seen=[0.1], seen_at=0)  # merged: the same


def test_a_steady_state_writes_no_target_row_and_its_values_in_one_row(tmp_path: Path) -> None:
    """The store writes nothing while only values move, then, once the policy's refresh is
    due (between half of REFRESH_S and all of it), one row with every target's last_seen and
    value (``policy_seen``, not a row per target: no refresh bursts); a restart reads
    the refreshed values."""
    uuids = [f"u{i}" for i in range(40)]
    path = tmp_path / "state.sqlite"
    store = StateStore(path)
    state = PolicyState()
    written: list[int] = []
    try:
        for n in range(int(REFRESH_S / 30) + 2):
            now = n * 30.0
            vector = decode_vector(series(uuids, 0.1 + n / 1000), "q")
            step = evaluate(replace(POLICY, for_s=3600), QueryResult(vector), state, now)
            with store.transaction() as db:
                before = db.total_changes
                store.save_policy_state(db, "p", step.state)
                written.append(db.total_changes - before)
            state = store.policy_state("p")
            assert state is step.state  # the cache hands back what was committed
    finally:
        store.close()
    half = int(REFRESH_S / 2 / 30)
    assert written[0] == len(uuids)  # all new
    assert sum(written[1:half]) == 0  # only values moved, no refresh due yet
    assert 1 <= sum(written[half:]) <= 2  # the policy_seen row, at most every REFRESH_S / 2
    reopened = StateStore(path)
    try:
        targets = reopened.policy_state("p").targets
        assert len(targets) == len(uuids)
        assert all(
            t.status is Status.PENDING and t.last_seen >= REFRESH_S / 2 for t in targets.values()
        )
    finally:
        reopened.close()


def test_a_refresh_stores_each_target_its_own_value(
    tmp_path: Path,
) -> None:
    """Each target's refreshed value (``policy_seen``) is its own, of the round it was
    refreshed in (the values of a steady state are a column in the base's order)."""
    uuids = [f"u{i}" for i in range(40)]
    path = tmp_path / "state.sqlite"
    store = StateStore(path)
    state = PolicyState()
    try:
        for n in range(int(REFRESH_S / 30) + 2):
            raw = series(uuids)
            for i, item in enumerate(raw):
                item["value"] = [0, f"{i + n / 1000}"]
            step = evaluate(
                replace(POLICY, for_s=3600), QueryResult(decode_vector(raw, "q")), state, n * 30.0
            )
            with store.transaction() as db:
                store.save_policy_state(db, "p", step.state)
            state = store.policy_state("p")
    finally:
        store.close()
    reopened = StateStore(path)
    try:
        targets = reopened.policy_state("p").targets
        refreshed = [t for t in targets.values() if t.last_seen > 0]
        assert len(refreshed) == len(uuids)
        for t in refreshed:
            i, n = int(t.labels["uuid"][1:]), t.last_seen / 30
            assert t.value == pytest.approx(i + n / 1000), t
    finally:
        reopened.close()


def _answers(
    which: int, policy: Policy, present: list[str], busy: list[str], now: float
) -> tuple[Vector | tuple[Sample, ...], Vector | tuple[Sample, ...] | None]:
    """A churn round's answer and ``clear_expr`` answer (None without one): as columns for the
    fast paths (``which`` 0), as samples for the general path (1)."""
    pick = 0 if which == 0 else 1
    answer = both(series(present, 0.1 + now / 1e5))[pick]
    clear = both(series(busy, 0.9))[pick] if policy.clear_expr else None
    return answer, clear


def _churn_rounds(seed: int, n: int, rounds: int) -> list[tuple[float, list[str], list[str]]]:
    """``rounds`` answers 30 s apart: ``n`` GPUs, each idle (in the answer) or busy (in the
    ``clear_expr`` answer, a few in both); every round a tenth flip, back and forth as in
    ``bench_round --churn``, and now and then others for good, so targets come, stay
    pending, fire, clear and come again."""

    rng = random.Random(seed)
    uuids = [f"u{i}" for i in range(n)]
    idle = set(uuids[: n // 2])
    flip = set(rng.sample(uuids, n // 10))  # as bench_round: the same GPUs back and forth
    out = []
    for r in range(rounds):
        if r > 2:
            idle ^= flip
        if r % 7 == 6:  # and now and then others, for good
            idle ^= set(rng.sample(uuids, 2))
        present = [u for u in uuids if u in idle]
        if r % 5 == 4:
            rng.shuffle(present)  # another order now and then: the general path's case
        busy = [u for u in uuids if u not in idle]
        both = [u for u in present if rng.random() < 0.03]  # in both answers: a clear
        out.append((r * 30.0, present, busy + both))
    return out


def _judged(step: Step, now: float, store: StateStore) -> tuple[PolicyState, object]:
    """``step`` judged as the side-by-side tests judge (some fires executed, some held back
    and retried 45 s later, some dry-run), settled and saved: the next state and what both
    paths must agree on (decisions, the step's and the settled state's targets in order)."""
    verdicts = [Verdict.EXECUTE, Verdict.SUPPRESSED_MAX_PER_HOUR, Verdict.DRY_RUN]
    judged = [
        replace(d, verdict=verdicts[(len(d.target.key) + int(now)) % 3]) for d in step.decisions
    ]
    state = settle(step.state, judged, lambda d: d.at + 45)
    with store.transaction() as db:
        store.save_policy_state(db, "p", state)
    outcome = (
        [(d.id, d.transition, d.evidence.value, d.reason) for d in judged],
        list(step.state.targets.items()),
        list(state.targets.items()),
    )
    return state, outcome


def _read_back(path: Path) -> dict[str, TargetState]:
    store = StateStore(path)
    try:
        return dict(store.policy_state("p").targets)
    finally:
        store.close()


@pytest.mark.parametrize(
    ("policy", "churns"),
    [
        (POLICY, 2),
        # a firing target gone from the answer is absent (kept for keep_firing_for): the
        # general path's (not the churn path's)
        (replace(POLICY, clear_expr=None, on_clear=None, keep_firing_for_s=45), 0),
        (replace(POLICY, clear_expr=None, keep_firing_for_s=0), 2),  # gone: cleared at once
        (replace(POLICY, for_s=90, target=("uuid",)), 2),
        # ``for: 0``: a target that comes fires at once, the churn path only drops and clears
        (replace(POLICY, for_s=0), 0),
    ],
    ids=["clear_expr", "keep_firing_for", "keep_firing_for_0", "for_90", "for_0"],
)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_with_churn_the_fast_paths_give_what_the_general_path_gives(
    policy: Policy, churns: int, seed: int, tmp_path: Path
) -> None:
    """With churn: evaluations in which a tenth of the GPUs change, fed as columns
    (the steady and churn paths may run) and as samples (only the general path runs), with
    verdicts that execute some fires and hold others back (retried later): the same
    decisions, in the same order, the same states in the same order, and the same rows in
    the store (each path's states saved to its own store, read back by a fresh process)."""
    states = [PolicyState(), PolicyState()]
    stores = [StateStore(tmp_path / "fast.sqlite"), StateStore(tmp_path / "slow.sqlite")]
    churned = 0
    try:
        for now, present, busy in _churn_rounds(seed, 40, 30):
            outcomes = []
            for which, state in enumerate(states):
                answer, clear = _answers(which, policy, present, busy, now)
                step = evaluate(policy, QueryResult(answer, clear), state, now)
                if which == 0 and step.state.parent is not None:
                    churned += 1
                states[which], outcome = _judged(step, now, stores[which])
                outcomes.append(outcome)
            assert outcomes[0] == outcomes[1], now
            if int(now) % 150 == 120:  # now and then, as a restarted engine reads them
                assert _read_back(tmp_path / "fast.sqlite") == _read_back(tmp_path / "slow.sqlite")
    finally:
        for store in stores:
            store.close()
    assert churned >= churns  # the churn path ran (not only the general one)
    fast = _read_back(tmp_path / "fast.sqlite")
    assert fast == _read_back(tmp_path / "slow.sqlite")
    assert fast  # not vacuous


def test_back_and_forth_churn_stays_on_the_churn_path_round_after_round() -> None:
    """``bench_round --churn``'s answers: after the fire, every other round one idle GPU
    turns busy and one busy GPU idle, and back. Each round after the clears takes the churn
    path (a target that went pending must not leave its start behind as the state's
    ``Quiet.pending_since``, or every other round would take the general path, ``for``
    after it)."""
    idle, busy = [f"i{n}" for n in range(10)], [f"b{n}" for n in range(10)]
    flipped = (idle[1:] + busy[:1], busy[1:] + idle[:1])
    state = PolicyState()
    paths = []
    for n in range(14):
        present, clearing = flipped if n > 2 and n % 2 else (idle, busy)
        vector, clear = decode_vector(series(present), "q"), decode_vector(series(clearing), "c")
        step = evaluate(POLICY, QueryResult(vector, clear), state, n * 30.0)
        paths.append(
            "steady" if step.state.base is state.base else "churn" if step.state.parent else "-"
        )
        state = settle(
            step.state, [replace(d, verdict=Verdict.EXECUTE) for d in step.decisions], lambda d: 0
        )
    assert paths[4:] == ["churn"] * 10, paths


def test_settling_a_state_seen_again_gives_what_settling_it_merged_gives(tmp_path: Path) -> None:
    """``settle_all`` over a state of the steady or churn path (``PolicyState.seen``)
    changes only the decided targets: the same targets, in the same order, the same
    decisions, and a ``Quiet`` (a bound: no later than the exact one) exactly when the
    merged state's is one: an undo held back (a clearing target: not quiet), a fire held
    back on a base target (its retry time), both."""
    from gpuops.model.decisions import Transition
    from gpuops.model.evaluation.machine import decide as _decide
    from gpuops.model.evaluation.settling import settle_all

    uuids = [f"u{i}" for i in range(6)]
    none = decode_vector([], "c")
    state = PolicyState()
    for now in (0.0, 30.0, 60.0):  # pending, then fired and acted on
        step = evaluate(POLICY, QueryResult(decode_vector(series(uuids), "q"), none), state, now)
        state = settle(
            step.state, [replace(d, verdict=Verdict.EXECUTE) for d in step.decisions], lambda d: 0
        )
    kept = [u for u in uuids if u != "u1"]
    clear = decode_vector(series(["u1"], 0.9), "c")
    step = evaluate(POLICY, QueryResult(decode_vector(series(kept, 0.15), "q"), clear), state, 90.0)
    assert step.state.seen and step.state.parent is not None and step.decisions  # churn path
    undo = [replace(d, verdict=Verdict.SUPPRESSED_MAX_PER_HOUR) for d in step.decisions]
    u0 = step.state.targets["node=nu0,uuid=u0"]
    target = Target("node=nu0,uuid=u0", u0.labels)
    fire = replace(
        _decide(POLICY, target, u0, Transition.FIRE, 90.0, u0.value),
        verdict=Verdict.SUPPRESSED_MAX_PER_HOUR,
    )
    for batch in (undo, [fire], [*undo, fire]):
        merged = PolicyState(freeze(dict(step.state.targets)), quiet=step.state.quiet)
        fast = settle_all(step.state, batch, lambda d: 200.0)
        slow = settle_all(merged, batch, lambda d: 200.0)
        assert fast.state.seen  # the untouched targets shared
        assert list(fast.state.targets.items()) == list(slow.state.targets.items())
        assert fast.decisions == slow.decisions and fast.repeats == slow.repeats
        assert (fast.state.quiet is None) == (slow.state.quiet is None), batch
        if fast.state.quiet is not None and slow.state.quiet is not None:
            assert fast.state.quiet.pending_since <= slow.state.quiet.pending_since
            assert fast.state.quiet.retry_at <= slow.state.quiet.retry_at
        # stored over the rows of the state it came from: only the touched rows written
        paths = tmp_path / f"fast{len(batch)}.sqlite", tmp_path / f"slow{len(batch)}.sqlite"
        for path, settled in zip(paths, (fast.state, slow.state), strict=True):
            store = StateStore(path)
            try:
                with store.transaction() as db:
                    store.save_policy_state(db, "p", state)
                with store.transaction() as db:
                    store.save_policy_state(db, "p", settled)
            finally:
                store.close()
        back = _read_back(paths[0])
        assert back == _read_back(paths[1])  # last_seen and value: as of the last refresh
        assert back.keys() == slow.state.targets.keys()


def _stay_rounds(seed: int, n: int, rounds: int) -> list[tuple[float, list[str], list[str]]]:
    """``bench_round --churn-mode stay``'s answers, small: every round a few GPUs change
    (idle: in the answer; busy: in the ``clear_expr`` answer; a few neither: a firing
    target absent and not cleared, kept by hysteresis) and stay changed for a few rounds,
    so pending targets reach ``for`` and fire, firing ones clear, some leave before
    ``for``; each answer in the GPUs' order."""
    rng = random.Random(seed)
    uuids = [f"u{i}" for i in range(n)]
    home = {u: "idle" if i % 2 else "busy" for i, u in enumerate(uuids)}
    now_in: dict[str, tuple[str, int]] = {}  # changed GPUs: (kind, back at round)
    out = []
    for r in range(rounds):
        now_in = {u: v for u, v in now_in.items() if v[1] > r}
        if r > 2:
            for u in rng.sample([u for u in uuids if u not in now_in], 3):
                kind = "neither" if rng.random() < 0.2 else "busy" if home[u] == "idle" else "idle"
                now_in[u] = (kind, r + 1 + rng.randrange(6))
        kinds = {u: now_in[u][0] if u in now_in else home[u] for u in uuids}
        present = [u for u in uuids if kinds[u] == "idle"]
        busy = [u for u in uuids if kinds[u] == "busy"]
        out.append((r * 30.0, present, busy))
    return out


@pytest.mark.parametrize(
    ("policy", "fast_fires"),
    [
        (POLICY, 5),  # hysteresis: an absent firing target is kept until clear_expr matches
        (replace(POLICY, clear_expr=None, keep_firing_for_s=0), 10),
        # absent and kept for keep_firing_for: the general path's (not the churn path's)
        (replace(POLICY, clear_expr=None, on_clear=None, keep_firing_for_s=45), 0),
        (replace(POLICY, repeat_interval_s=90), 5),
        (replace(POLICY, for_s=0, target=("uuid",)), 3),
    ],
    ids=["clear_expr", "keep_firing_for_0", "keep_firing_for_45", "repeat_interval", "for_0"],
)
def test_with_due_timers_the_fast_paths_give_what_the_general_path_gives(
    policy: Policy, fast_fires: int, tmp_path: Path
) -> None:
    """With churn in which changed GPUs stay changed, timers come due in most
    evaluations (pending targets reach ``for``, held-back fires their retry times, the
    ``repeat_interval``): fed as columns (the steady and churn paths may run, the due
    targets alone through the state machine) and as samples (the general path only), the
    same decisions in the same order, the same states in the same order, the same stored
    rows; failed and stale queries now and then (they advance no timer), and a restart
    (each path's state read back from its own store, as a restarted engine reads it) after
    which no decision of before is made again."""
    from gpuops.model.evaluation.step import Freshness

    fresh = Freshness(max_sample_age_s=100)
    paths = [tmp_path / "fast.sqlite", tmp_path / "slow.sqlite"]
    stores = [StateStore(p) for p in paths]
    states = [PolicyState(), PolicyState()]
    ids: list[list[str]] = [[], []]
    due_rounds = 0
    try:
        for now, present, busy in _stay_rounds(7, 30, 36):
            r = int(now // 30)
            if r == 20:  # a restart: each path reads its own store afresh
                for store in stores:
                    store.close()
                stores = [StateStore(p) for p in paths]
                states = [store.policy_state("p") for store in stores]
            outcomes = []
            for which, state in enumerate(states):
                answer, clear = _answers(which, policy, present, busy, now)
                if r % 11 == 7:
                    result = QueryResult(error="the query failed")
                elif r % 13 == 9:
                    old = StaleInput("x{}", (Sample(freeze({}), 500.0, now),))  # every target's
                    result = QueryResult(answer, clear, stale=(old,))
                else:
                    result = QueryResult(answer, clear)
                step = evaluate(policy, result, state, now, fresh)
                if result.error is not None or result.stale:
                    assert step.decisions == () and step.skipped is not None
                fires = [d for d in step.decisions if d.transition.value == "fire"]
                if which == 0 and step.state.parent is not None and fires:
                    due_rounds += 1  # fires decided on the churn path
                ids[which] += [d.id for d in step.decisions]
                states[which], outcome = _judged(step, now, stores[which])
                outcomes.append(outcome)
            assert outcomes[0] == outcomes[1], now
            if r % 6 == 5:
                assert _read_back(paths[0]) == _read_back(paths[1]), now
    finally:
        for store in stores:
            store.close()
    assert ids[0] == ids[1]
    assert len(set(ids[0])) == len(ids[0])  # nothing decided twice, the restart included
    assert due_rounds >= fast_fires, (
        due_rounds
    )  # the fast path decided fires, not only the general one
    fast = _read_back(paths[0])
    assert fast == _read_back(paths[1]) and fast


def test_a_clear_of_an_absent_target_carries_the_value_last_seen() -> None:
    """The churn path cleared a firing target gone from the answer (``keep_firing_for: 0``)
    with the value of its ``TargetState`` in the base, rounds old after steady rounds; the
    general path takes the value last seen (``PolicyState.seen``)."""
    policy = replace(POLICY, clear_expr=None, keep_firing_for_s=0)
    uuids = ["a", "b", "c"]
    outcomes = []
    for columns in (True, False):
        state = PolicyState()
        for n, present in enumerate([uuids] * 6 + [["a", "c"]]):
            vector, samples = both(series(present, 0.1 + n / 100))
            step = evaluate(policy, QueryResult(vector if columns else samples), state, n * 30.0)
            state = settle(
                step.state,
                [replace(d, verdict=Verdict.EXECUTE) for d in step.decisions],
                lambda d: 0,
            )
        outcomes.append([(d.id, d.evidence.value) for d in step.decisions])
    assert outcomes[0] == outcomes[1] == [(outcomes[1][0][0], pytest.approx(0.15))]


def test_key_index_is_each_series_position_or_none_when_a_target_repeats() -> None:
    """``Vector.key_index``, shared by the policies of an answer on the churn path: each
    key's position; None when a target has two series (the general path keeps the first)
    or the keys are not made in C."""
    vector = decode_vector(series(["a", "b", "c"]), "q")
    assert vector.key_index(("uuid",)) == {"uuid=a": 0, "uuid=b": 1, "uuid=c": 2}
    assert vector.key_index(("uuid",)) is vector.key_index(("uuid",))  # remembered
    assert decode_vector(series(["a", "b", "a"]), "q").key_index(("uuid",)) is None
    assert vector.key_index(("pool",)) is None


@pytest.mark.parametrize(
    ("arrivals", "verdict", "fires"),
    [
        ({4: ["c"]}, Verdict.EXECUTE, {60.0: 2, 180.0: 1}),  # alone pending: the bound
        ({4: ["c"], 5: ["d"]}, Verdict.EXECUTE, {60.0: 2, 180.0: 1, 210.0: 1}),  # the starts
        # held back: retried at d.at + 45 in rounds without any other change
        (
            {4: ["c"]},
            Verdict.SUPPRESSED_MAX_PER_HOUR,
            {60.0: 2, 120.0: 2, 180.0: 3, 240.0: 3, 300.0: 3},
        ),
    ],
    ids=["one_added", "two_added", "held_retried"],
)
def test_a_target_added_on_the_churn_path_fires_in_a_round_without_other_change(
    arrivals: dict[int, list[str]], verdict: Verdict, fires: dict[float, int]
) -> None:
    """A target that comes on the churn path and then stays through evaluations in which
    nothing else changes fires at its ``for`` (its start lowers the state's bound and is kept
    among the pending starts ``fastpath.due`` looks at), and a fire held back is decided
    again at its retry time: faults planted there (the bound or the starts not kept) pass
    every side-by-side test, so this one looks at the times."""
    policy = replace(POLICY, target=("uuid",))
    decided: list[list[tuple[float, str]]] = [[], []]
    for which in (0, 1):
        state, present = PolicyState(), ["a", "b"]
        for n in range(12):
            present = present + arrivals.get(n, [])
            vector, samples = both(series(present))
            clear_v, clear_s = both([])
            answer = (vector, clear_v) if which == 0 else (samples, clear_s)
            step = evaluate(policy, QueryResult(*answer), state, n * 30.0)
            decided[which] += [(d.at, d.target.key) for d in step.decisions]
            judged = [replace(d, verdict=verdict) for d in step.decisions]
            state = settle(step.state, judged, lambda d: d.at + 45)
    assert decided[0] == decided[1]
    counts: dict[float, int] = {}
    for at, _ in decided[0]:
        counts[at] = counts.get(at, 0) + 1
    assert counts == fires


def test_a_decision_but_some_fields_is_what_replace_makes() -> None:
    """``Decision.but`` (and ``with_verdict``): ``dataclasses.replace`` without re-running
    ``__init__``; the verdict made a ``Verdict`` as ``__post_init__`` does; a name that is
    not a field is refused."""
    from gpuops.model.decisions import Decision

    uuids = ["a"]
    state = PolicyState()
    for now in (0.0, 60.0):
        step = evaluate(POLICY, QueryResult(decode_vector(series(uuids), "q")), state, now)
        state = step.state
    (fire,) = step.decisions
    assert fire.with_verdict(Verdict.DRY_RUN, "why") == replace(
        fire, verdict=Verdict.DRY_RUN, reason="why"
    )
    held = fire.but(verdict="suppressed:cooldown", held_repeats=3)
    assert held.verdict is Verdict.SUPPRESSED_COOLDOWN and held.held_repeats == 3
    assert held == replace(fire, verdict=Verdict.SUPPRESSED_COOLDOWN, held_repeats=3)
    assert isinstance(held, Decision) and fire.verdict is Verdict.EXECUTE  # not changed
    with pytest.raises(TypeError, match="not fields of Decision: \\['verdit'\\]"):
        fire.but(verdit="execute")
