"""The ``ansible`` executor: runs an Ansible playbook for one node (``run_playbook``), the step
of a batch operation (``gpuops.runtime.batch``).

``gpuops.actions.base.execute`` calls ``run``. The playbook runs through ansible-runner
(``gpuops.integrations.ansible.runner``) over the params' inventory, limited to the target's
``node`` label — one host of that inventory, never a pattern: a label holding ``,``, ``:``,
``!``, ``&``, ``*``, ``?``, ``@`` or ``[``, or naming no host of the inventory (a group such as
``all``, or ``localhost`` that the inventory does not list) is refused before anything runs, so a
node's name cannot widen the run to other hosts or move it to the engine's own. A task that fails is
a ``PermanentError`` naming the host, task and message; an unreachable host too (the operation
reports the node and goes on: trying again is an admin's ``retry``); a run past its timeout is
a ``TemporaryError``; a run ``run_cancellable`` is told to stop is cancelled through
ansible-runner's ``cancel_callback`` (``Cancelled``). The decision id names the run's
artifacts folder.

Settings (``executors.ansible``): ``private_dir``, where ansible-runner keeps each run's
artifacts (events, stdout, status). Params: ``playbook``, ``inventory`` (paths), ``extra_vars``,
``timeout_s``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, ValidationError

from gpuops.actions.base import Cancel, Cancelled, PermanentError, TemporaryError
from gpuops.actions.config import problems, settings_of
from gpuops.actions.results import Result
from gpuops.integrations.ansible.runner import inventory_names, run_playbook
from gpuops.model.decisions import Decision

RUN_PLAYBOOK = "run_playbook"
_PATTERN = re.compile(r"[,:!&*?@\[\]~\s]")


class AnsibleSettings(BaseModel):
    """``executors.ansible`` in the engine configuration. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    private_dir: Path = Path("var/ansible")
    """Where ansible-runner keeps each run's artifacts, one folder per decision id (relative
    paths: to the engine's working directory)."""


class PlaybookParams(BaseModel):
    """The params of ``run_playbook``. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    playbook: Path
    inventory: Path
    extra_vars: dict[str, str] = Field(default_factory=dict)
    timeout_s: PositiveFloat = 1800.0


class PlaybookRan(Result):
    """A playbook that ran to its end on its node."""

    node: str
    playbook: str
    status: str


class AnsibleExecutor:
    """Runs a playbook for the decision's node."""

    name = "ansible"
    verbs: frozenset[str] | None = frozenset({RUN_PLAYBOOK})

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self.settings = settings_of(AnsibleSettings, self.name, settings)

    @staticmethod
    def check_params(verb: str, params: Mapping[str, Any]) -> list[str]:
        if verb != RUN_PLAYBOOK:
            return [f"ansible does {RUN_PLAYBOOK} only, not {verb!r}"]
        try:
            PlaybookParams.model_validate(dict(params))
        except ValidationError as exc:
            return [f"ansible params: {problems(exc)}"]
        return []

    def run(self, decision: Decision) -> PlaybookRan:
        return self.run_cancellable(decision, lambda: None)

    def run_cancellable(self, decision: Decision, cancelled: Cancel) -> PlaybookRan:
        """``run``, with ansible-runner's ``cancel_callback`` asking ``cancelled``: a run it
        stops (ansible-runner ends ``ansible-playbook``) is ``Cancelled``."""
        why: list[str] = []

        def stop() -> bool:
            if not why:
                reason = cancelled()
                if reason is not None:
                    why.append(reason)
            return bool(why)

        try:
            params = PlaybookParams.model_validate(
                dict(decision.action.params) if decision.action else {}
            )
        except ValidationError as exc:
            raise PermanentError(f"ansible params: {problems(exc)}") from None
        node = decision.target.labels.get("node", "")
        if not node or _PATTERN.search(node) or node.startswith("-"):
            raise PermanentError(f"node {node!r} is not a host name an inventory can hold")
        for what, path in (("playbook", params.playbook), ("inventory", params.inventory)):
            if not path.is_file():
                raise PermanentError(f"{what} {path} not found")
        hosts, groups = inventory_names(params.inventory)
        if node not in hosts or node in groups:
            what = "a group" if node in groups else "no host"
            raise PermanentError(
                f"node {node!r} is {what} of inventory {params.inventory}: nothing ran"
            )
        ran = run_playbook(
            playbook=params.playbook,
            inventory=params.inventory,
            limit=node,
            extra_vars=params.extra_vars,
            private_dir=self.settings.private_dir,
            ident=decision.id,
            timeout_s=params.timeout_s,
            cancelled=stop,
        )
        if ran.status == "canceled" and why:
            raise Cancelled(f"{why[0]}; playbook {params.playbook} on {node} was cancelled")
        if ran.status == "timeout":
            raise TemporaryError(
                f"playbook {params.playbook} on {node}: past {params.timeout_s:.0f}s"
            )
        if node in ran.unreachable:
            raise PermanentError(f"{node} unreachable: {ran.message}")
        if not ran.ok:
            raise PermanentError(ran.message or f"playbook ended {ran.status} (rc {ran.rc})")
        return PlaybookRan(node=node, playbook=str(params.playbook), status=ran.status)
