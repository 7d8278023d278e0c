"""A cluster's job history read into one shape: Slurm's accounting (``sacct --json``, and
``sacct --parsable2`` with the fields ``SACCT_FIELDS``) and job-level traces in CSV with named
columns (Helios' by default; a column map for Philly's, Alibaba PAI's or a site's own).

Read by ``gpuops.sim.fromhistory`` (``gpuops fleet from-history``), which derives a fleet file
from the records. Pure parsing: every problem names the file, the line (or the job) and the
field.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


class HistoryError(ValueError):
    """A history that cannot be read; the message names file, line or job, and field."""


@dataclass(frozen=True)
class JobRecord:
    """One job of the history. Times are Unix seconds; ``start``/``end`` None: never started
    or not ended within the history."""

    job_id: str
    project: str
    """The account (Slurm), the virtual cluster (Helios), the team: whose quota it used."""
    pool: str
    """The partition it ran in (a trace without partitions: one pool)."""
    gpus: int
    nodes: int
    state: str
    submit: float
    start: float | None
    end: float | None
    user: str = ""

    @property
    def wait_s(self) -> float | None:
        return None if self.start is None else max(self.start - self.submit, 0.0)

    @property
    def run_s(self) -> float | None:
        if self.start is None or self.end is None:
            return None
        return max(self.end - self.start, 0.0)


SACCT_FIELDS = "JobID,User,Account,Partition,AllocTRES,NNodes,State,Submit,Start,End"
"""The fields ``sacct --parsable2`` must be asked for (``--format``), in any order: for
example ``sacct -a -X --parsable2 --format=JobID,User,Account,Partition,AllocTRES,NNodes,State,
Submit,Start,End -S 2026-11-01 -E 2026-12-01``."""

HELIOS_COLUMNS: Mapping[str, str] = {
    "job_id": "job_id",
    "user": "user",
    "project": "vc",
    "gpus": "gpu_num",
    "nodes": "node_num",
    "state": "state",
    "submit": "submit_time",
    "start": "start_time",
    "end": "end_time",
}
"""Helios' column names (Hu et al., SC'21, ``cluster_log.csv``) for each field; the default
column map of a CSV trace. ``pool`` is optional (one pool named ``default`` without it)."""

_REQUIRED = ("job_id", "project", "gpus", "submit")
_UNSET = ("", "unknown", "none", "null", "nan", "n/a")


def _time(value: Any, where: str) -> float | None:
    """Unix seconds from a number, or a ``YYYY-MM-DD[T ]HH:MM:SS`` date (UTC); None when unset."""
    if isinstance(value, dict):  # Slurm 23+: {"set": bool, "infinite": bool, "number": n}
        return float(value["number"]) if value.get("set") and not value.get("infinite") else None
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if value > 0 else None
    text = str(value).strip()
    if text.lower() in _UNSET:
        return None
    try:
        number = float(text)
    except ValueError:
        pass
    else:
        return number if number > 0 else None
    try:
        at = datetime.fromisoformat(text.replace(" ", "T"))
    except ValueError:
        raise HistoryError(f"{where}: {text!r} is neither Unix seconds nor a date") from None
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def _count(value: Any, where: str, default: int | None = None) -> int:
    text = str(value).strip() if value is not None else ""
    if text.lower() in _UNSET and default is not None:
        return default
    try:
        number = float(text)
    except ValueError:
        raise HistoryError(f"{where}: {text!r} is not a count") from None
    if number < 0 or not number.is_integer():
        raise HistoryError(f"{where}: {text!r} is not a count")
    return int(number)


_TRES_GPU = re.compile(r"(?:^|,)gres/gpu(?::[^=,]*)?=(\d+)")


def _tres_gpus(tres: str) -> int:
    """GPUs in a TRES string (``cpu=2,gres/gpu=4,node=1``; typed ``gres/gpu:a100=4`` too,
    without counting the untyped total twice)."""
    typed = re.findall(r"(?:^|,)gres/gpu:[^=,]+=(\d+)", tres)
    if typed:
        return sum(int(n) for n in typed)
    found = _TRES_GPU.search(tres)
    return int(found.group(1)) if found else 0


def read_sacct_json(text: str, source: str) -> list[JobRecord]:
    """Jobs of ``sacct --json`` (Slurm 22.05's shape and the later one), allocations only
    (steps are ignored); jobs without GPUs are left out."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HistoryError(f"{source}:{exc.lineno}: not JSON: {exc.msg}") from None
    jobs = doc.get("jobs") if isinstance(doc, dict) else None
    if not isinstance(jobs, list):
        raise HistoryError(f'{source}: no "jobs" list (is it sacct --json output?)')
    out: list[JobRecord] = []
    for i, job in enumerate(jobs):
        where = f"{source}: jobs[{i}]"
        try:
            job_id = str(job["job_id"])
            where = f"{source}: job {job_id}"
            times = job["time"]
            state = job.get("state", {}).get("current", "")
            allocated = job.get("tres", {}).get("allocated", [])
        except (KeyError, TypeError, AttributeError) as exc:
            raise HistoryError(f"{where}: missing {exc}") from None
        gpus = sum(
            int(t.get("count", 0))
            for t in allocated
            if t.get("type") == "gres" and str(t.get("name", "")).split(":")[0] == "gpu"
        )
        if gpus == 0:
            continue
        nodes = job.get("allocation_nodes", 1)
        out.append(
            JobRecord(
                job_id=job_id,
                project=str(job.get("account") or "default"),
                pool=str(job.get("partition") or "default"),
                gpus=gpus,
                nodes=max(
                    _count(
                        nodes.get("number") if isinstance(nodes, dict) else nodes,
                        f"{where}: allocation_nodes",
                        1,
                    ),
                    1,
                ),
                state=str(state[0] if isinstance(state, list) and state else state),
                submit=_time(times.get("submission"), f"{where}: time.submission") or 0.0,
                start=_time(times.get("start"), f"{where}: time.start"),
                end=_time(times.get("end"), f"{where}: time.end"),
                user=str(job.get("user") or ""),
            )
        )
    return out


def read_sacct_parsable(text: str, source: str) -> list[JobRecord]:
    """Jobs of ``sacct --parsable2`` with a header line and the fields of ``SACCT_FIELDS``;
    job steps (``123.batch``, ``123.0``) and jobs without GPUs are left out."""
    lines = text.splitlines()
    if not lines:
        raise HistoryError(f"{source}:1: empty (sacct --parsable2 output has a header line)")
    header = lines[0].split("|")
    missing = [f for f in SACCT_FIELDS.split(",") if f not in header]
    if missing:
        raise HistoryError(
            f"{source}:1: missing fields {', '.join(missing)}; "
            f"ask sacct for --format={SACCT_FIELDS}"
        )
    at = {name: header.index(name) for name in SACCT_FIELDS.split(",")}
    out: list[JobRecord] = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cells = line.split("|")
        if len(cells) != len(header):
            raise HistoryError(
                f"{source}:{number}: {len(cells)} fields where the header has {len(header)}"
            )
        row = {name: cells[i] for name, i in at.items()}
        if "." in row["JobID"]:
            continue  # a step of a job listed on its own line
        gpus = _tres_gpus(row["AllocTRES"])
        if gpus == 0:
            continue
        where = f"{source}:{number}"
        out.append(
            JobRecord(
                job_id=row["JobID"],
                project=row["Account"] or "default",
                pool=row["Partition"] or "default",
                gpus=gpus,
                nodes=max(_count(row["NNodes"], f"{where}: NNodes", 1), 1),
                state=row["State"].split(" ")[0],
                submit=_time(row["Submit"], f"{where}: Submit") or 0.0,
                start=_time(row["Start"], f"{where}: Start"),
                end=_time(row["End"], f"{where}: End"),
                user=row["User"],
            )
        )
    return out


def column_map(pairs: Iterable[str], source: str = "--column") -> dict[str, str]:
    """``field=column`` pairs over Helios' map (``project=team``, ``submit=submitted_at``)."""
    columns = dict(HELIOS_COLUMNS)
    for pair in pairs:
        field, sep, column = pair.partition("=")
        if not sep or not column:
            raise HistoryError(f"{source}: {pair!r} is not FIELD=COLUMN")
        if field not in (*HELIOS_COLUMNS, "pool"):
            known = ", ".join([*HELIOS_COLUMNS, "pool"])
            raise HistoryError(f"{source}: {field!r} is not a field; fields: {known}")
        columns[field] = column
    return columns


def read_csv(
    text: str, source: str, columns: Mapping[str, str] = HELIOS_COLUMNS
) -> list[JobRecord]:
    """Jobs of a CSV trace with a header line, each field read from its column in
    ``columns``; jobs with 0 GPUs are left out."""
    reader = csv.DictReader(io.StringIO(text))
    header = set(reader.fieldnames or ())
    missing = [f"{f} ({columns[f]})" for f in _REQUIRED if columns.get(f) not in header]
    if missing:
        raise HistoryError(
            f"{source}:1: no column for {', '.join(missing)}; map them with --column FIELD=COLUMN"
        )

    def get(row: dict[str, str], field: str) -> str:
        name = columns.get(field)
        return row.get(name, "") if name else ""

    out: list[JobRecord] = []
    for number, row in enumerate(reader, start=2):
        where = f"{source}:{number}"
        gpus = _count(get(row, "gpus"), f"{where}: {columns['gpus']}")
        if gpus == 0:
            continue
        submit = _time(get(row, "submit"), f"{where}: {columns['submit']}")
        if submit is None:
            raise HistoryError(f"{where}: {columns['submit']}: no submit time")
        out.append(
            JobRecord(
                job_id=get(row, "job_id"),
                project=get(row, "project") or "default",
                pool=get(row, "pool") or "default",
                gpus=gpus,
                nodes=max(_count(get(row, "nodes"), f"{where}: {columns.get('nodes')}", 1), 1),
                state=get(row, "state").upper(),
                submit=submit,
                start=_time(get(row, "start"), f"{where}: {columns.get('start')}"),
                end=_time(get(row, "end"), f"{where}: {columns.get('end')}"),
                user=get(row, "user"),
            )
        )
    return out


def read_history(
    text: str, source: str, columns: Mapping[str, str] = HELIOS_COLUMNS
) -> list[JobRecord]:
    """Any of the three shapes, told apart by their first character and header line."""
    head = text.lstrip()[:1]
    if head == "{":
        return read_sacct_json(text, source)
    first = text.split("\n", 1)[0]
    if "|" in first and "JobID" in first:
        return read_sacct_parsable(text, source)
    return read_csv(text, source, columns)
