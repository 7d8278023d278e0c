"""The verbs: what ``reclaim``, ``migrate``, ``downclock``… are, each declared once here.

A ``Verb`` names its params model (frozen pydantic, the validation and messages of its params),
its undo verb (the ``on_clear`` a policy usually pairs it with), the target labels that name
what it acts on, the built-in executors that implement it and those of them whose params the
rule checks refuse before any decision. ``VERBS`` holds them by name.

Read by ``gpuops.actions`` (each executor's verbs and its dispatch table:
``gpuops.actions.dispatch``), the rule checks (``gpuops.actions.registry.ExecutorRegistry``,
called by ``gpuops.offline.rulecheck``) and the console, through them. A verb this table does
not know (``release_batch`` on ``webhook``, a third-party executor's own) is free-form: the
executor that declares it takes its params as written (see ``gpuops.actions.base.Executor``).

A params model takes what the executors always took: a number is ``int()`` (``float()``) of what
was given (``"2"`` and ``2.0`` are 2 nodes), a name is ``str()`` of it (null: not given), and a
verb several executors implement takes what the most lenient of them took. Its few
executor-specific rules are the executor's (``parse(params, executor)``): the fleet does not
read ``min_clock_mhz``, the node agent (``nvml-agent``) takes clocks above 0 only, Slurm powers
at least 1 node. Keys a model does not name are ignored: a policy's params are recorded and sent
as written (audit documents, the webhook body), and rule files that pass extra keys (``note``)
load.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Any, Generic, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic import ValidationInfo as Info
from pydantic_core import PydanticCustomError

FLEET, SLURM, NVML_AGENT, KUBERNETES = "fleet", "slurm", "nvml-agent", "kubernetes"
"""The built-in executors of the table's verbs (``gpuops.actions.fleet``, ``slurm``,
``nvml_agent``, ``kubernetes``)."""


class VerbParams(BaseModel):
    """Base of the params models: frozen; keys a model does not name are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


P = TypeVar("P", bound=VerbParams)


class ParamsError(ValueError):
    """Params a verb does not take; ``problems`` says each, ready for a rule error."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


# --- params ------------------------------------------------------------------------------


def _problem(message: str) -> PydanticCustomError:
    # passed as context, so that braces in a value are not read as placeholders
    return PydanticCustomError("verb_params", "{message}", {"message": message})


def _verb(info: Info) -> str:
    return str((info.context or {}).get("verb", "this verb"))


def _executor(info: Info) -> str:
    """The executor that parses (``Verb.parse``); ``""``: none named."""
    return str((info.context or {}).get("executor") or "")


def _int(value: Any) -> int | None:
    """``int()`` of ``value`` (``"2"``, ``2.0``, ``2.5``: 2), or None where ``int()`` fails."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _name(value: Any) -> str:
    """A name as text: ``str()`` of what was given; null is not given (``""``)."""
    return "" if value is None else str(value)


def _text(value: Any) -> str | None:
    """``str()`` of what was given; null stays null (the default)."""
    return None if value is None else str(value)


def _mhz(value: Any, info: Info) -> int | None:
    """A clock in MHz, ``int()`` of what was given (``min_clock_mhz`` may be null: not set)."""
    name, executor = info.field_name, _executor(info)
    if name == "min_clock_mhz" and (value is None or executor == FLEET):
        return None  # the fleet locks the highest clock only: it neither reads nor checks this
    mhz = _int(value)
    if mhz is None or (mhz <= 0 and executor == NVML_AGENT):
        raise _problem(
            f"{_verb(info)} needs params.{name} as a positive integer (MHz), got {value!r}"
        )
    return mhz


def _nodes(value: Any, info: Info) -> int:
    nodes = _int(value)
    if nodes is None:
        raise _problem(f"params.nodes must be a number, not {value!r}")
    if nodes < 1 and _executor(info) in (SLURM, KUBERNETES):
        raise _problem(f"params.nodes must be at least 1, not {nodes}")
    return nodes


def _gpus(value: Any) -> int:
    gpus = _int(value)
    if gpus is None:
        raise _problem(f"params.gpus must be a number, not {value!r}")
    return gpus


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise _problem(f"params.duration_s must be a number, not {value!r}") from None


class NoParams(VerbParams):
    """A verb that takes no params (its target says what it acts on)."""


class DownclockParams(VerbParams):
    max_clock_mhz: Annotated[int, BeforeValidator(_mhz)] = Field(
        default=None, validate_default=True
    )
    """The highest graphics clock, MHz (the GPU's clocks are locked at or below it)."""
    min_clock_mhz: Annotated[int | None, BeforeValidator(_mhz)] = None
    """The lowest graphics clock, MHz (``nvml-agent``; the fleet locks the highest only)."""


class RebootParams(VerbParams):
    timeout_s: float | None = Field(default=None, gt=0)
    """Seconds the node may take to reboot and register again (default: the executor's
    ``reboot_timeout_s``, Slurm's or the node agent's)."""


class ScaleParams(VerbParams):
    nodes: Annotated[int, BeforeValidator(_nodes)] = 1
    """How many nodes to power up (down)."""
    pool: Annotated[str | None, BeforeValidator(_text)] = None
    """The pool (Slurm: partition) when the target has no ``pool`` label."""


class QuotaParams(VerbParams):
    """A quota grant (``gpuops.runtime.quota`` fills these from the request)."""

    grant: Annotated[str, BeforeValidator(_name)] = ""
    """The grant's name when the target has no ``quota_request`` label."""
    pool: Annotated[str | None, BeforeValidator(_text)] = None
    """The pool granted in when the target has no ``pool`` label (default: ``default``)."""
    gpus: Annotated[int, BeforeValidator(_gpus)] = 0
    duration_s: Annotated[float | None, BeforeValidator(_seconds)] = None


class QuotaReleaseParams(VerbParams):
    """The end of a quota grant: its name only (what else a policy passes is not read)."""

    grant: Annotated[str, BeforeValidator(_name)] = ""
    """The grant's name when the target has no ``quota_request`` label."""


class ClassParams(VerbParams):
    priority_class: Annotated[str, BeforeValidator(_name)] = ""
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
    checked: frozenset[str] = frozenset()
    """Those of ``executors`` whose params the rule checks (``gpuops rules check``, every
    reload) refuse before any decision, as ``parse`` for that executor would. The params of
    the others (and of the logical executors, and of a third-party executor without a
    ``check_params`` of its own) are refused when the action runs: its outcome says why."""

    def parse(self, params: Mapping[str, Any], executor: str = "") -> P:
        """``params`` as this verb's model, as ``executor`` (one of ``executors``; ``""``: no
        executor's own rules) takes them; ``ParamsError`` says what is wrong."""
        try:
            return self.params.model_validate(
                dict(params), context={"verb": self.name, "executor": executor}
            )
        except ValidationError as exc:
            raise ParamsError(self._problems(exc)) from None

    def check(self, params: Mapping[str, Any], executor: str = "") -> list[str]:
        """What ``parse`` would refuse in ``params`` (empty: nothing)."""
        try:
            self.parse(params, executor)
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


RECLAIM = Verb(
    "reclaim",
    NoParams,
    "Take an idle GPU back from its job (Slurm: requeue or cancel the job, after a notify).",
    labels=("uuid",),
    executors=frozenset({FLEET, SLURM, KUBERNETES}),
)
RESTORE_WORKLOAD = Verb(
    "restore_workload",
    NoParams,
    "Give back what reclaim took on Kubernetes (previous replicas, Job resumed, Workload "
    "reactivated), only while its marks say gpuops took it in this episode.",
    labels=("namespace", "pod"),
    executors=frozenset({KUBERNETES}),
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
    executors=frozenset({FLEET, SLURM, KUBERNETES}),
)
RESUME = Verb(
    "resume",
    NoParams,
    "Give a node gpuops drained back to the scheduler (never one someone else drained).",
    labels=("node",),
    executors=frozenset({FLEET, SLURM, KUBERNETES}),
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
    checked=frozenset({FLEET, NVML_AGENT}),
)
RESTORE_CLOCKS = Verb(
    "restore_clocks",
    NoParams,
    "Give a GPU's clocks back to the driver.",
    labels=("uuid",),
    executors=frozenset({FLEET, NVML_AGENT}),
)
RESET_GPU = Verb(
    "reset_gpu",
    NoParams,
    "Reset a GPU (the node agent: nvidia-smi --gpu-reset): a remediation step.",
    labels=("uuid",),
    executors=frozenset({FLEET, NVML_AGENT}),
)
VALIDATE = Verb(
    "validate",
    NoParams,
    "Check a GPU's health before its node returns (the node agent: NVML's view of it).",
    labels=("uuid",),
    executors=frozenset({FLEET, NVML_AGENT}),
)
REBOOT = Verb(
    "reboot",
    RebootParams,
    "Reboot a node gpuops drained, keeping it drained (Slurm: scontrol reboot; the node agent:"
    " its reboot command, once per decision id).",
    labels=("node",),
    executors=frozenset({FLEET, SLURM, NVML_AGENT}),
)
SCALE_OUT = Verb(
    "scale_out",
    ScaleParams,
    "Power up params.nodes nodes of a pool (Slurm: powered-down CLOUD nodes).",
    labels=("pool",),
    undo="scale_in",
    executors=frozenset({FLEET, SLURM, KUBERNETES}),
    checked=frozenset({FLEET}),
)
SCALE_IN = Verb(
    "scale_in",
    ScaleParams,
    "Power down params.nodes idle nodes of a pool (the fleet: the target's node, if named).",
    labels=("pool",),
    executors=frozenset({FLEET, SLURM, KUBERNETES}),
    checked=frozenset({FLEET}),
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
    QuotaReleaseParams,
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
        if not verb.checked <= verb.executors:
            raise ValueError(f"verb {verb.name!r}: checked for executors that do not implement it")
        if verb.undo is not None and verb.undo not in table:
            raise ValueError(f"verb {verb.name!r}: its undo {verb.undo!r} is no verb")
    return MappingProxyType(table)


VERBS: Mapping[str, Verb[Any]] = _table(
    (
        RECLAIM,
        RESTORE_WORKLOAD,
        PACK,
        CONSOLIDATE,
        MIGRATE,
        RESUME,
        NOTIFY,
        DOWNCLOCK,
        RESTORE_CLOCKS,
        RESET_GPU,
        VALIDATE,
        REBOOT,
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
