"""`gpuops fleet from-history` on a real Slurm's accounting: 200 short jobs of known shapes run
on a local Slurm with slurmdbd and its MariaDB, read back by the real `sacct` (JSON and
--parsable2), make a fleet file that loads, whose classes are those shapes and whose
policies-off run reproduces the history's allocation within the stated tolerance."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gpuops.cli import cli
from gpuops.sim.fleet.fleetfile import load_fleet
from gpuops.sim.history import SACCT_FIELDS
from gpuops.sim.slurmcluster import NodeSpec, SlurmCluster
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

SHAPES = {"vision": (120, 1, "sleep 1"), "nlp": (50, 2, "sleep 1"), "research": (30, 4, "sleep 1")}
"""account -> (jobs, GPUs each, command): submitted as one job array each, all at once."""


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    root = Path(tempfile.mkdtemp(prefix="gpuops-sacct-", dir="/tmp"))
    nodes = (
        NodeSpec("acct-a", gpus=16, cpus=32),
        NodeSpec("acct-b", gpus=16, cpus=32, first_minor=16),
    )
    cluster = SlurmCluster(root, nodes=nodes, accounting=True, accounts=tuple(SHAPES)).start()
    out = tmp_path_factory.mktemp("sacct")
    try:
        for account, (jobs, gpus, command) in SHAPES.items():
            cluster.submit(
                f"--array=0-{jobs - 1}",
                f"--gres=gpu:{gpus}",
                "-A",
                account,
                "--output=/dev/null",
                "--wrap",
                command,
            )
        total = sum(jobs for jobs, _, _ in SHAPES.values())

        def ended() -> bool:
            text = cluster.cmd("sacct", "-a", "-X", "-n", "--parsable2", "--format=JobID,State")
            states = [line.split("|")[1] for line in text.splitlines() if line]
            return len(states) == total and all(s == "COMPLETED" for s in states)

        wait_for(ended, timeout=120, what=f"sacct to list {total} completed jobs", interval=0.5)
        files = {"json": out / "sacct.json", "parsable": out / "sacct.txt"}
        files["json"].write_text(cluster.cmd("sacct", "-a", "-X", "--json"))
        files["parsable"].write_text(
            cluster.cmd("sacct", "-a", "-X", "--parsable2", f"--format={SACCT_FIELDS}")
        )
        yield files
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("kind", ["json", "parsable"])
def test_fleet_from_real_accounting(history: dict[str, Path], kind: str, tmp_path: Path) -> None:
    out = tmp_path / "fleet.yaml"
    result = CliRunner().invoke(
        cli,
        ["fleet", "from-history", str(history[kind]), "--pool", "gpu=A100:2x16", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    config = load_fleet(out)
    assert [p.name for p in config.pools] == ["gpu"]
    doc = yaml.safe_load(out.read_text())
    classes = {c["project"]: c for c in doc["job_classes"]}
    assert set(classes) == set(SHAPES)
    for account, (jobs, gpus, _) in SHAPES.items():
        c = classes[account]
        assert c["gpus"] == {gpus: jobs}
        assert sum(b["jobs"] for b in c["bursts"]) + c["rate_per_hour"] * 0 == jobs
    rows = {line.split("  ")[1]: line for line in result.output.splitlines() if "  " in line}
    assert "within" in rows["allocation"], result.output
    assert "within" in rows["queue wait mean"], result.output
