"""A cluster's job history read from sacct's JSON and --parsable2 output and CSV traces, and the
fleet file derived from it: every shape read alike, every bad input named by file, line (or
job) and field."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gpuops.sim.fleet.fleetfile import parse_fleet
from gpuops.sim.fromhistory import (
    Calibration,
    Observed,
    PoolShape,
    derive,
    fleet_yaml,
    observed,
    parse_pool,
)
from gpuops.sim.history import (
    HistoryError,
    JobRecord,
    column_map,
    read_csv,
    read_history,
    read_sacct_json,
    read_sacct_parsable,
)

PARSABLE = """\
JobID|User|Account|Partition|AllocTRES|NNodes|State|Submit|Start|End
7|ann|vision|gpu|billing=1,cpu=1,gres/gpu=2,node=1|1|COMPLETED|2026-12-06T10:00:00|2026-12-06T10:00:10|2026-12-06T10:01:10
7.batch|ann|vision||cpu=1,gres/gpu=2,node=1|1|COMPLETED|2026-12-06T10:00:10|2026-12-06T10:00:10|2026-12-06T10:01:10
8|bob|nlp|gpu|cpu=4,gres/gpu:a100=4,gres/gpu=4,node=1|1|CANCELLED by 0|2026-12-06T10:00:30|\
Unknown|Unknown
9|bob|nlp|cpu|cpu=4,node=1|1|COMPLETED|2026-12-06T10:00:30|2026-12-06T10:00:31|2026-12-06T10:00:40
"""

SACCT_JSON = {
    "jobs": [
        {
            "job_id": 7,
            "user": "ann",
            "account": "vision",
            "partition": "gpu",
            "allocation_nodes": 1,
            "state": {"current": "COMPLETED", "reason": "None"},
            "time": {"submission": 1796551200, "start": 1796551210, "end": 1796551270},
            "tres": {
                "allocated": [
                    {"type": "cpu", "name": None, "count": 1},
                    {"type": "gres", "name": "gpu", "count": 2},
                ]
            },
        },
        {  # Slurm 23's shape: a list of states, times as {set, number}
            "job_id": 8,
            "user": "bob",
            "account": "nlp",
            "partition": "gpu",
            "allocation_nodes": 1,
            "state": {"current": ["CANCELLED"], "reason": "None"},
            "time": {
                "submission": 1796551230,
                "start": {"set": False, "infinite": False, "number": 0},
                "end": {"set": False, "infinite": False, "number": 0},
            },
            "tres": {"allocated": [{"type": "gres", "name": "gpu:a100", "count": 4}]},
        },
        {
            "job_id": 9,
            "account": "nlp",
            "partition": "cpu",
            "time": {"submission": 1796551230, "start": 1796551231, "end": 1796551240},
            "tres": {"allocated": [{"type": "cpu", "name": None, "count": 4}]},
        },
    ]
}

EXPECTED = [
    JobRecord(
        "7", "vision", "gpu", 2, 1, "COMPLETED", 1796551200.0, 1796551210.0, 1796551270.0, "ann"
    ),
    JobRecord("8", "nlp", "gpu", 4, 1, "CANCELLED", 1796551230.0, None, None, "bob"),
]


def test_sacct_parsable_and_json_read_alike() -> None:
    assert read_sacct_parsable(PARSABLE, "s.txt") == EXPECTED
    assert read_sacct_json(json.dumps(SACCT_JSON), "s.json") == EXPECTED
    assert read_history(PARSABLE, "s.txt") == EXPECTED
    assert read_history(json.dumps(SACCT_JSON), "s.json") == EXPECTED


def test_helios_csv_and_a_column_map() -> None:
    helios = (
        "job_id,user,vc,gpu_num,node_num,state,submit_time,start_time,end_time\n"
        "j1,u1,vcA,8,1,COMPLETED,2020-04-01 00:00:00,2020-04-01 00:00:30,2020-04-01 01:00:30\n"
        "j2,u1,vcA,0,1,COMPLETED,2020-04-01 00:00:00,2020-04-01 00:00:30,2020-04-01 01:00:30\n"
    )
    (job,) = read_csv(helios, "h.csv")
    assert (job.project, job.pool, job.gpus, job.wait_s, job.run_s) == (
        "vcA",
        "default",
        8,
        30.0,
        3600.0,
    )
    other = "id,team,gpus,submitted,started,ended,queue\nx,t,2,100,160,220,p1\n"
    columns = column_map(
        [
            "job_id=id",
            "project=team",
            "gpus=gpus",
            "submit=submitted",
            "start=started",
            "end=ended",
            "pool=queue",
        ]
    )
    (job,) = read_history(other, "o.csv", columns)
    assert (job.job_id, job.project, job.pool, job.gpus, job.submit, job.end) == (
        "x",
        "t",
        "p1",
        2,
        100.0,
        220.0,
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("JobID|User|State\n1|a|COMPLETED\n", "s.txt:1: missing fields Account, Partition"),
        (
            PARSABLE.replace("|1|CANCELLED", "|one|CANCELLED"),
            "s.txt:4: NNodes: 'one' is not a count",
        ),
        (
            PARSABLE.replace("2026-12-06T10:00:30|Unknown", "yesterday|Unknown"),
            "s.txt:4: Submit: 'yesterday' is neither Unix seconds nor a date",
        ),
        (PARSABLE + "10|a|b|gpu\n", "s.txt:6: 4 fields where the header has 10"),
        ('{"jobs": [{"job_id": 3}]}', "s.txt: job 3: missing 'time'"),
        ("job_id,vc,gpu_num\n1,a,1\n", "s.txt:1: no column for submit (submit_time)"),
        ("job_id,vc,gpu_num,submit_time\n1,a,1.5,100\n", "s.txt:2: gpu_num: '1.5' is not a count"),
    ],
)
def test_bad_history_names_file_line_and_field(text: str, message: str) -> None:
    with pytest.raises(HistoryError) as info:
        read_history(text, "s.txt")
    assert message in str(info.value)


def test_column_map_and_pool_refuse_what_they_cannot_use() -> None:
    with pytest.raises(HistoryError, match="'colour' is not a field"):
        column_map(["colour=red"])
    with pytest.raises(HistoryError, match="is not FIELD=COLUMN"):
        column_map(["project"])
    assert parse_pool("gpu=H100:4x8") == PoolShape("gpu", "H100", 4, 8)
    with pytest.raises(HistoryError, match="model 'B200' is unknown"):
        parse_pool("gpu=B200:4x8")
    with pytest.raises(HistoryError, match="use PARTITION=MODEL:NODESxGPUS"):
        parse_pool("gpu:4x8")


def _job(i: int, project: str, gpus: int, submit: float, start: float, run: float) -> JobRecord:
    return JobRecord(str(i), project, "gpu", gpus, 1, "COMPLETED", submit, start, start + run)


def test_derived_fleet_loads_with_bursts_rates_sizes_and_durations() -> None:
    t0 = 1796551200.0  # 2026-12-06 10:00:00 UTC
    burst = [_job(i, "vision", 1, t0, t0 + 5, 100.0) for i in range(6)]
    spread = [
        _job(10 + i, "nlp", 2 if i % 2 else 4, t0 + 600 * i, t0 + 600 * i, 200.0) for i in range(7)
    ]
    pools = [PoolShape("gpu", "A100", 2, 8)]
    doc = derive(burst + spread, pools, "site", "h.csv")
    config = parse_fleet(fleet_yaml(doc), "derived.yaml")
    classes = {c.project: c for c in config.job_classes}
    assert classes["vision"].bursts[0].jobs == 6
    assert classes["vision"].rate_per_hour == 0
    assert classes["nlp"].rate_per_hour == pytest.approx(7 / 1.0)  # 7 over the hour submitted
    assert dict(classes["nlp"].gpus) == {2: 3, 4: 4}
    assert classes["nlp"].duration_median_s == 200.0
    assert config.start_hour == pytest.approx(10.0 - 1 / 3600, abs=1e-5)
    assert config.initial_jobs == ()
    with pytest.raises(HistoryError, match="jobs ran in cpu; describe each with --pool"):
        derive([*burst, replace(burst[0], pool="cpu")], pools, "site", "h.csv")


def test_a_history_submitted_in_one_second_is_bursts_not_a_rate() -> None:
    """Two and three jobs submitted in the same second (fewer than a burst's five) have no span
    to take a rate over: a rate over the one second would be thousands an hour."""
    t0 = 1796551200.0
    jobs = [_job(i, "a", 1, t0 + 0.2, t0 + 5, 600.0) for i in range(2)]
    jobs += [_job(10 + i, "b", 2, t0 + 0.7, t0 + 5, 600.0) for i in range(3)]
    doc = derive(jobs, [PoolShape("gpu", "A100", 1, 8)], "site", "h.txt")
    classes = {c.project: c for c in parse_fleet(fleet_yaml(doc), "d.yaml").job_classes}
    assert classes["a"].rate_per_hour == 0 and [b.jobs for b in classes["a"].bursts] == [2]
    assert classes["b"].rate_per_hour == 0 and [b.jobs for b in classes["b"].bursts] == [3]


def test_history_figures_and_the_tolerance() -> None:
    t0 = 1796551200.0
    jobs = [_job(1, "a", 4, t0, t0 + 10, 90.0), _job(2, "a", 4, t0, t0 + 30, 70.0)]
    seen = observed(jobs, [PoolShape("gpu", "A100", 1, 8)])
    assert seen.allocation == pytest.approx((4 * 90 + 4 * 70) / (8 * 100))
    assert (seen.wait_mean_s, seen.jct_mean_s, seen.jobs) == (20.0, 100.0, 2)
    close = Calibration(seen, Observed(0.84, 34.0, 90.0, 2))
    assert close.allocation_ok() and close.wait_ok()
    far = Calibration(seen, Observed(0.70, 36.0, 90.0, 2))
    assert not far.allocation_ok() and not far.wait_ok()
    assert "OUTSIDE ±5 pt" in far.table()


def test_the_shipped_history_calibrates_as_docs_whatif_shows() -> None:
    """examples/history/slurm-sacct.txt (real sacct output) makes the fleet and the
    calibration rows docs/whatif.md prints."""
    from pathlib import Path

    from gpuops.sim.fromhistory import calibrate

    repo = Path(__file__).parents[3]
    path = repo / "examples" / "history" / "slurm-sacct.txt"
    records = read_history(path.read_text(), str(path))
    pools = [parse_pool("gpu=A100:2x16")]
    _config, calibration = calibrate(records, pools, derive(records, pools, "x", "h"), "h")
    assert calibration.allocation_ok() and calibration.wait_ok()
    doc = (repo / "docs" / "whatif.md").read_text()
    rows = [line.strip() for line in calibration.table().splitlines()[1:3]]
    for row in rows:
        assert row in doc, row
