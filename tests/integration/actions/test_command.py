"""The ``command`` executor with real subprocesses: one argument per template whatever a label
holds, the minimal environment, output capture, exit codes, timeouts that kill the process
group."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuops.actions.base import PermanentError, TemporaryError, execute
from gpuops.actions.command import OUTPUT_CAP, CommandExecutor
from gpuops.actions.retry import RetryPolicy
from gpuops.model.decisions import Decision, OutcomeStatus
from tests.unit.actions.support import make_decision

PY = sys.executable
PRINT_ARGV = "import json, sys; print(json.dumps(sys.argv[1:]))"
PRINT_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


def command(argv: list[str], did: str = "dec-cmd-1", **labels: str) -> Decision:
    return make_decision("drain", "command", {"argv": argv}, did=did, **labels)


def run(argv: list[str], settings: dict[str, Any] | None = None, **labels: str) -> Any:
    return CommandExecutor(settings).run(command(argv, **labels))


def script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + text, encoding="utf-8")
    path.chmod(0o755)
    return str(path)


def test_runs_a_program_and_captures_its_output() -> None:
    changed = run(["/bin/echo", "reclaim", "{{ $labels.uuid }}"], uuid="GPU-1")
    assert changed == {
        "argv": ["/bin/echo", "reclaim", "GPU-1"],
        "exit_code": 0,
        "stdout": "reclaim GPU-1\n",
        "stderr": "",
    }


def test_a_label_stays_one_argument_and_reaches_no_shell() -> None:
    hostile = "x; rm -rf / --flag $(id) `id` && echo pwned | cat > /tmp/p"
    changed = run(
        [PY, "-c", PRINT_ARGV, "{{ $labels.node }}", "node={{ $labels.node }}"], node=hostile
    )
    assert json.loads(changed["stdout"]) == [hostile, f"node={hostile}"]


def test_a_label_that_would_be_read_as_an_option_is_refused() -> None:
    ex = CommandExecutor()
    decision = command(["kubectl", "drain", "{{ $labels.node }}"], node="--all")
    with pytest.raises(PermanentError) as exc:
        ex.run(decision)
    assert str(exc.value) == (
        "argv[2] '{{ $labels.node }}' renders to '--all', which 'kubectl' would read as an "
        "option; a label value may not start with '-' here (put '--' before it if the program "
        "accepts that)"
    )
    # after "--" the program reads operands only; an option the template writes itself is fine
    changed = ex.run(command([PY, "-c", PRINT_ARGV, "--", "{{ $labels.node }}"], node="--all"))
    assert json.loads(changed["stdout"]) == ["--", "--all"]


def test_the_environment_is_minimal_plus_the_decision(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPUOPS_TEST_ENGINE_SECRET", "must-not-leak")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("LANG", "C.UTF-8")
    ex = CommandExecutor({"env": {"KUBECONFIG": "/etc/gpuops/kube", "REGION": "eu"}})
    decision = make_decision(
        "drain",
        "command",
        {"argv": [PY, "-c", PRINT_ENV], "env": {"REGION": "us", "NODE": "{{ $labels.node }}"}},
        node="n7",
    )
    env = json.loads(ex.run(decision)["stdout"])
    assert env == {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "KUBECONFIG": "/etc/gpuops/kube",
        "REGION": "us",
        "NODE": "n7",
        "GPUOPS_DECISION_ID": decision.id,
        "GPUOPS_POLICY": "reclaim-idle-gpus",
        "GPUOPS_ACTION": "drain",
        "GPUOPS_TARGET": "node=n7",
    }


def test_cwd_from_settings_and_params(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    pwd = [PY, "-c", "import os; print(os.getcwd())"]
    assert run(pwd, {"cwd": str(tmp_path)})["stdout"] == f"{tmp_path}\n"
    decision = make_decision("drain", "command", {"argv": pwd, "cwd": str(tmp_path / "a")})
    assert CommandExecutor({"cwd": str(tmp_path)}).run(decision)["stdout"] == f"{tmp_path}/a\n"
    with pytest.raises(PermanentError, match="working directory '.*/nowhere' is not a directory"):
        run(pwd, {"cwd": str(tmp_path / "nowhere")})


def test_output_is_capped_to_its_tail() -> None:
    code = "import sys; sys.stdout.write('a' * 10000 + 'END'); sys.stderr.write('e' * 5000)"
    changed = run([PY, "-c", code])
    assert changed["stdout"] == f"[{10003 - OUTPUT_CAP} bytes cut]" + "a" * 4093 + "END"
    assert changed["stderr"] == f"[{5000 - OUTPUT_CAP} bytes cut]" + "e" * OUTPUT_CAP


def test_a_non_zero_exit_is_permanent_with_the_stderr_tail() -> None:
    code = (
        "import sys; print('partial'); "
        "sys.stderr.write('noise\\n' * 200 + 'node busy\\n'); sys.exit(3)"
    )
    outcome = execute(CommandExecutor(), command([PY, "-c", code]), sleep=lambda s: pytest.fail())
    assert outcome.status is OutcomeStatus.FAILURE
    assert outcome.attempts == 1
    assert outcome.error is not None
    assert outcome.error.startswith(f"command {PY!r} exited 3; stderr: ")
    assert outcome.error.endswith("noise\nnoise\nnode busy")
    assert len(outcome.error) < len(f"command {PY!r} exited 3; stderr: ") + 520


def test_retry_exit_codes_are_temporary() -> None:
    waits: list[float] = []
    ex = CommandExecutor({"retry_exit_codes": [75]})
    outcome = execute(
        ex, command([PY, "-c", "raise SystemExit(75)"]), RetryPolicy(3, 0.5), waits.append
    )
    assert outcome.status is OutcomeStatus.FAILURE
    assert outcome.attempts == 3
    assert outcome.error == f"command {PY!r} exited 75"
    assert waits == [0.5, 1.0]
    with pytest.raises(PermanentError, match="exited 76"):
        ex.run(command([PY, "-c", "raise SystemExit(76)"]))


def test_death_by_signal_is_reported() -> None:
    with pytest.raises(PermanentError) as exc:
        run([PY, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert str(exc.value) == f"command {PY!r} was killed by SIGKILL"


def test_a_missing_program_is_permanent_and_named(tmp_path: Path) -> None:
    with pytest.raises(PermanentError) as exc:
        run(["gpuops-no-such-program", "x"], {"env": {"PATH": str(tmp_path)}})
    assert str(exc.value) == f"command 'gpuops-no-such-program' not found (PATH={tmp_path})"
    (tmp_path / "not-executable").write_text("#!/bin/sh\n", encoding="utf-8")
    with pytest.raises(PermanentError, match="command '.*/not-executable' is not executable"):
        run([str(tmp_path / "not-executable")])


def _dead(pid: int) -> bool:
    """Gone, or a zombie waiting for a reaper that is not us."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_a_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    prog = script(
        tmp_path, "hang.sh", f"sleep 300 &\necho $! > {pidfile}\necho waiting >&2\nwait\n"
    )
    started = time.monotonic()
    with pytest.raises(TemporaryError) as exc:
        run([prog], {"timeout_s": 1.0})
    assert time.monotonic() - started < 60
    assert str(exc.value) == (
        f"command {prog!r} ran past 1 s; its process group was killed; stderr: waiting"
    )
    child = int(pidfile.read_text(encoding="utf-8"))
    deadline = time.monotonic() + 10
    try:
        while not _dead(child):
            assert time.monotonic() < deadline, f"grandchild {child} survived the timeout"
            time.sleep(0.01)
    finally:
        if not _dead(child):
            os.kill(child, signal.SIGKILL)


def test_a_background_child_holding_the_output_does_not_block(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    prog = script(tmp_path, "fork.sh", f"sleep 300 &\necho $! > {pidfile}\necho done\n")
    try:
        started = time.monotonic()
        changed = run([prog], {"timeout_s": 30})
        assert time.monotonic() - started < 20
        assert changed["stdout"] == "done\n"
    finally:
        if pidfile.exists():
            os.kill(int(pidfile.read_text(encoding="utf-8")), signal.SIGKILL)


def test_numbers_in_argv_become_strings() -> None:
    decision = make_decision("downclock", "command", {"argv": ["/bin/echo", 1095, 0.5]})
    assert CommandExecutor().run(decision)["stdout"] == "1095 0.5\n"
