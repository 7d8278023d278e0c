"""The engine's configuration file (``gpuops engine run --config FILE``), validated at the edge.

Read by ``gpuops.cli`` and handed to ``gpuops.runtime`` as frozen settings. Relative paths are
resolved against the config file's directory. Secrets (tokens, passwords) may be given as
``*_file`` paths or environment variables and never appear in logs.
"""

from __future__ import annotations

import re
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpuops.actions.registry import LOGICAL_DEFAULTS
from gpuops.audit.settings import AuditSettings, FullPolicy
from gpuops.model.evaluation.step import Freshness
from gpuops.model.health.catalogue_file import load_catalogue
from gpuops.model.health.events import FAULT_LABELS, TARGET_LABELS
from gpuops.model.rules.durations import parse_duration
from gpuops.model.rules.model import RulesError
from gpuops.model.rules.yamlsource import parse_yaml
from gpuops.model.verbs import VERBS
from gpuops.sources.errors import QueryError
from gpuops.sources.promql import input_selectors


class ConfigError(Exception):
    """The config file cannot be used; the message names the file and the key."""


class _Model(BaseModel):
    # Attribute docstrings become the fields' descriptions: `gpuops reference config` prints
    # them as docs/configuration.md.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    return parse_duration(str(value))


class PrometheusSettings(_Model):
    """Where the rules' queries go, and how fresh their answers must be to act on
    (docs/policies.md, "Fresh data")."""

    url: str = "http://127.0.0.1:9090"
    """Base URL of a server speaking the Prometheus HTTP API."""
    timeout: float = 10.0
    """Seconds before a query counts as failed (a skipped evaluation, never an action)."""
    scrape_interval: float = Field(default=15.0, gt=0)
    """Seconds between the scrapes of the metrics the rules read (Prometheus' scrape_interval
    for those jobs); the default bounds of freshness derive from it."""
    max_sample_age: float | None = Field(default=None, gt=0)
    """Seconds: an input series with no sample newer than this is stale, and the targets it
    belongs to are held as on a failed query (docs/policies.md, "Fresh data"). None: 2 x
    scrape_interval, i.e. one missed scrape tolerated; a restarted Prometheus serving its old
    samples, or a dead exporter's samples inside a range window, are refused."""
    max_pending_gap: float | None = Field(default=None, gt=0)
    """Seconds: a stretch of failed or stale evaluations longer than this (from the first to the
    next fresh one) starts a pending `for` again; an outage does not count towards `for`.
    None: 2 x the group's interval, i.e. up to two failed evaluations in a row keep the timer,
    three reset it."""

    _t = field_validator(
        "timeout", "scrape_interval", "max_sample_age", "max_pending_gap", mode="before"
    )(_seconds)

    @property
    def sample_age_bound(self) -> float:
        """Seconds: ``max_sample_age``, or its default, 2 x ``scrape_interval``."""
        return self.max_sample_age or 2 * self.scrape_interval

    def freshness(self, interval_s: float, max_sample_age_s: float | None = None) -> Freshness:
        """The freshness bounds for a group evaluated every ``interval_s`` seconds (with its
        own ``max_sample_age``, if it has one)."""
        return Freshness(
            max_sample_age_s=max_sample_age_s or self.sample_age_bound,
            max_gap_s=self.max_pending_gap or 2 * interval_s,
        )


class AuditConfig(_Model):
    """The audit trail: every decision, outcome and user operation as an ECS document, written
    (fsync'd) to a local spool before any action runs, then shipped to Elasticsearch when
    ``elasticsearch_url`` is set (docs/reference/audit.md)."""

    spool_dir: Path = Path("var/audit")
    """Local spool of ECS documents; the audit store itself when Elasticsearch is not set.
    One spool per engine replica, never shared."""
    elasticsearch_url: str | None = None
    """``http(s)://host:9200`` to ship the spool to (data streams ``logs-gpuops.decision-default``
    and ``logs-gpuops.audit-default``; ``gpuops elk install`` makes their templates); None: no
    shipping, the spool is the audit store and ``gpuops audit search --spool-dir`` reads it."""
    max_spool_bytes: int = Field(default=AuditSettings.max_spool_bytes, ge=1024 * 1024)
    """Upper bound of the spool on disk, in bytes (at least 1 MiB; default 280 MiB, about
    210,000 decision documents): what an Elasticsearch outage can leave waiting. The spool is
    made of 4 MiB segments and ``drop_oldest`` deletes whole ones, so give it several (16 MiB
    and more): with a limit of a segment or two one overflow deletes most of the spool."""
    full_policy: FullPolicy = AuditSettings.full_policy
    """What a full spool does: ``fail_closed`` (default: nothing spooled is deleted, new
    documents are refused, so no action runs and ``/healthz`` answers 503 until the shipper
    made room) or ``drop_oldest`` (delete the oldest segments, shipped or not: retention before
    audit). Either way the loss is logged at ERROR and counted in
    ``gpuops_audit_dropped_documents_total{policy}``."""

    def settings(self) -> AuditSettings:
        """The audit log's settings from this section (the rest at their defaults)."""
        return AuditSettings(
            spool_dir=self.spool_dir,
            elasticsearch_url=self.elasticsearch_url,
            max_spool_bytes=self.max_spool_bytes,
            full_policy=self.full_policy,
        )


class GuardrailSettings(_Model):
    """Engine-wide limits and switches, over each policy's own ``cooldown`` and ``limits``
    (docs/policies.md, "Verdicts")."""

    global_max_per_hour: int | None = Field(default=None, ge=0)
    """Executed actions per hour across all policies; None: no global budget."""
    dry_run: bool = False
    """Engine-wide dry-run: decisions are recorded, nothing is executed."""
    kill_switch_file: Path | None = None
    """While this file exists, no action runs (every decision is audited as suppressed)."""
    approval_ttl: float = 3600.0
    """Seconds a pending approval waits before it expires."""
    action_max_age: float = Field(default=3600.0, gt=0)
    """Seconds after its decision (or its grant) that an action may still start: one older
    (the engine was down, the spool full, the executor's queue long) does not run but is
    audited as ``suppressed:expired`` and its target decided again on fresh data. An hour:
    longer than any queue or restart should take, shorter than the data it acted on stays
    true."""

    _t = field_validator("approval_ttl", "action_max_age", mode="before")(_seconds)


class QuotaSettings(_Model):
    """Elastic quota requests (``/api/v1/quota-requests``): how an approved request is applied."""

    executor: str = "log"
    """Executor that applies and undoes a request (``log`` records only; ``fleet`` scales)."""
    grant_action: str = "scale_out"
    """Verb run when a request is approved."""
    undo_action: str = "scale_in"
    """Verb run when an approved request ends (its duration is over)."""
    gpus_per_node: int = Field(default=8, ge=1)
    """GPUs one node adds: ``nodes = ceil(gpus / gpus_per_node)`` is passed to the executor."""
    pool: str = "default"
    """Pool the nodes are added to (the ``pool`` target label)."""
    max_gpus: int = Field(default=64, ge=1)
    """Largest request accepted (GPUs)."""
    max_duration: float = 7 * 24 * 3600.0
    """Longest request accepted (seconds; Prometheus durations allowed: ``7d``)."""
    check_interval: float = 10.0
    """Seconds between checks for requests that ended or whose approval window passed."""
    projects: dict[str, int] = Field(default_factory=dict)
    """Projects that may ask for GPUs, each with the GPUs it has without a request (its base
    quota): ``{ml-research: 32, inference: 0}``. Empty: any project name is accepted and its
    base quota is unknown."""
    usage_query: str | None = "sum by (project) (gpuops_project_gpus_allocated)"
    """PromQL giving the GPUs each project's jobs hold now, one series per ``project`` label,
    shown on the quota page; None: usage is not shown."""
    self_approval: bool = False
    """Whether an admin may approve a quota request they filed themselves (False: another
    admin must approve it; denying one's own request is always allowed)."""

    _t = field_validator("max_duration", "check_interval", mode="before")(_seconds)

    @field_validator("projects")
    @classmethod
    def _base_quotas(cls, value: dict[str, int]) -> dict[str, int]:
        negative = [name for name, gpus in value.items() if gpus < 0]
        if negative:
            raise ValueError(f"projects {', '.join(negative)}: a base quota is 0 GPUs or more")
        return value


class ConsoleSettings(_Model):
    """The web console (``gpuops.api.console``), served by the API process under ``/``."""

    enabled: bool = True
    """Serve the console pages; False: only the API (and its docs) answer."""
    session_ttl: float = 8 * 3600.0
    """Seconds a console session lasts after sign-in (Prometheus durations allowed: ``8h``)."""
    grafana_url: str | None = None
    """Base URL of Grafana, for the dashboard link of a decision's target; None: no link."""
    kibana_url: str | None = None
    """Base URL of Kibana, for the audit search link of a decision's target; None: no link."""
    sign_in_failures: int = Field(default=10, ge=1)
    """Failed sign-ins from one source IP within ``sign_in_window`` after which sign-in from
    that address is refused (429, audited) until the window has passed."""
    sign_in_window: float = 60.0
    """Seconds (or a duration: ``1m``) over which failed sign-ins are counted."""

    _t = field_validator("session_ttl", "sign_in_window", mode="before")(_seconds)

    @field_validator("session_ttl", "sign_in_window")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be a positive duration, e.g. 8h")
        return value


class ApiSettings(_Model):
    """The REST API (``gpuops.api``): served by ``gpuops engine run`` when ``listen`` is set."""

    listen: str | None = None
    """host:port to serve the API on (``127.0.0.1:9843``); None: no API."""
    tls_cert_file: Path | None = None
    """PEM certificate (chain); with ``tls_key_file`` the API speaks HTTPS only."""
    tls_key_file: Path | None = None
    """PEM private key of ``tls_cert_file``."""
    tokens_file: Path | None = None
    """YAML ``users: [{name, roles, token_sha256}]``; watched (a change is read before the next
    request), and re-read on SIGHUP and POST /auth/reload."""
    tokens_env: str = "GPUOPS_API_TOKENS"
    """Environment variable holding the same YAML (used when set; merged with the file)."""
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    """Largest request body accepted; larger ones get 413."""
    alertmanager_max_body_bytes: int = Field(default=8 * 1_048_576, ge=1024)
    """Largest Alertmanager notification accepted (``POST /api/v1/alertmanager``): the one
    limit on a group's size (its alerts are not counted apart). A realistic alert is ~670
    bytes, so 8 MiB holds ~12,500 alerts. Alertmanager does not retry a 413 (only 5xx): size
    this above the largest group it may send (docs/api.md)."""
    alert_queue_size: int = Field(default=10_000, ge=1)
    """Alertmanager alerts waiting for the worker. A notification with no room behind those
    waiting is answered 503 (Alertmanager retries it); one larger than this is taken whole
    once none waits, so a group is never refused for its size alone."""
    quota: QuotaSettings = QuotaSettings()
    """Elastic quota requests: how an approved request is applied and undone."""
    console: ConsoleSettings = ConsoleSettings()
    """The web console served under ``/`` on the API's address (docs/console.md)."""

    @model_validator(mode="after")
    def _tls_pair(self) -> ApiSettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("set both tls_cert_file and tls_key_file, or neither")
        return self


class LogSettings(_Model):
    """What ``gpuops engine run`` writes to stderr about what it decides and does
    (docs/operations.md, "What the engine says")."""

    format: Literal["text", "json"] = "text"
    """``text``: one sentence per line; ``json``: one JSON object per line (ECS field names,
    each decision line with its fields: ``rule.name``, ``gpuops.target.key``,
    ``event.action``, ``gpuops.verdict``, ``gpuops.state``, ``gpuops.decision.id`` ...).
    ``gpuops engine run --log-format`` overrides it."""
    quiet_level: Literal["debug", "info", "warning"] = "debug"
    """Level of the lines about evaluations that changed nothing (a target held again by the
    suppression recorded before, a clear with nothing to undo): at the default ``debug`` they
    are not shown unless ``gpuops --log-level debug``; ``info`` shows them."""


class StateSettings(_Model):
    """Shared state for replicas (docs/ha.md): without ``url`` the engine keeps its state in
    the SQLite ``state_file`` and runs alone; with it, in PostgreSQL, and replicas elect one
    leader through a lease row there."""

    url: str | None = None
    """``postgresql://USER@HOST:PORT/DATABASE`` (no password: see the next two keys)."""
    password_file: Path | None = None
    """A file holding the database password (a Docker or Kubernetes secret)."""
    password_env: str | None = None
    """An environment variable holding it (used when ``password_file`` is not set); with
    neither, libpq's own ``PGPASSWORD`` or ``~/.pgpass`` apply."""
    replica: str | None = None
    """This replica's name in the lease and the audit (unique per replica); default: the
    host name."""
    advertise_url: str | None = None
    """This replica's API URL, which a standby names when it refuses a write."""
    lease: float = 10.0
    """Seconds a lease lasts without renewal: a killed leader is replaced after at most this
    plus ``renew_interval``."""
    renew_interval: float = 2.0
    """Seconds between renewals (leader) and attempts to take the lease (standby)."""

    _d = field_validator("lease", "renew_interval", mode="before")(_seconds)

    @field_validator("url")
    @classmethod
    def _postgres_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        scheme, _, rest = value.partition("://")
        if scheme not in ("postgresql", "postgres") or not rest:
            raise ValueError("must be a postgresql://USER@HOST:PORT/DATABASE URL")
        credentials = rest.split("@", 1)[0] if "@" in rest else ""
        if ":" in credentials:
            raise ValueError(
                "holds a password: put it in state.password_file or the environment variable"
                " named by state.password_env, not in the URL"
            )
        return value

    @model_validator(mode="after")
    def _timing(self) -> StateSettings:
        if self.lease <= 0 or self.renew_interval <= 0:
            raise ValueError("lease and renew_interval must be positive durations")
        if self.renew_interval * 3 > self.lease:
            raise ValueError(
                f"renew_interval ({self.renew_interval:g}s) must be at most a third of the"
                f" lease ({self.lease:g}s): a leader renews a few times before it may lapse"
            )
        return self


Profile = Literal["observe", "quarantine", "full"]
"""What a faulty GPU does in a pool: observe (a dry run), quarantine, or quarantine and
climb the remediation ladder."""


class LadderAction(_Model):
    """An action the remediation ladder runs through the gate: its executor and params."""

    executor: str = ""
    """An executor's name (``executors``; the logical ``scheduler`` maps to Slurm's); empty:
    the step's own (``reset_gpu``: ``nvml-agent``, ``reboot``: ``scheduler``, ``webhook``:
    ``webhook``)."""
    params: dict[str, Any] = {}
    """The action's params, as a policy's (``{{ $labels.node }}``, ``{{ $labels.uuid }}``
    are the node's and the faulty GPU's)."""


class ValidationSettings(_Model):
    """The health check a remediated node passes before it returns to service."""

    command: list[str] = Field(
        default=["dcgmi", "diag", "--host", "{{ $labels.node }}", "-r", "1"], min_length=1
    )
    """Program and arguments (each a template, one argument whatever a label holds); exit 0
    passes. The default runs DCGM's quick diagnostic against the node's host engine."""
    timeout: float = Field(default=300.0, gt=0)
    """Seconds the check may run: a check still running then is killed (its process group)
    and counts as failed."""
    executor: str = Field(default="command", min_length=1)
    """The executor that checks: ``command`` runs ``command`` on the engine's host;
    ``nvml-agent`` asks the node agent instead, which checks the faulty GPU by NVML (lost, a
    row remapping pending or failed, uncorrected ECC errors since the driver loaded) — for
    nodes without DCGM."""

    _t = field_validator("timeout", mode="before")(_seconds)


_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


_TEMPLATED = re.compile(r"\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}|\$labels\.([A-Za-z_][A-Za-z0-9_]*)")


def _labels_read(settings: Any, where: str) -> list[tuple[str, str]]:
    """The target labels an executor's settings read, each with where: a template's
    ``{name}`` or ``$labels.name``, the value of a key ending in ``label``."""
    found: list[tuple[str, str]] = []
    if isinstance(settings, BaseModel):
        return _labels_read(settings.model_dump(), where)
    if isinstance(settings, dict):
        for key, value in settings.items():
            if str(key).endswith("label") and isinstance(value, str):
                found.append((f"{where}.{key}", value))
            found += _labels_read(value, f"{where}.{key}")
    elif isinstance(settings, list):
        for index, value in enumerate(settings):
            found += _labels_read(value, f"{where}[{index}]")
    elif isinstance(settings, str):
        found += [(where, a or b) for a, b in _TEMPLATED.findall(settings)]
    return found


class PacingSettings(_Model):
    """Paced repair: per failure domain (the node's pool, rack, zone, ...), how many unproven
    repairs run at once — a width that starts at 1, grows by one for each repair that stays
    healthy for ``dwell`` (so it doubles each time all the repairs it let run hold: 1, 2, 4,
    ...) and drops to 1 after a failed repair, which also starts a cooldown — and how many of
    a domain's nodes may be out of service (docs/health.md, "Paced repair")."""

    domains: list[str] = Field(default=["pool"], min_length=1)
    """The failure domains a node belongs to, by label: ``pool`` (the pool its agent sends),
    ``policy`` (the policy that quarantined it) or a label its agent sends (``--label
    rack=r12``: ``[pool, rack]``). A repair starts only when every domain of its node has
    room; a node without the label is in the domain ``<label>=default``. Only the labels
    named here are kept of those an agent sends, at most 256 values of each; never a label
    the ``GpuFault`` alert sets itself or one an executor reads (``pod``, ``namespace``,
    ``instance``, ...; a name an executor's template or ``*label`` setting reads)."""
    max_fraction: float | None = Field(default=None, gt=0, le=1)
    """The fraction of a domain's nodes that may be out of service for any reason (drained,
    down, by anyone) with a repair starting in it: past it, the domain's repairs wait until
    nodes come back. Rounded down and never zero: one node of any domain may be out. Needs
    ``unavailable``; the ``policy`` domain has no nodes of its own and is not bounded. None:
    no bound."""
    unavailable: str | None = None
    """PromQL giving every node of the fleet once: label ``node`` and the domain labels,
    value 1 when it is out of service, 0 when it is not (the scheduler's view, e.g. the
    Slurm exporter's ``gpuops_slurm_node_state``; docs/health.md). Asked before a repair
    starts in a bounded domain; a failed answer, or one whose input series are older than
    ``max_sample_age``, or one without the domain's nodes holds the repair."""
    max_sample_age: float = Field(default=120.0, gt=0)
    """How old the newest sample of each series ``unavailable`` reads may be (a duration)."""

    dwell: float = Field(default=300.0, gt=0)
    """How long a returned node stays healthy before its repair counts as proven."""
    cooldown: float = Field(default=60.0, gt=0)
    """The wait after a failed repair before the domain's next one (never zero), doubled for
    each failure in a row up to ``max_cooldown``."""
    max_cooldown: float = Field(default=600.0, gt=0)
    """The longest cooldown, however many repairs failed in a row."""
    jitter: float = Field(default=0.2, ge=0, lt=1)
    """A cooldown is drawn within ± this fraction of itself, so domains that failed together
    do not start again together."""

    _t = field_validator("dwell", "cooldown", "max_cooldown", "max_sample_age", mode="before")(
        _seconds
    )

    @field_validator("domains", mode="after")
    @classmethod
    def _labels(cls, value: list[str]) -> list[str]:
        bad = [n for n in value if not _LABEL.fullmatch(n)]
        if bad:
            raise ValueError(f"not a label name: {', '.join(map(repr, bad))}")
        taken = [n for n in value if n in (FAULT_LABELS - {"pool"}) | TARGET_LABELS]
        if taken:
            raise ValueError(
                f"{', '.join(taken)}: a failure domain is a label the node agent sends, never "
                "one the GpuFault alert sets itself or an executor reads to choose what it acts "
                f"on ({', '.join(sorted((FAULT_LABELS - {'pool'}) | TARGET_LABELS))})"
            )
        twice = sorted({n for n in value if value.count(n) > 1})
        if twice:
            raise ValueError(f"a domain is named twice: {', '.join(twice)}")
        return value

    @field_validator("unavailable", mode="after")
    @classmethod
    def _promql(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                input_selectors(value)
            except QueryError as exc:
                raise ValueError(f"not PromQL: {exc.__cause__ or exc}") from exc
        return value

    @model_validator(mode="after")
    def _bounds(self) -> PacingSettings:
        if self.cooldown > self.max_cooldown:
            raise ValueError(
                f"cooldown ({self.cooldown:g}s) is above max_cooldown ({self.max_cooldown:g}s)"
            )
        if self.max_fraction is not None and self.unavailable is None:
            raise ValueError(
                "max_fraction needs unavailable (the PromQL that tells which nodes are out"
                " of service)"
            )
        return self


class LadderSettings(_Model):
    """The remediation ladder of pools whose profile is ``full`` (docs/health.md,
    "Remediation")."""

    steps: list[Literal["reset_gpu", "reboot"]] = Field(
        default=["reset_gpu", "reboot"], min_length=1
    )
    """The remediation steps, tried in this order until the health check passes (a fault
    that calls for a reboot skips ``reset_gpu``; after a reboot no reset is done)."""
    reset_gpu: LadderAction = LadderAction()
    """How the faulty GPU is reset. Default: ``{executor: nvml-agent}``, the node agent on the
    node (``nvidia-smi --gpu-reset``; ``executors.nvml-agent`` says where it listens). A site
    without the agent runs a command, e.g. ``{executor: command, params: {argv: [ssh, "{{
    $labels.node }}", nvidia-smi, --gpu-reset, -i, "{{ $labels.uuid }}"]}}``."""
    reboot: LadderAction = LadderAction()
    """How the node is rebooted. Default: ``{executor: scheduler}``, the scheduler's
    ``reboot`` (Slurm's ``scontrol reboot``, the node kept drained; docs/executors.md). On
    Kubernetes: ``{executor: nvml-agent}``, the node agent's reboot (``gpuops exporter nvml
    --agent --agent-reboot``), the rest of the node drained first by the executor that
    quarantined it."""
    validation: ValidationSettings = ValidationSettings()
    """The health check before a node returns to service."""
    max_remediations: int = Field(default=1, ge=1)
    """Remediations of one node within ``window`` after which its next fault goes to a human
    instead (1: a second remediation within the window is a human's)."""
    window: float = Field(default=7 * 86400.0, gt=0)
    """The window of ``max_remediations`` (a duration: ``7d``)."""
    webhook: LadderAction | None = None
    """Told when a node needs a human (``{params: {url: https://...}}``: the ``webhook``
    executor); None: the log and the audit only."""
    pacing: PacingSettings = PacingSettings()
    """How fast repairs start in one failure domain, and how much of it may be out."""
    reboot_hold: float = Field(default=1800.0, gt=0)
    """How long pods still on a node may hold its reboot through the node agent or a command
    (a veto, a system namespace, a disruption budget, pods stopping) before the node goes to a
    human instead (a duration: ``30m``): a hold never freezes the node's failure domain."""
    interval: float = Field(default=10.0, gt=0)
    """Seconds between two looks at the nodes on the ladder (a step that ended moves its node
    on at once; this picks up what the kill switch or pause held)."""

    _t = field_validator("window", "interval", "reboot_hold", mode="before")(_seconds)

    @field_validator("steps", mode="after")
    @classmethod
    def _once(cls, value: list[str]) -> list[str]:
        twice = sorted({s for s in value if value.count(s) > 1})
        if twice:
            raise ValueError(f"a step is named twice: {', '.join(twice)}")
        return value

    @field_validator("reset_gpu", "reboot", "validation", mode="after")
    @classmethod
    def _does_its_step(
        cls, value: LadderAction | ValidationSettings, info: ValidationInfo
    ) -> LadderAction | ValidationSettings:
        verb = VERBS["validate" if info.field_name == "validation" else str(info.field_name)]
        built_in = {e for v in VERBS.values() for e in v.executors}
        if value.executor in built_in and value.executor not in verb.executors:
            raise ValueError(
                f"executor {value.executor} does not do {verb.name} (the built-in executors"
                f" that do: {', '.join(sorted(verb.executors))}; or command, an executor of"
                " your own)"
            )
        return value


class HealthSettings(_Model):
    """GPU health: the XID catalogue's site overrides (docs/health.md)."""

    xid_overrides: list[Path] = []
    """Files that change codes of the shipped XID catalogue (class, action, threshold,
    cancels), applied in order and checked like rule files: an unknown code, class or action
    is refused with ``FILE:LINE`` (``gpuops health check``)."""
    max_event_age: float = Field(default=3600.0, gt=0)
    """Seconds: a pushed event older than this (by the engine's clock) is kept and counted in
    its XID's window but never makes a GPU faulty by itself: a replayed old event does not
    take a node out."""

    profiles: dict[str, Profile] = {}
    """Per pool (the ``pool`` an agent sends with its events), what a faulty GPU does:
    ``quarantine`` raises ``GpuFault`` with ``profile: quarantine`` (the shipped
    ``quarantine-faulty-gpu-node`` drains the node), ``observe`` raises it with ``profile:
    observe`` (``observe-faulty-gpu-node`` records a dry run, nothing is done), ``full``
    raises it with ``profile: full`` (``quarantine-and-repair-faulty-gpu-node`` drains the
    node, then the remediation ladder heals and returns it). A site rolls remediation out
    pool by pool."""
    default_profile: Profile = "quarantine"
    """The profile of a pool ``profiles`` does not name, and of events without a pool."""
    ladder: LadderSettings = LadderSettings()
    """The remediation ladder of the pools whose profile is ``full``."""

    _age = field_validator("max_event_age", mode="before")(_seconds)


class BatchSettings(_Model):
    """The fleet the engine's batch operations are planned over, wave after wave
    (docs/batch.md): a nodes file, or Slurm. Neither: the engine hosts no operation (the
    API refuses to start one, saying so)."""

    nodes: Path | None = None
    """A nodes file (``name``, ``pool``, ``gpus``, ``features``, ``labels``, ``state``), read
    again before each wave: whoever keeps it keeps it current."""
    slurm: bool = False
    """The fleet as Slurm says it is before each wave (``sinfo --json``)."""
    slurm_conf: Path | None = None
    """slurm.conf for ``slurm`` (default: Slurm's own)."""
    folder: Path | None = None
    """Where the paths of an operation posted without its own folder (the playbook, the
    inventory) are relative to; default: the folder of this configuration file."""
    self_approval: bool = False
    """Whether the person who started an operation with ``approval: true`` may approve it
    themselves; by default another person with ``approvals:decide`` does (two people)."""

    @model_validator(mode="after")
    def _one_fleet(self) -> BatchSettings:
        if self.nodes is not None and self.slurm:
            raise ValueError("give the fleet once: nodes (a nodes file) or slurm: true, not both")
        if self.slurm_conf is not None and not self.slurm:
            raise ValueError("slurm_conf is for slurm: true")
        return self


class EngineConfig(_Model):
    """The file ``gpuops engine run --config FILE`` reads. Relative paths are resolved against
    the file's directory; unknown keys are errors (``FILE:LINE: key: unknown key``)."""

    prometheus: PrometheusSettings = PrometheusSettings()
    """The Prometheus (or compatible server) the rules are evaluated against."""
    rules: list[Path] = [Path("rules")]
    """Rule files or directories (their *.yaml files)."""
    state_file: Path = Path("var/gpuops-state.sqlite")
    """SQLite file of everything the engine must not forget across restarts: targets' states,
    cooldowns and rate windows, decisions, approvals, quota requests, the kill switch
    (docs/state.md). Not used when ``state.url`` is set."""
    state: StateSettings = StateSettings()
    """PostgreSQL instead of ``state_file``, for replicas (docs/ha.md)."""
    audit: AuditConfig = AuditConfig()
    """Where the audit trail is spooled and shipped."""
    guardrails: GuardrailSettings = GuardrailSettings()
    """Engine-wide guardrails."""
    executors: dict[str, dict[str, Any]] = {}
    """Settings per executor name, e.g. ``fleet: {url: http://127.0.0.1:9400}``. The logical
    executors the shipped policies name map to concrete ones here: ``scheduler: {use: slurm}``
    or ``{use: kubernetes}`` (default ``fleet``), ``gpu-control: {use: nvml-agent}`` (default
    ``fleet``); optional
    ``by_verb: {notify: log}`` sends single verbs elsewhere (these mappings are checked with
    the file). Each executor's settings (docs/executors.md) are read when the engine starts,
    which builds every executor named here: a mistake in them, or a token file that cannot be
    read, stops the start with ``executors.NAME settings: key: what``. ``gpuops rules check
    --config`` builds each configured executor and names such mistakes before the engine
    starts."""
    metrics_listen: str | None = "127.0.0.1:9842"
    """host:port of the engine's own /metrics; None: not served."""
    reload_check_interval: float = 2.0
    """Seconds between checks of the rule files for changes (SIGHUP reloads at once)."""
    api: ApiSettings = ApiSettings()
    """The REST API, the Alertmanager receiver and the web console (docs/api.md)."""
    health: HealthSettings = HealthSettings()
    """GPU health events and their remediation (docs/health.md)."""
    log: LogSettings = LogSettings()
    """The engine's log lines: their format and the level of those that tell nothing new."""
    batch: BatchSettings = BatchSettings()
    """The fleet the engine's batch operations run over (docs/batch.md)."""

    _t = field_validator("reload_check_interval", mode="before")(_seconds)

    @field_validator("executors", mode="after")
    @classmethod
    def _logical_executors(
        cls, value: dict[str, dict[str, Any]], info: ValidationInfo
    ) -> dict[str, dict[str, Any]]:
        prometheus = info.data.get("prometheus")
        if prometheus is None:
            return with_logical_executors(value, None)
        return with_logical_executors(value, prometheus.url, prometheus.sample_age_bound)

    @field_validator("health", mode="after")
    @classmethod
    def _domains_not_read(cls, value: HealthSettings, info: ValidationInfo) -> HealthSettings:
        read = [
            found
            for name, settings in (info.data.get("executors") or {}).items()
            for found in _labels_read(settings, f"executors.{name}")
        ]
        ladder = value.ladder
        for step in ("reset_gpu", "reboot", "validation", "webhook"):
            read += _labels_read(getattr(ladder, step), f"health.ladder.{step}")
        for where, name in read:
            if name in ladder.pacing.domains:
                raise ValueError(
                    f"ladder.pacing.domains: {name} is read by {where}: a failure domain is "
                    "a label the node agent sends, never one an executor reads"
                )
        return value

    def resolved(self, base: Path) -> EngineConfig:
        def fix(p: Path) -> Path:
            return p if p.is_absolute() else (base / p)

        return self.model_copy(
            update={
                "rules": [fix(p) for p in self.rules],
                "state_file": fix(self.state_file),
                "state": self.state.model_copy(
                    update={"password_file": fix(self.state.password_file)}
                    if self.state.password_file
                    else {}
                ),
                "audit": self.audit.model_copy(update={"spool_dir": fix(self.audit.spool_dir)}),
                "health": self.health.model_copy(
                    update={"xid_overrides": [fix(p) for p in self.health.xid_overrides]}
                ),
                "batch": self.batch.model_copy(
                    update={
                        key: fix(value)
                        for key in ("nodes", "slurm_conf")
                        if (value := getattr(self.batch, key)) is not None
                    }
                    | {"folder": fix(self.batch.folder) if self.batch.folder else base}
                ),
                "api": self.api.model_copy(
                    update={
                        key: fix(value)
                        for key in ("tls_cert_file", "tls_key_file", "tokens_file")
                        if (value := getattr(self.api, key)) is not None
                    }
                ),
                "guardrails": self.guardrails.model_copy(
                    update={
                        "kill_switch_file": fix(self.guardrails.kill_switch_file)
                        if self.guardrails.kill_switch_file
                        else None
                    }
                ),
            }
        )


def with_logical_executors(
    executors: dict[str, dict[str, Any]],
    prometheus_url: str | None,
    max_sample_age_s: float | None = None,
) -> dict[str, dict[str, Any]]:
    """``executors`` with each logical executor's full settings: the concrete executor(s) it
    maps to and their settings; the slurm executor (and the kubernetes executor's reclaim, which
    maps a GPU to its pod) learn where Prometheus is and how old a sample they read there may
    be (``max_sample_age_s``: the engine's bound)."""
    out = {name: dict(settings) for name, settings in executors.items()}
    if "slurm" in out or any(
        out.get(n, LOGICAL_DEFAULTS[n]).get("use") == "slurm" for n in LOGICAL_DEFAULTS
    ):
        out.setdefault("slurm", {})
        if prometheus_url:
            out["slurm"].setdefault("prometheus_url", prometheus_url)
        if max_sample_age_s:
            out["slurm"].setdefault("max_sample_age_s", max_sample_age_s)
    if "kubernetes" in out or any(
        out.get(n, LOGICAL_DEFAULTS[n]).get("use") == "kubernetes" for n in LOGICAL_DEFAULTS
    ):
        kubernetes = out.setdefault("kubernetes", {})
        reclaim = kubernetes.get("reclaim")
        if isinstance(kubernetes, dict) and isinstance(reclaim, dict | None):
            engine: dict[str, Any] = {
                "prometheus_url": prometheus_url,
                "max_sample_age_s": max_sample_age_s,
            }
            filled = {k: v for k, v in engine.items() if v}
            if filled:
                kubernetes["reclaim"] = {**filled, **(reclaim or {})}
    for name, default in LOGICAL_DEFAULTS.items():
        given = out.get(name)
        spec = dict(default) if given is None else dict(given)
        unknown = sorted(set(spec) - {"use", "by_verb", "settings"})
        if unknown:
            raise ValueError(
                f"{name}: unknown key {unknown[0]!r} (allowed: by_verb, settings, use)"
            )
        use = spec.get("use")
        by_verb = spec.get("by_verb", default.get("by_verb", {}) if given is None else {})
        if not isinstance(use, str) or not use or use in LOGICAL_DEFAULTS:
            raise ValueError(
                f"{name}.use: name a concrete executor (fleet, slurm, nvml-agent, ...), not {use!r}"
            )
        if not isinstance(by_verb, dict) or not all(
            isinstance(v, str) and v not in LOGICAL_DEFAULTS for v in by_verb.values()
        ):
            raise ValueError(f"{name}.by_verb: a mapping of verb to concrete executor name")
        known = {ep.name for ep in entry_points(group="gpuops.executors")} - set(LOGICAL_DEFAULTS)
        for used in (use, *by_verb.values()):
            if known and used not in known:
                raise ValueError(
                    f"{name}: unknown executor {used!r} (known: {', '.join(sorted(known))})"
                )
        concrete = {use, *by_verb.values()}
        out[name] = {
            "use": use,
            "by_verb": dict(by_verb),
            "settings": {c: out.get(c, {}) for c in concrete},
        }
    return out


def load_config(path: Path) -> EngineConfig:
    """Read and validate the config file; every problem is reported as ``file:line: key: what``."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    data, positions, problems = parse_yaml(text)
    if problems:
        raise ConfigError("\n".join(f"{path}:{p.line}: {p.message}" for p in problems))
    raw = {} if data is None else data
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}:1: the configuration must be a mapping of settings")
    try:
        config = EngineConfig.model_validate(raw).resolved(path.parent.resolve())
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = tuple(p for p in err["loc"] if isinstance(p, str | int))
            where = ".".join(str(p) for p in loc)
            message = str(err["msg"]).removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                allowed = ", ".join(_allowed_keys(loc[:-1])) or "none"
                message = f"unknown key (allowed: {allowed})"
            lines.append(f"{path}:{positions.line(loc)}: {where}: {message}")
        raise ConfigError("\n".join(lines)) from None
    try:  # checked like rule files: the engine would refuse them at start
        load_catalogue(config.health.xid_overrides)
    except RulesError as exc:
        raise ConfigError(str(exc)) from None
    return config


def _allowed_keys(loc: tuple[str | int, ...]) -> list[str]:
    """The keys the settings model at ``loc`` accepts."""
    model: type[BaseModel] = EngineConfig
    for part in loc:
        field = model.model_fields.get(str(part))
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        model = annotation
    return sorted(model.model_fields)
