"""The ``command`` executor: runs a program with an argv list, never through a shell
for actions a site scripts itself (``kubectl cordon``, a Slurm drain).

``gpuops.actions.base.execute`` calls ``run``. Each argument of ``params.argv`` is rendered with
``gpuops.model.rules.templating.render`` from the target's labels and stays one argument whatever
the
label holds; an argument that comes from a label and would start with ``-`` (read as an option)
is refused unless ``--`` precedes it. The process runs in its own session; on timeout its whole
process group is killed and the run is a ``TemporaryError``; ``run_cancellable`` kills it
too when it is cancelled (``Cancelled``). Exit 0 is success; another exit is a
``PermanentError`` (``TemporaryError`` for the codes in ``retry_exit_codes``). The program gets
``GPUOPS_DECISION_ID`` to make itself idempotent: a retried decision has the same id.

Settings (engine configuration, ``executors.command``): ``timeout_s``, ``env``, ``cwd``,
``retry_exit_codes``. Params (the policy's ``action.params``): ``argv`` (required),
``timeout_s``, ``env``, ``cwd``, ``program_from_labels`` (``argv[0]`` may use a label only
with it); params win over settings, env is merged.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, ValidationError

from gpuops.actions.base import Cancel, Cancelled, PermanentError, TemporaryError
from gpuops.actions.config import problems, settings_of
from gpuops.actions.encoding import printable
from gpuops.actions.results import Result
from gpuops.model.decisions import Decision
from gpuops.model.rules.templating import render

log = logging.getLogger(__name__)

OUTPUT_CAP = 4096
"""Bytes kept of stdout and of stderr (the last ones: where programs say how they ended)."""
INHERITED_ENV = ("PATH", "HOME", "LANG")
POLL_S = 0.2
"""How often a running program's action asks whether it is cancelled (``run_cancellable``)."""
"""The only variables taken from the engine's own environment (secrets there stay there)."""


class CommandSettings(BaseModel):
    """``executors.command`` in the engine configuration. Unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: PositiveFloat = 60.0
    """Seconds a program may run before its process group is killed (a retry follows). A
    minute covers a cordon or a drain request; a hung program must not hold an action slot."""
    env: dict[str, str] = {}
    """Variables added to the minimal environment (PATH, HOME, LANG of the engine)."""
    cwd: Path | None = None
    """Working directory (default: the engine's)."""
    retry_exit_codes: frozenset[int] = frozenset()
    """Exit codes that mean "try again later" (e.g. 75, EX_TEMPFAIL); others are permanent."""


class CommandParams(BaseModel):
    """A policy's params for a command action. Unknown keys are errors (likely typos)."""

    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    argv: list[str] = Field(min_length=1)
    """Program and arguments, each a template (``{{ $labels.node }}``)."""
    timeout_s: PositiveFloat | None = None
    env: dict[str, str] = {}
    """Added over the settings' env; values are templates."""
    cwd: Path | None = None
    program_from_labels: bool = False
    """Allow ``argv[0]`` to use a label (the program a scraped label names is run): off unless
    the rule says so explicitly."""


class Ran(Result):
    """A program that exited 0: its argv and the tail of its output."""

    argv: list[str]
    exit_code: int
    stdout: str
    stderr: str


class CommandExecutor:
    """Runs a program per decision; any verb (free-form: its params are ``CommandParams``)."""

    name = "command"
    verbs: frozenset[str] | None = None

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        self.settings = settings_of(CommandSettings, self.name, settings)

    @staticmethod
    def check_params(verb: str, params: Mapping[str, Any]) -> list[str]:
        """What ``run`` would refuse in ``params`` whatever the target (rules check, reload)."""
        try:
            parsed = CommandParams.model_validate(dict(params))
        except ValidationError as exc:
            return [f"command params: {problems(exc)}"]
        if not parsed.program_from_labels and "$labels" in parsed.argv[0]:
            return [
                f"argv[0] {parsed.argv[0]!r} takes the program from a label; set "
                "program_from_labels: true if the rule means to run what a scraped label names"
            ]
        return []

    def run(self, decision: Decision) -> Ran:
        return self.run_cancellable(decision, lambda: None)

    def run_cancellable(self, decision: Decision, cancelled: Cancel) -> Ran:
        """``run``, asking ``cancelled`` every ``POLL_S`` while the program runs: when it
        names a reason, the program's process group is killed and ``Cancelled`` raised."""
        try:
            params = CommandParams.model_validate(
                dict(decision.action.params) if decision.action else {}
            )
        except ValidationError as exc:
            raise PermanentError(f"command params: {problems(exc)}") from None
        argv = render_argv(
            params.argv, decision.target.labels, decision.evidence.value, params.program_from_labels
        )
        env = self._env(params, decision)
        cwd = params.cwd or self.settings.cwd
        if cwd is not None and not cwd.is_dir():
            raise PermanentError(f"command working directory {str(cwd)!r} is not a directory")
        timeout = params.timeout_s or self.settings.timeout_s
        program = argv[0]
        # Output goes to files, not pipes: nothing to deadlock on, memory stays bounded, and a
        # background child that keeps the output open cannot make us wait past the exit.
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    env=env,
                    cwd=cwd,
                    start_new_session=True,
                )
            except FileNotFoundError:
                raise PermanentError(
                    f"command {program!r} not found (PATH={env.get('PATH', '')})"
                ) from None
            except PermissionError:
                raise PermanentError(f"command {program!r} is not executable") from None
            except (OSError, ValueError) as exc:
                raise PermanentError(f"command {program!r} could not start: {exc}") from None
            log.debug("command %s for decision %s: pid %d", argv, decision.id, proc.pid)
            try:
                code = _wait(proc, timeout, cancelled)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                raise TemporaryError(
                    f"command {program!r} ran past {timeout:g} s; its process group was killed"
                    f"{_stderr_note(_tail(err))}"
                ) from None
            except Cancelled as exc:
                _kill_group(proc)
                raise Cancelled(
                    f"{exc}; command {program!r}: its process group was killed"
                ) from None
            except BaseException:  # interrupted: leave no orphan behind
                _kill_group(proc)
                raise
            stdout, stderr = _tail(out), _tail(err)
        if code != 0:
            how = _exit_text(code)
            message = f"command {program!r} {how}{_stderr_note(stderr)}"
            if code in self.settings.retry_exit_codes:
                raise TemporaryError(message)
            raise PermanentError(message)
        log.info("command %s for decision %s exited 0", program, decision.id)
        return Ran(argv=argv, exit_code=code, stdout=stdout, stderr=stderr)

    def _env(self, params: CommandParams, decision: Decision) -> dict[str, str]:
        env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
        env.setdefault("PATH", os.defpath)
        env.setdefault("LANG", "C.UTF-8")
        env.update(self.settings.env)
        labels, value = decision.target.labels, decision.evidence.value
        for name, template in params.env.items():
            rendered = render(template, labels, value)
            if "\x00" in rendered:
                raise PermanentError(
                    f"env {name} {template!r} renders to {printable(rendered)}, with a NUL byte"
                )
            env[name] = rendered
        env["GPUOPS_DECISION_ID"] = decision.id
        env["GPUOPS_POLICY"] = decision.policy
        env["GPUOPS_ACTION"] = decision.action.type if decision.action else ""
        env["GPUOPS_TARGET"] = decision.target.key
        return env


def render_argv(
    templates: list[str],
    labels: Mapping[str, str],
    value: float | None,
    program_from_labels: bool = False,
) -> list[str]:
    """Each template rendered to exactly one argument; refuses label values that would turn into
    options (a leading ``-`` the template did not write) before a ``--``, NUL bytes, and a
    program (``argv[0]``) taken from a label unless ``program_from_labels``."""
    if not program_from_labels and "$labels" in templates[0]:
        raise PermanentError(
            f"argv[0] {templates[0]!r} takes the program from a label; set params."
            "program_from_labels: true if the rule means to run what a scraped label names"
        )
    argv: list[str] = []
    options_ended = False
    for index, template in enumerate(templates):
        arg = render(template, labels, value)
        if "\x00" in arg:
            raise PermanentError(
                f"argv[{index}] {template!r} renders to {printable(arg)}, with a NUL byte"
            )
        if index == 0 and not arg:
            raise PermanentError(f"argv[0] {template!r} renders to an empty program name")
        if index > 0 and not options_ended and arg.startswith("-") and not template.startswith("-"):
            raise PermanentError(
                f"argv[{index}] {template!r} renders to {arg!r}, which {argv[0]!r} would read as "
                "an option; a label value may not start with '-' here (put '--' before it if "
                "the program accepts that)"
            )
        options_ended = options_ended or (index > 0 and arg == "--")
        argv.append(arg)
    return argv


def _wait(proc: subprocess.Popen[bytes], timeout: float, cancelled: Cancel) -> int:
    """The program's exit code; ``TimeoutExpired`` past ``timeout``, ``Cancelled`` as soon
    as ``cancelled`` names a reason."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            return proc.wait(timeout=max(0.0, min(POLL_S, left)))
        except subprocess.TimeoutExpired:
            if left <= POLL_S:
                raise
        why = cancelled()
        if why is not None:
            raise Cancelled(why)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the program and all it started (its own session)
    except ProcessLookupError:
        pass
    proc.kill()  # in case it left its session: never wait on a live program
    proc.wait()


def _tail(stream: IO[bytes]) -> str:
    size = stream.seek(0, os.SEEK_END)
    stream.seek(max(0, size - OUTPUT_CAP))
    text = stream.read().decode("utf-8", errors="replace")
    return f"[{size - OUTPUT_CAP} bytes cut]{text}" if size > OUTPUT_CAP else text


def _stderr_note(stderr: str) -> str:
    tail = stderr.strip()[-512:]
    return f"; stderr: {tail}" if tail else ""


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited {code}"
