"""The verbs: what ``reclaim``, ``migrate``, ``downclock``… are, each declared once here.

A ``Verb`` names its params model (frozen pydantic, the validation and messages of its params),
its undo verb (the ``on_clear`` a policy usually pairs it with), the target labels that name
what it acts on, and the built-in executors that implement it. ``VERBS`` holds them by name.

Read by ``gpuops.actions`` (each executor's verbs and its dispatch table:
``gpuops.actions.dispatch``), the rule checks (``gpuops.actions.registry.ExecutorRegistry``,
called by ``gpuops.offline.rulecheck``) and the console, through them. A verb this table does
not know (``release_batch`` on ``webhook``, a third-party executor's own) is free-form: the
executor that declares it takes its params as written (see ``gpuops.actions.base.Executor``).

Params models ignore keys they do not name: a policy's params are recorded and sent as written
(audit documents, the webhook body), and rule files that pass extra keys (``note``) load.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Any, Generic, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic import ValidationInfo as Info
from pydantic_core import PydanticCustomError


class VerbParams(BaseModel):
    """Base of the params models: frozen; keys a model does not name are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True, coerce_numbers_to_str=True)


P = TypeVar("P", bound=VerbParams)


class ParamsError(ValueError):
    """Params a verb does not take; ``problems`` says each, ready for a rule error."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


# --- params ------------------------------------------------------------------------------

_MISSING: Any = object()
"""The default of a required param: its validator says what it needs (pydantic's "Field
required" would not)."""


def _problem(message: str) -> PydanticCustomError:
    # passed as context, so that braces in a value are not read as placeholders
    return PydanticCustomError("verb_params", "{message}", {"message": message})


def _verb(info: Info) -> str:
    return str((info.context or {}).get("verb", "this verb"))


def _whole(value: Any, least: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= least


def _mhz(value: Any, info: Info) -> int | None:
    """A clock in MHz: a whole number above 0 (``min_clock_mhz`` may be null: not set)."""
    name = info.field_name
    if value is _MISSING:
        raise _problem(f"{_verb(info)} needs {name}, a whole number of MHz above 0")
    if value is None and name == "min_clock_mhz":
        return None
    if not _whole(value, 1):
        raise _problem(
            f"{_verb(info)} needs params.{name} as a positive integer (MHz), got {value!r}"
        )
    return int(value)


def _nodes(value: Any, info: Info) -> int:
    if not _whole(value, 1):
        raise _problem(f"{_verb(info)} needs nodes, a whole number above 0")
    return int(value)


class NoParams(VerbParams):
    """A verb that takes no params (its target says what it acts on)."""


class DownclockParams(VerbParams):
    max_clock_mhz: Annotated[int, BeforeValidator(_mhz)] = Field(
        default=_MISSING, validate_default=True
    )
    """The highest graphics clock, MHz (the GPU's clocks are locked at or below it)."""
    min_clock_mhz: Annotated[int | None, BeforeValidator(_mhz)] = None
    """The lowest graphics clock, MHz (``nvml-agent``; the fleet locks the highest only)."""


class ScaleParams(VerbParams):
    nodes: Annotated[int, BeforeValidator(_nodes)] = 1
    """How many nodes to power up (down)."""
    pool: str | None = None
    """The pool (Slurm: partition) when the target has no ``pool`` label."""


class QuotaParams(VerbParams):
    """A quota grant (``gpuops.runtime.quota`` fills these from the request)."""

    grant: str = ""
    """The grant's name when the target has no ``quota_request`` label."""
    pool: str | None = None
    """The pool granted in when the target has no ``pool`` label (default: ``default``)."""
    gpus: int = 0
    duration_s: float | None = None


class ClassParams(VerbParams):
    priority_class: str = ""
    """The priority class when the target has no ``priority_class`` label."""


# --- the table ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Verb(Generic[P]):
    """What one verb is. ``parse`` turns a policy's params (as written) into its model."""

    name: str
    params: type[P]
    summary: str
    labels: tuple[str, ...] = ()
    """Target labels that name what it acts on (some executors also take the name from the
    params or find it another way: Slurm finds the job holding a GPU, or reads ``job``)."""
    undo: str | None = None
    """The verb that undoes it (the ``on_clear`` of a policy that acts with it)."""
    executors: frozenset[str] = frozenset()
    """The built-in executors that implement it (the logical ``scheduler`` and
    ``gpu-control`` do through the executor they map it to)."""

    def parse(self, params: Mapping[str, Any]) -> P:
        """``params`` as this verb's model; ``ParamsError`` says what is wrong."""
        try:
            return self.params.model_validate(dict(params), context={"verb": self.name})
        except ValidationError as exc:
            raise ParamsError(self._problems(exc)) from None

    def check(self, params: Mapping[str, Any]) -> list[str]:
        """What ``parse`` would refuse in ``params`` (empty: nothing)."""
        try:
            self.parse(params)
        except ParamsError as exc:
            return exc.problems
        return []

    def _problems(self, exc: ValidationError) -> list[str]:
        problems = []
        for err in exc.errors():
            if err["type"] == "verb_params":
                problems.append(err["msg"])
            else:
                where = ".".join(str(p) for p in err["loc"]) or "(top)"
                problems.append(f"{self.name} params: {where}: {err['msg']}")
        return problems


FLEET, SLURM, NVML_AGENT = "fleet", "slurm", "nvml-agent"

RECLAIM = Verb(
    "reclaim",
    NoParams,
    "Take an idle GPU back from its job (Slurm: requeue or cancel the job, after a notify).",
    labels=("uuid",),
    executors=frozenset({FLEET, SLURM}),
)
PACK = Verb(
    "pack",
    NoParams,
    "Move a GPU's workload onto a shared GPU so that this one frees up.",
    labels=("uuid",),
    executors=frozenset({FLEET}),
)
CONSOLIDATE = Verb(
    "consolidate",
    NoParams,
    "Move a node's jobs onto other nodes so that the node empties.",
    labels=("node",),
    executors=frozenset({FLEET}),
)
MIGRATE = Verb(
    "migrate",
    NoParams,
    "Drain a node and move (requeue) its running jobs elsewhere.",
    labels=("node",),
    undo="resume",
    executors=frozenset({FLEET, SLURM}),
)
RESUME = Verb(
    "resume",
    NoParams,
    "Give a node gpuops drained back to the scheduler (never one someone else drained).",
    labels=("node",),
    executors=frozenset({SLURM}),
)
NOTIFY = Verb(
    "notify",
    NoParams,
    "Warn the job holding a GPU (its stderr; marked in its AdminComment) before a reclaim.",
    labels=("node", "uuid"),
    executors=frozenset({SLURM}),
)
DOWNCLOCK = Verb(
    "downclock",
    DownclockParams,
    "Lock a GPU's clocks at or below params.max_clock_mhz.",
    labels=("uuid",),
    undo="restore_clocks",
    executors=frozenset({FLEET, NVML_AGENT}),
)
RESTORE_CLOCKS = Verb(
    "restore_clocks",
    NoParams,
    "Give a GPU's clocks back to the driver.",
    labels=("uuid",),
    executors=frozenset({FLEET, NVML_AGENT}),
)
SCALE_OUT = Verb(
    "scale_out",
    ScaleParams,
    "Power up params.nodes nodes of a pool (Slurm: powered-down CLOUD nodes).",
    labels=("pool",),
    undo="scale_in",
    executors=frozenset({FLEET, SLURM}),
)
SCALE_IN = Verb(
    "scale_in",
    ScaleParams,
    "Power down params.nodes idle nodes of a pool (the fleet: the target's node, if named).",
    labels=("pool",),
    executors=frozenset({FLEET, SLURM}),
)
GRANT_QUOTA = Verb(
    "grant_quota",
    QuotaParams,
    "Grant a project GPUs for a while (an approved quota request).",
    labels=("project", "quota_request"),
    undo="release_quota",
    executors=frozenset({FLEET}),
)
RELEASE_QUOTA = Verb(
    "release_quota",
    QuotaParams,
    "End a quota grant.",
    labels=("project", "quota_request"),
    executors=frozenset({FLEET}),
)
HOLD_CLASS = Verb(
    "hold_class",
    ClassParams,
    "Hold the pending jobs of a priority class (they do not start while held).",
    labels=("priority_class",),
    undo="release_class",
    executors=frozenset({FLEET}),
)
RELEASE_CLASS = Verb(
    "release_class",
    ClassParams,
    "Let the jobs of a held priority class start again.",
    labels=("priority_class",),
    executors=frozenset({FLEET}),
)
LEND = Verb(
    "lend",
    NoParams,
    "Lend a pool's idle GPUs to the other pools.",
    labels=("pool",),
    undo="unlend",
    executors=frozenset({FLEET}),
)
UNLEND = Verb(
    "unlend",
    NoParams,
    "Take a pool's lent GPUs back.",
    labels=("pool",),
    executors=frozenset({FLEET}),
)


def _table(verbs: Iterable[Verb[Any]]) -> Mapping[str, Verb[Any]]:
    table: dict[str, Verb[Any]] = {}
    for verb in verbs:
        if verb.name in table:
            raise ValueError(f"verb {verb.name!r} is declared twice")
        table[verb.name] = verb
    for verb in table.values():
        if verb.undo is not None and verb.undo not in table:
            raise ValueError(f"verb {verb.name!r}: its undo {verb.undo!r} is no verb")
    return MappingProxyType(table)


VERBS: Mapping[str, Verb[Any]] = _table(
    (
        RECLAIM,
        PACK,
        CONSOLIDATE,
        MIGRATE,
        RESUME,
        NOTIFY,
        DOWNCLOCK,
        RESTORE_CLOCKS,
        SCALE_OUT,
        SCALE_IN,
        GRANT_QUOTA,
        RELEASE_QUOTA,
        HOLD_CLASS,
        RELEASE_CLASS,
        LEND,
        UNLEND,
    )
)
"""Every verb by name."""


def implemented_by(executor: str) -> frozenset[str]:
    """The verbs the built-in executor ``executor`` implements, by the table."""
    return frozenset(v.name for v in VERBS.values() if executor in v.executors)
