"""Backtest against real cluster history: a week of the Helios vchbv virtual cluster (the example
data in examples/helios-earth, loaded by default) loaded into a real Prometheus (promtool
blocks), the shipped scale-out policy run over it, and its decisions compared with the ones
computed straight from the CSV."""

from __future__ import annotations

import csv
import gzip
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpuops.cli import cli

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "examples" / "helios-earth"
START, END = "2020-05-07T00:00:00Z", "2020-05-10T23:59:00Z"


def expected_transitions(path: Path, start: float, end: float) -> list[tuple[float, str]]:
    """scale-out-on-queue (`> 10` for 2m) over 1-minute samples: the first fire of each episode
    and its clear (repeats depend on repeat_interval and the guardrails; checked apart)."""
    minutes = []
    with gzip.open(path, "rt", newline="") as f:
        for row in csv.DictReader(f):
            at = datetime.strptime(row["time"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
            if start <= at.timestamp() <= end:
                minutes.append((at.timestamp(), int(row["pending_job_num"]) > 10))
    out: list[tuple[float, str]] = []
    run: list[float] = []
    for at, above in [*minutes, (end + 60, False)]:
        if above:
            run.append(at)
            continue
        if len(run) >= 3:
            out.append((run[2], "fire"))
            if at <= end:
                out.append((at, "clear"))
        run = []
    return out


def test_scale_out_backtest_matches_the_csv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    tsdb = tmp_path / "tsdb"
    monkeypatch.chdir(REPO)  # where the README runs it: the default --data-dir is the example
    loaded = runner.invoke(
        cli,
        [
            "backtest",
            "load-helios",
            "--vc",
            "vchbv",
            "--tsdb",
            str(tsdb),
            "--start",
            START,
            "--end",
            END,
        ],
    )
    assert loaded.exit_code == 0, loaded.output
    result = runner.invoke(
        cli,
        [
            "backtest",
            "run",
            str(REPO / "rules" / "capacity.yaml"),
            "--tsdb",
            str(tsdb),
            "--start",
            START,
            "--end",
            END,
            "--policy",
            "scale-out-on-queue",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    (report,) = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]

    def at(d: dict[str, str]) -> float:
        return datetime.fromisoformat(d["at"].replace("Z", "+00:00")).timestamp()

    decisions = report["decisions"]
    got = [
        (at(d), d["transition"])
        for d in decisions
        if d["transition"] == "clear" or d["repeat"] == 0
    ]
    start = datetime.fromisoformat(START.replace("Z", "+00:00")).timestamp()
    end = datetime.fromisoformat(END.replace("Z", "+00:00")).timestamp()
    expected = expected_transitions(DATA / "vchbv.csv.gz", start, end)
    assert len(expected) > 10  # the week has queueing episodes worth testing
    assert got == expected
    # every later decision of an episode (repeat_interval, a fire held back by the cooldown)
    # falls inside an episode: between its first fire and its clear
    episodes = list(zip(expected[::2], expected[1::2], strict=False))
    repeats = [at(d) for d in decisions if d["transition"] == "fire" and d["repeat"] > 0]
    assert repeats, "the week has episodes long enough to act again"
    assert all(any(f[0] < t < c[0] for f, c in episodes) for t in repeats)
    assert all(d["target"] == "pool=vchbv" for d in report["decisions"])
