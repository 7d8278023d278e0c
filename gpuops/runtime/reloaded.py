"""Policies loaded again: what becomes of the fires the gate held while their policy was not
in the rule set (``Suppression.POLICY_REMOVED``, ``gpuops.runtime.gate.holds``).

Held fires are decided again at the policy's next evaluation
(``gpuops.model.evaluation.failed`` set their ``retry_at``), unless held longer than
``guardrails.action_max_age``: then a target on which nothing of its episode ran starts over,
and one on which an action of its episode ran keeps firing without the held repeat, so that its
clear still undoes what ran (docs/policies.md). Called by ``gpuops.runtime.facade.Engine`` when
a reload brings policies back and when this replica is elected.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace

from gpuops.model.decisions import Suppression, freeze
from gpuops.model.evaluation.state import PolicyState
from gpuops.runtime.controls import Locks
from gpuops.store.errors import StateRowError
from gpuops.store.interface import Store

log = logging.getLogger(__name__)


def expire_held_fires(
    store: Store, locks: Locks, names: Iterable[str], now: float, grace: float
) -> None:
    """Expire the fires held for want of their policy longer than ``grace`` seconds before
    ``now``, of the policies ``names`` just loaded (again, or at start). A target on which
    nothing of its episode ran starts over (still in the policy's result, it is pending again
    and must hold ``for`` anew: nothing says the condition held while the policy was away);
    one on which an action of its episode ran (a repeat was held) keeps firing, without the
    held repeat."""
    verdict = Suppression.POLICY_REMOVED.verdict.value
    stored = set(store.policy_names())
    for name in sorted(set(names) & stored):
        with locks.policy(name):
            try:
                state = store.policy_state(name)
            except StateRowError:  # its evaluations say so (docs/state.md)
                continue
            old = {
                key: t
                for key, t in state.targets.items()
                if t.held == verdict and t.held_since is not None and now - t.held_since > grace
            }
            if not old:
                continue
            targets = {k: t for k, t in state.targets.items() if k not in old}
            for key, t in old.items():
                if t.acted:
                    targets[key] = replace(
                        t, retry_at=None, held=None, held_since=None, held_repeats=0
                    )
            with store.transaction() as db:
                store.save_policy_state(db, name, PolicyState(freeze(targets)))
        over = sorted(k for k, t in old.items() if not t.acted)
        log.warning(
            "policy %s is loaded again after more than action_max_age %.0fs: the fires"
            " held while it was away start over on %d targets (%s); %d targets keep the"
            " action that ran and their undo",
            name,
            grace,
            len(over),
            ", ".join(over[:10]),
            len(old) - len(over),
        )
