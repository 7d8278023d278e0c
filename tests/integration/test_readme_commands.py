"""Every command of the README and of the guides in docs/, run as written and in order: the
``sh`` blocks are extracted, the long-running commands (fleet, Prometheus, engine, exporter)
are started in the background and waited for, the others must exit 0 — in a temporary copy of
the repository's config, rules, examples, deploy files and docs, with every fixed port moved to
a free loopback port and the paths of an installation (``/etc/gpuops``, ``/var/lib/gpuops``,
``/opt/gpuops/src``, ...) moved into the copy.

A ``text`` block right after an ``sh`` block is what the block's last command prints: each of
its lines must be in the output (``...`` stands for anything; a timestamp or a hex id is an
example), and the command is run again until it is (up to ``OUTPUT_WAIT_S``: some outputs
come once the engine has decided).

The documents run in groups: the README's tour and the first-policy guide share their
processes (the guide starts where the tour leaves off), the install guide and the operations
guide share theirs; the processes of a group are stopped before the next one starts.

Not run, each for a stated reason: ``NOT_RUN`` (exact lines) and ``NOT_RUN_PREFIXES``. Run
after a rewrite, each for a stated reason: ``REWRITES``. ``systemctl stop|start gpuops-engine``
stops and starts the engine the install guide started. A line that is neither run nor listed
fails the test (``test_every_sh_line_of_the_docs_is_run_or_listed``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
import yaml

from gpuops.model.rules.durations import parse_duration
from gpuops.model.rules.loader import load_rules
from gpuops.settings import load_config
from gpuops.sources.promproc import free_port
from tests.fakes.fake_elasticsearch import FakeElasticsearch
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

GROUPS: tuple[tuple[str, ...], ...] = (
    ("README.md", "docs/first-policy.md"),
    ("docs/install.md", "docs/operations.md"),
    ("docs/whatif.md",),
    ("docs/health.md",),
    ("docs/batch.md",),
)
"""The documents whose commands run, in order; each tuple shares its background processes."""

LISTED_ONLY = (
    "docs/slurm.md",
    "docs/api.md",
    "docs/benchmarks.md",
    "docs/ha.md",
    "docs/kubernetes.md",
)
"""Documents with sh blocks none of whose lines can run here (each line is in ``NOT_RUN``)."""

NOT_RUN = {
    "make demo": "make demo has its own tests (tests/integration/sim/test_demo_signals.py)",
    "make test": "make test is what runs this test",
    "make setup && . .venv/bin/activate": "the test runs with this venv first on the PATH",
    "gpuops exporter nvml --port 9835": "needs an NVIDIA GPU and its driver",
    "gpuops decisions explain DECISION_ID": "a placeholder: explain is run on a real id below",
    # docs/install.md and docs/operations.md: what changes the host itself
    "python3 -m venv /opt/gpuops": "installs packages; the test runs in the venv make setup made",
    "/opt/gpuops/bin/pip install -e /opt/gpuops/src": "installs packages (as above)",
    "PIPX_HOME=/opt/pipx PIPX_BIN_DIR=/usr/local/bin pipx install --editable /opt/gpuops/src": (
        "installs packages (as above)"
    ),
    "useradd --system --home-dir /var/lib/gpuops --shell /usr/sbin/nologin gpuops": (
        "adds a system user; the test's processes run as the test's user"
    ),
    "chown gpuops: /etc/gpuops/api-tokens.yaml /etc/gpuops/agent-token": "needs the gpuops user",
    "cp /opt/gpuops/src/deploy/systemd/gpuops-*.service /etc/systemd/system/": (
        "installs systemd units; tests/unit/deploy/test_systemd_units.py checks each ExecStart"
    ),
    "systemctl daemon-reload": "systemd (as above)",
    "systemctl enable --now gpuops-engine": "systemd: the test runs the unit's command itself",
    "systemctl enable --now gpuops-nvml-exporter": "systemd, and needs an NVIDIA GPU",
    "systemctl enable --now gpuops-node-agent": "systemd, and needs an NVIDIA GPU",
    "systemctl enable --now gpuops-slurm-exporter": "systemd, and needs Slurm",
    "curl -X POST 'http://kibana.example:5601/api/saved_objects/_import?overwrite=true' -H "
    "'kbn-xsrf: true' --form file=@/opt/gpuops/src/elk/kibana/gpuops-audit.ndjson": (
        "needs Kibana; tests/unit/deploy/test_compose.py checks the import file"
    ),
    "git -C /opt/gpuops/src fetch && git -C /opt/gpuops/src checkout RELEASE": (
        "RELEASE is a placeholder: the release tag or commit to run"
    ),
    # docs/slurm.md: a Slurm cluster (tests/integration/slurm runs these on a local one)
    "gpuops exporter slurm --port 9341 --slurm-conf /etc/slurm/slurm.conf --gres-conf "
    "/etc/slurm/gres.conf": "needs Slurm (tests/integration/slurm)",
    "gpuops audit slurm-jobs --spool-dir var/audit-slurm-jobs --interval 10": (
        "needs Slurm (tests/integration/slurm)"
    ),
    "gpuops audit anomalies --spool-dir var/audit-slurm-jobs": "follows the line above",
    # docs/api.md: a token by hand (tests/unit/api checks hashing)
    "TOKEN=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')": (
        "an example of making a token by hand; tests/unit/api checks the hashing"
    ),
    'printf %s "$TOKEN" | sha256sum': "follows the line above",
    # docs/ha.md: docker compose (no Docker here)
    "GPUOPS_ENGINE_CONFIG=engine-ha.yaml docker compose --profile ha up -d": "needs Docker",
    "curl -s http://127.0.0.1:9844/healthz": "follows the line above (docker compose)",
}
NOT_RUN_PREFIXES = {
    "python -m tests.benchmarks": "a benchmark: minutes each, run by make bench",
    "docker compose": "needs Docker",
    "kubectl ": "needs a Kubernetes cluster (the manifests: tests/integration/deploy)",
    "gpuops whatif --fleet examples/fleets/case-study.yaml --rules rules/gpu-efficiency.yaml "
    "--rules rules/energy --rules rules/fleet --hours 24 --seeds 5": (
        "five 24-hour what-ifs (~10 minutes); the same command for half an hour runs above"
    ),
    "gpuops whatif --fleet examples/fleets/training.yaml --rules rules/fleet/health.yaml "
    "--faults 300 --hours 72 --seeds 5": (
        "five 72-hour reliability what-ifs (~4 minutes); the two-hour command above runs, and "
        "tests/integration/sim/test_whatif_faults.py checks what the section reports"
    ),
    "TZ=UTC sacct ": (
        "needs Slurm's accounting (tests/integration/slurm/test_slurm_accounting.py runs sacct)"
    ),
}
REWRITES = {
    "runuser -u gpuops -- ": (
        "",
        "the test machine has no gpuops user: the command runs as the test's user",
    ),
    " -o gpuops -g gpuops": ("", "no gpuops user (as above)"),
}
BACKGROUND = ("gpuops fleet sim", "prometheus ", "gpuops engine run", "gpuops exporter nvml")
FIXED_PORTS = (9090, 9093, 9200, 9400, 9835, 9836, 9842, 9843)
"""The ports the documents and the configuration files name; each becomes a free one (9401,
the first node port, becomes 0: free ports for every node)."""
INSTALL_PATHS = ("/etc/gpuops", "/etc/prometheus", "/etc/alertmanager", "/var/lib/gpuops")
"""Paths of an installation, each moved to the same path under the workspace."""
COPIED = ("config", "rules", "examples", "deploy", "docs", "elk")
OUTPUT_WAIT_S = 150.0


@dataclass(frozen=True)
class Step:
    document: str
    command: str
    expected: tuple[str, ...] = ()
    """The lines of the text block after the command's sh block, for its last command."""


def steps(document: str) -> list[Step]:
    """The lines of a document's sh blocks (comments cut, backslash continuations joined), with
    the text block that follows a block given to its last line."""
    text = (REPO / document).read_text()
    found: list[Step] = []
    pattern = r"```sh\n(.*?)```(?:\n\n```text\n(.*?)```)?"
    for block, output in re.findall(pattern, text, flags=re.S):
        joined = re.sub(r"\\\n\s*", "", block)
        lines = [re.sub(r"\s+#\s.*$", "", line).strip() for line in joined.splitlines()]
        lines = [line for line in lines if line and not line.startswith("#")]
        expected = tuple(line for line in output.splitlines() if line.strip())
        for i, line in enumerate(lines):
            found.append(Step(document, line, expected if i == len(lines) - 1 else ()))
    return found


def not_run(command: str) -> str | None:
    """Why ``command`` is not run, or None."""
    if command in NOT_RUN:
        return NOT_RUN[command]
    return next((why for p, why in NOT_RUN_PREFIXES.items() if command.startswith(p)), None)


EXAMPLE_TOKEN = re.compile(
    r"\d{4}-\d\d-\d\d([T ][\d:.]+Z?)?|\d\d:\d\d:\d\d(\.\d+)?Z?|(?=.*\d)[0-9a-f]{8,}"
)
"""A token of a document's output that is an example: a date, a time (the CLI prints
``2026-12-06 08:41:15Z``: two tokens) or a hex id."""


def output_matches(expected: str, output: str) -> bool:
    """Whether a line shown in the docs is in ``output``: whitespace runs are equal, ``...``
    stands for anything, and timestamps and hex ids are examples."""
    parts = []
    for token in re.split(r"(\.\.\.|\s+)", expected.strip()):
        if token == "...":
            parts.append(r".*?")
        elif token.isspace():
            parts.append(r"\s+")
        elif re.fullmatch(EXAMPLE_TOKEN, token):
            parts.append(r"\S+")
        elif token:
            parts.append(re.escape(token))
    pattern = "".join(parts)
    return any(re.search(pattern, line.strip()) for line in output.splitlines())


@dataclass
class Workspace:
    root: Path
    ports: dict[int, int]
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    started: dict[str, str] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)
    ran_at: dict[str, float] = field(default_factory=dict)
    """When each command (as the document writes it) last ended, on the monotonic clock."""

    def local(self, text: str) -> str:
        """``text`` with the fixed ports and the installation's paths moved."""
        text = text.replace("/opt/gpuops/src", str(self.root))
        for path in INSTALL_PATHS:
            text = re.sub(rf"(?<![\w/.]){re.escape(path)}\b", f"{self.root}{path}", text)
        text = re.sub(r"(?<=[:= ])9401\b", "0", text)
        for fixed, port in self.ports.items():
            text = re.sub(rf"(?<=[:= ]){fixed}\b", str(port), text)
        return text

    def url(self, fixed: int) -> str:
        return f"http://127.0.0.1:{self.ports[fixed]}"

    def run(self, command: str) -> str:
        """A foreground command: exit 0 within 3 minutes; its stdout (``outputs`` keeps stdout
        and stderr). ``export`` lines set the environment of the commands that follow."""
        if command.startswith("export "):
            out = self._bash(f"{command}\nenv -0", command)
            self.env = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
            return ""
        return self._bash(command, command)

    def _bash(self, script: str, command: str) -> str:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, f"{command}\nexit {done.returncode}\n{done.stderr[-3000:]}"
        self.outputs[command] = done.stdout + done.stderr
        return done.stdout

    def start(self, name: str, command: str) -> None:
        """A long-running command in its own process group, its output in a log file."""
        log = (self.root / f"bg-{len(self.started)}.log").open("wb")
        proc = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=self.root,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs[name] = proc
        self.started[name] = command

    def stop(self, names: list[str] | None = None) -> None:
        chosen = [n for n in reversed(list(self.procs)) if names is None or n in names]
        for name in chosen:
            if self.procs[name].poll() is None:
                os.killpg(self.procs[name].pid, signal.SIGTERM)
        for name in chosen:
            proc = self.procs.pop(name)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-2000:] for p in self.root.glob("bg-*.log"))


def answers(url: str, ws: Workspace) -> bool:
    assert all(p.poll() is None for p in ws.procs.values()), ws.logs()
    try:
        return requests.get(url, timeout=2).status_code < 500
    except requests.ConnectionError:
        return False


@pytest.fixture
def workspace(tmp_path: Path) -> Iterator[Workspace]:
    for name in COPIED:
        shutil.copytree(REPO / name, tmp_path / name)
    ports = {fixed: free_port() for fixed in FIXED_PORTS}
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("GPUOPS_TOKEN", None)
    env["GPUOPS_URL"] = f"http://127.0.0.1:{ports[9843]}"  # the CLI's default URL, moved too
    ws = Workspace(tmp_path, ports, env)
    for config in ("config/engine.yaml", "deploy/systemd/engine.yaml"):
        path = tmp_path / config
        path.write_text(ws.local(path.read_text()))
    try:
        yield ws
    finally:
        ws.stop()


def ready_url(command: str, local: str, ws: Workspace) -> str:
    if command.startswith("gpuops fleet sim"):
        return f"{ws.url(9400)}/api/v1/state"
    if command.startswith("prometheus "):
        return f"{ws.url(9090)}/-/ready"
    if command.startswith("gpuops engine run"):
        config = re.search(r"--config (\S+)", local)
        assert config, command
        listen = re.search(r"^\s*listen: (\S+)", (ws.root / config[1]).read_text(), re.M)
        assert listen, f"{config[1]} serves no API"
        return f"http://127.0.0.1:{listen[1].rsplit(':', 1)[1]}/healthz"
    return f"{ws.url(9836)}/metrics"


def rewritten(command: str) -> str:
    """``command`` after ``REWRITES``, the installed ``gpuops`` being the venv's."""
    for old, (new, _) in REWRITES.items():
        command = command.replace(old, new)
    return command.replace("/opt/gpuops/bin/gpuops", "gpuops")


def run_step(ws: Workspace, step: Step) -> None:
    if not_run(step.command):
        return
    try:
        _run_step(ws, step)
    finally:
        ws.ran_at[step.command] = time.monotonic()


def _run_step(ws: Workspace, step: Step) -> None:
    command = rewritten(step.command)
    service = re.fullmatch(r"systemctl (stop|start) gpuops-engine", command)
    if service:  # systemd, played by the test: the engine the install guide started
        (name,) = [n for n in ws.started if n.startswith("gpuops engine run --config /etc/")]
        if service[1] == "stop":
            ws.stop([name])
            return
        command = name
    local = ws.local(command)
    assert not re.search(r"\b(DECISION_ID|\.\.\.)\b", local), f"placeholder: {command}"
    if command.startswith(BACKGROUND):
        ws.start(command, local)
        url = ready_url(command, local, ws)
        wait_for(lambda u=url: answers(u, ws), 60, f"{command} to answer")
        return
    if not step.expected:
        ws.run(local)
        return
    expected = [ws.local(line) for line in step.expected]
    deadline = time.monotonic() + OUTPUT_WAIT_S
    while True:  # until it prints what the document shows (the engine may not have decided yet)
        try:
            ws.run(local)
            output = ws.outputs[local]
        except AssertionError as failed:
            output = str(failed)
        if all(output_matches(line, output) for line in expected):
            return
        assert time.monotonic() < deadline, (
            f"{step.document}: {command} printed\n{output}\nnot\n" + "\n".join(step.expected)
        )
        time.sleep(2)


def test_every_document_command_does_what_the_document_says(workspace: Workspace) -> None:
    ws = workspace
    readme = steps("README.md")
    assert len(readme) > 12, readme
    with FakeElasticsearch() as es:
        ws.ports[9200] = es.port  # `gpuops elk install` meets the faithful fake
        for group in GROUPS:
            for document in group:
                for step in steps(document):
                    run_step(ws, step)
                if document == "README.md":
                    check_the_tour(ws)
                if document == "docs/first-policy.md":
                    check_the_first_policy(ws)
            ws.stop()
        assert any(k.startswith("gpuops elk install") for k in ws.outputs)


def check_the_tour(ws: Workspace) -> None:
    """What the README's tour says happens, beyond the commands' exit status."""
    assert len(ws.env.get("GPUOPS_TOKEN", "")) > 20, "export GPUOPS_TOKEN=$(gpuops token new ...)"

    # node-0 failed (the README's curl): the shipped migrate policy decides within the bound
    # its configuration sets, and `gpuops decisions explain` tells why
    failed = next(c for c in ws.ran_at if c.startswith("curl ") and "/nodes/node-0/fail" in c)
    bound = migrate_bound_s(ws)
    api = f"{ws.env['GPUOPS_URL']}/api/v1/decisions"
    headers = {"Authorization": f"Bearer {ws.env['GPUOPS_TOKEN']}"}

    def decided() -> bool:  # the API itself, once a second: a CLI run costs a second of CPU
        found = requests.get(
            api, params={"policy": "migrate-off-down-nodes"}, headers=headers, timeout=10
        )
        return bool(found.status_code == 200 and found.json()["decisions"])

    left = ws.ran_at[failed] + bound - time.monotonic()
    try:
        wait_for(decided, max(left, 0.0), "migrate-off-down-nodes to decide on node-0", 1.0)
    except AssertionError as late:
        raise AssertionError(
            f"{late} ({bound:.0f} s after the node failed: migrate_bound_s)\n{ws.logs()}"
        ) from None
    listed = ws.run("gpuops decisions list --policy migrate-off-down-nodes --json")
    decisions: list[dict[str, str]] = json.loads(listed)["decisions"]
    assert decisions, listed
    explained = ws.run(f"gpuops decisions explain {decisions[0]['id']}").splitlines()
    # the policy's own summary first, then the decision: its verb, on which target
    assert explained[0] == "Node node-0 is down: migrating its jobs", explained
    assert explained[1] == "policy migrate-off-down-nodes decided to migrate on node=node-0"

    # the pieces run together: Prometheus scrapes the fleet's nodes through the written config
    query = f"{ws.url(9090)}/api/v1/query"
    wait_for(
        lambda: requests.get(query, params={"query": 'up{job="gpu-nodes"}'}, timeout=5).json()[
            "data"
        ]["result"],
        60,
        "Prometheus to scrape the fleet's nodes",
    )
    assert "token_sha256" in (ws.root / "var" / "api-tokens.yaml").read_text()
    status = ws.outputs["gpuops control status"]
    assert "dry_run: False" in status and "kill_switch: False" in status, status
    assert not (ws.root / "data").exists()  # Prometheus kept its data under var/
    assert (ws.root / "var" / "prometheus").is_dir()
    # the burst and the failed node of the README reach the fleet
    state = requests.get(f"{ws.url(9400)}/api/v1/state", timeout=5).json()
    assert any(n["name"] == "node-0" and n["state"] != "up" for n in state["nodes"]), state
    assert state["queue"]["default"] > 10, state["queue"]  # what scale-out-on-queue waits for


LOADED_MACHINE = 2.0
"""How many times its schedule the tour's decision may take on a loaded machine: the CI runs
three test processes on two cores, so that each process of the tour (fleet, Prometheus, engine)
may get half a core; its measured latency is 40 s alone and 60 s with five busy loops beside
it, against a schedule bound of 105 s (``migrate_bound_s``)."""


def migrate_bound_s(ws: Workspace) -> float:
    """Seconds from node-0's failure to the latest moment the shipped ``migrate-off-down-nodes``
    decides on it, from the configuration the tour runs: Prometheus sees the node down at its
    next scrape (``scrape_interval`` of job gpu-nodes; a refused connection answers at once),
    the group sees that at its next evaluation (its ``interval``), the condition holds for
    ``for``, up to ``max_pending_gap`` of failed or stale evaluations keep the timer without
    counting against it, and the first evaluation at or past ``for`` may come one interval
    later (evaluation times are grid points); times ``LOADED_MACHINE``."""
    scrape = yaml.safe_load((ws.root / "var" / "prometheus.yml").read_text())
    (nodes,) = [job for job in scrape["scrape_configs"] if job["job_name"] == "gpu-nodes"]
    scrape_s = parse_duration(nodes.get("scrape_interval") or scrape["global"]["scrape_interval"])
    rules = load_rules([ws.root / "rules" / "capacity.yaml"])
    policy = rules.policy("migrate-off-down-nodes")
    assert policy is not None, "rules/capacity.yaml has no migrate-off-down-nodes"
    (group,) = [g for g in rules.groups if g.name == policy.group]
    config = load_config(ws.root / "config" / "engine.yaml")
    gap_s = config.prometheus.freshness(group.interval_s).max_gap_s
    schedule = scrape_s + group.interval_s + policy.for_s + gap_s + group.interval_s
    return schedule * LOADED_MACHINE


def check_the_first_policy(ws: Workspace) -> None:
    """The guide's policy was decided in dry-run, then enforced, then dropped."""
    listed = json.loads(ws.run("gpuops decisions list --policy notify-long-queue --json"))
    assert {d["verdict"] for d in listed["decisions"]} == {"dry_run"}, listed
    policies = wait_for(
        lambda: "notify-long-queue" not in ws.run("gpuops rules list --json"),
        30,
        "the engine to drop the removed policy",
    )
    assert policies


def test_every_sh_line_of_the_docs_is_run_or_listed() -> None:
    """README.md and every page of docs/ with an sh block is in ``GROUPS`` (its lines run) or
    in ``LISTED_ONLY`` (every line has a reason in ``NOT_RUN``)."""
    pages = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md"))]
    with_commands = {page for page in pages if steps(page)}
    run = {document for group in GROUPS for document in group}
    assert with_commands <= run | set(LISTED_ONLY), sorted(with_commands - run - set(LISTED_ONLY))
    for document in LISTED_ONLY:
        unlisted = [s.command for s in steps(document) if not not_run(s.command)]
        assert not unlisted, f"{document}: neither run nor in NOT_RUN: {unlisted}"
    listed = {s.command for page in with_commands for s in steps(page)}
    stale = sorted(set(NOT_RUN) - listed)
    assert not stale, f"NOT_RUN names lines no document has: {stale}"


@pytest.mark.parametrize(
    ("expected", "output", "matches"),
    [
        ("OK: 1 policy", "OK: 1 policy in 1 group", True),
        ("  clear execute    2", "  clear execute                            2\n", True),
        ("clear execute 3", "clear execute 2", False),
        ('{"role":"leader","replica":"..."}', '{"role":"leader","replica":"vm"}', True),
        (
            "2026-12-06T08:41:15Z  9c2f4e1a0b3d5e67  p  fire",
            "2020-01-01T00:00:00Z  0123456789abcdef  p  fire",
            True,
        ),
    ],
)
def test_output_lines_match_as_the_docstring_says(
    expected: str, output: str, matches: bool
) -> None:
    assert output_matches(expected, output) is matches
