"""The evaluation cycle at fleet scale against a real Prometheus: the table.

A synthetic fleet of N GPUs (4 per node; 40% idle but allocated, 10% underused, 40% busy, 10%
free; 1% of nodes down; 7 series per GPU plus ``up`` per node, ~72k series at 10k GPUs) is
written into a real Prometheus through its remote-write receiver by a child process: 30
minutes of history (the longest window of the policies) at 30 s steps (60 s above 20k GPUs),
two requests at a time, then the present every 15 s. The policies are
the 4 shipped ones plus 20 of the same shape (10 like reclaim, 10 like downclock, dry-run), with
``for`` shortened to 1 minute so that the fire round comes within the run; the same policies,
exported with ``gpuops rules export``, are loaded into the same Prometheus, which evaluates them
in the same run. Shipped guardrails: ``global_max_per_hour: 100``.

Each round evaluates every group once in turn (the engine's own client, SQLite state file and
fsync'd audit spool; executors are no-ops), and reads Prometheus' own
``prometheus_rule_group_last_duration_seconds``. Both are scaled to one 30 s round (a 15 s
group counts twice). Prints per round: engine wall, Prometheus' evaluation, the ratio, engine
CPU (and per GPU), decisions, RSS; then the summary row per fleet size. Never fails on noise.

The steady figures are those of every round after the fire round (CPU: their mean; wall and
Prometheus: medians), the gate's work included (``wait_idle``), as in ``bench_round``: the
default 14 rounds reach past ``gpuops.store.sqlite.REFRESH_S`` after the fire, so the rounds in
which
stored values come due for their refresh are among them (a shorter run says it is not).

Run: ``python -m tests.benchmarks.bench_scale [--gpus 1000,10000,50000] [--rounds 14]``. The
50k fleet takes minutes on a 2-core machine (its history alone is ~11M samples): it runs
``--rounds-50k`` rounds (default 4), enough for the fire round and the one after it (where a
storm would show). ``--profile DIR`` writes a cProfile of each round's engine side.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cramjam
import requests

from gpuops.actions.registry import ExecutorRegistry
from gpuops.audit import AuditLog, AuditSettings
from gpuops.model.decisions import Decision
from gpuops.model.rules.export import export_rules
from gpuops.model.rules.loader import load_rules
from gpuops.runtime import collect_less
from gpuops.runtime.metrics import EngineMetrics
from gpuops.settings import GuardrailSettings, PrometheusSettings
from gpuops.sim.fleet.remotewrite import _field, encode_labels, encode_sample
from gpuops.sources.promproc import PrometheusServer
from gpuops.store.sql.policy_seen import REFRESH_S
from tests.builders import build_engine

ROOT = Path(__file__).resolve().parents[2]
ROUND_S = 30.0
SPOOL_BYTES = 8 << 30
"""The audit spool's bound here: the fire round at 50,000 GPUs writes ~420 MB of documents
(most of them dry-run records), past the default 256 MiB, and nothing ships them (no
Elasticsearch in this benchmark)."""
HISTORY_MIN = 30.0
"""Minutes of history written before the rounds: the longest window of the policies
(``max_over_time(...[30m])``), so Prometheus' own evaluation reads full windows."""
GPUS_PER_NODE = 4
PRESENT_EVERY_S = 15.0

Labels = tuple[tuple[str, str], ...]


# --- the fleet ------------------------------------------------------------------------------
def fleet(gpus: int) -> dict[Labels, float]:
    """Every series of the fleet with its (constant) value."""
    out: dict[Labels, float] = {}
    nodes = (gpus + GPUS_PER_NODE - 1) // GPUS_PER_NODE
    for n in range(nodes):
        node = f"node-{n:05d}"
        instance = f"10.{n // 65536}.{n // 256 % 256}.{n % 256}:9835"
        pool = f"pool-{n % 8}"
        down = n % 100 == 7
        out[(("__name__", "up"), ("instance", instance), ("job", "gpu-nodes"), ("node", node))] = (
            0.0 if down else 1.0
        )
        if down:
            continue  # a failed scrape: no GPU series
        for g in range(GPUS_PER_NODE):
            i = n * GPUS_PER_NODE + g
            if i >= gpus:
                break
            kind = i % 100
            util = 0.05 if kind < 40 else 0.25 if kind < 50 else 0.8 if kind < 90 else 0.0
            allocated = 1.0 if kind < 90 else 0.0
            base = (("instance", instance), ("job", "gpu-nodes"), ("node", node))
            gpu = (*base, ("pool", pool), ("uuid", f"GPU-{i:08d}"))
            for name, value in (
                ("nvml_gpu_utilization_ratio", util),
                ("gpuops_gpu_allocated", allocated),
                ("nvml_gpu_memory_used_bytes", 4e10 * util),
                ("nvml_gpu_power_watts", 100 + 500 * util),
                ("nvml_gpu_temperature_celsius", 40 + 40 * util),
                ("nvml_gpu_sm_clock_hz", 1.98e9),
                ("nvml_gpu_info", 1.0),
            ):
                out[(("__name__", name), *gpu)] = value
    for p in range(8):
        pending = 20.0 if p == 0 else 3.0
        out[(("__name__", "gpuops_queue_pending_jobs"), ("pool", f"pool-{p}"))] = pending
    return out


def write_fleet(url: str, gpus: int, minutes: float, step_s: float) -> None:
    """The child process: history, then the present every ``PRESENT_EVERY_S`` until killed.
    Values are constant per series, so a request's samples are encoded once per distinct value
    (``gpuops.sim.fleet.remotewrite`` encodes per sample: minutes for 25M samples)."""
    series = fleet(gpus)
    labels = {key: encode_labels(key) for key in series}
    session = requests.Session()
    now = time.time()
    stamps = [
        int((now - minutes * 60 + k * step_s) * 1000) for k in range(int(minutes * 60 / step_s) + 1)
    ]
    keys = list(series)
    halves = [{k: series[k] for k in keys[i::2]} for i in range(2)]

    def history(part: Mapping[Labels, float]) -> None:  # each series' samples in time order
        own = requests.Session()
        for first in range(0, len(stamps), 10):
            send(own, url, part, labels, stamps[first : first + 10])

    with ThreadPoolExecutor(2) as pool:  # Prometheus ingests two requests in parallel
        list(pool.map(history, halves))
    print("history written", flush=True)
    while True:
        time.sleep(max(0.0, PRESENT_EVERY_S - (time.time() % PRESENT_EVERY_S)))
        send(session, url, series, labels, [int(time.time() * 1000)])


def send(
    session: requests.Session,
    url: str,
    series: Mapping[Labels, float],
    labels: Mapping[Labels, bytes],
    stamps: list[int],
) -> None:
    by_value: dict[float, bytes] = {}
    out = bytearray()
    for key, value in series.items():
        samples = by_value.get(value)
        if samples is None:
            samples = by_value[value] = b"".join(encode_sample(value, t) for t in stamps)
        out += _field(1, labels[key] + samples)
    body = bytes(cramjam.snappy.compress_raw(bytes(out)))
    headers = {
        "Content-Encoding": "snappy",
        "Content-Type": "application/x-protobuf",
        "X-Prometheus-Remote-Write-Version": "0.1.0",
    }
    session.post(f"{url}/api/v1/write", data=body, headers=headers, timeout=600).raise_for_status()


# --- the policies ---------------------------------------------------------------------------
def policies(workdir: Path) -> Path:
    """The shipped policy files with ``for: 1m``, plus 20 dry-run ones of the same shape."""
    rules = workdir / "rules"
    rules.mkdir()
    for path in (ROOT / "rules").glob("*.yaml"):
        text = re.sub(r"^(\s+)for: \S+$", r"\1for: 1m", path.read_text(), flags=re.M)
        (rules / path.name).write_text(text)
    shipped = (ROOT / "rules" / "gpu-efficiency.yaml").read_text()
    for copy in range(5):
        text = re.sub(r"^(\s+)for: \S+$", r"\1for: 1m", shipped, flags=re.M)
        text = text.replace("name: gpu-efficiency", f"name: gpu-efficiency-copy{copy}")
        text = re.sub(r"- policy: (\S+)", rf"- policy: \1-copy{copy}", text)
        text = text.replace("mode: enforce", "mode: dry-run")
        doubled = text.split("rules:\n", 1)
        body = doubled[1]
        twin = re.sub(r"- policy: (\S+)", r"- policy: \1-b", body)
        (rules / f"copy{copy}.yaml").write_text(doubled[0] + "rules:\n" + body + twin)
    return rules


class Noop:
    verbs: frozenset[str] | None = None

    def __init__(self, settings: Mapping[str, Any]) -> None:
        pass

    def run(self, decision: Decision) -> Mapping[str, Any]:
        return {}


def registry() -> ExecutorRegistry:
    reg = ExecutorRegistry()
    for name in ("scheduler", "gpu-control"):
        reg.register(name, type(f"Noop_{name}", (Noop,), {"name": name}))
    return reg


# --- measuring ------------------------------------------------------------------------------
def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def prometheus_evaluation(url: str, intervals: Mapping[str, float]) -> float | None:
    """Prometheus' own last evaluation of every exported group, scaled to one 30 s round."""
    text = requests.get(f"{url}/metrics", timeout=30).text
    total, seen = 0.0, 0
    for line in text.splitlines():
        if line.startswith("prometheus_rule_group_last_duration_seconds{"):
            group = re.search(r'rule_group="[^"]*;([^"]+)"', line)
            if group is None or group.group(1) not in intervals:
                continue
            total += float(line.rsplit(" ", 1)[1]) * ROUND_S / intervals[group.group(1)]
            seen += 1
    return total if seen == len(intervals) else None


def wait_history(proc: subprocess.Popen[str], timeout: float) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        if "history written" in line:
            return
        if time.monotonic() > deadline:
            break
    raise RuntimeError(f"the fleet writer did not finish its history (exit {proc.poll()})")


def one_fleet(gpus: int, rounds: int, profile: Path | None = None) -> dict[str, float]:
    step_s = 60.0 if gpus > 20_000 else 30.0
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        work = Path(tmp)
        rules = policies(work)
        ruleset = load_rules([rules])
        (work / "exported.yml").write_text(export_rules(ruleset))
        intervals = {g.name: g.interval_s for g in ruleset.groups}
        prom_cfg = (
            "global:\n  scrape_interval: 15s\n  evaluation_interval: 30s\n"
            f"rule_files: [{work / 'exported.yml'}]\nscrape_configs: []\n"
        )
        args = ["--web.enable-remote-write-receiver", "--storage.tsdb.retention.time=1d"]
        with PrometheusServer(work / "prom", prom_cfg, extra_args=args) as prom:
            started = time.perf_counter()
            writer = subprocess.Popen(
                [sys.executable, "-m", "tests.benchmarks.bench_scale", "--write", prom.url]
                + ["--gpus", str(gpus), "--step", str(step_s)],
                stdout=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            )
            try:
                wait_history(writer, 1800)
                print(f"  {gpus} GPUs: history written in {time.perf_counter() - started:.0f} s")
                return measure(work, prom.url, rules, intervals, gpus, rounds, profile)
            finally:
                writer.terminate()
                writer.wait(timeout=30)


def measure(
    work: Path,
    url: str,
    rules: Path,
    intervals: Mapping[str, float],
    gpus: int,
    rounds: int,
    profile: Path | None = None,
) -> dict[str, float]:
    collect_less()  # as `gpuops engine run` does
    metrics = EngineMetrics.create()
    audit = AuditLog(  # no Elasticsearch: the spool keeps every document of the run
        AuditSettings(spool_dir=work / "audit", max_spool_bytes=SPOOL_BYTES),
        host_name="bench",
        registry=metrics.registry,
    )
    engine = build_engine(
        work,
        [rules],
        executors=registry(),
        metrics=metrics,
        audit_log=audit,
        # the present is written every 15 s by a child process that a loaded machine may slow
        # down: freshness is not what is measured here, so a stale result is still evaluated
        prometheus=PrometheusSettings(url=url, timeout=600, max_sample_age=1800),
        guardrails=GuardrailSettings(global_max_per_hour=100),
    )
    counted = engine.metrics.decisions
    rows: list[dict[str, float]] = []
    try:
        first = time.monotonic()
        for n in range(rounds):
            time.sleep(max(0.0, first + n * ROUND_S - time.monotonic()))  # rounds 30 s apart
            before = sum_samples(counted)
            parts = by_label(counted)
            wall = cpu = 0.0
            profiler = cProfile.Profile() if profile is not None else None
            for group in engine.rules.groups:
                w, c = time.perf_counter(), time.process_time()
                if profiler is not None:
                    profiler.enable()
                engine.evaluate_group(group)
                if profiler is not None:
                    profiler.disable()
                scale = ROUND_S / group.interval_s
                wall += (time.perf_counter() - w) * scale
                cpu += (time.process_time() - c) * scale
            if profiler is not None and profile is not None:
                profiler.dump_stats(str(profile / f"{gpus}-round{n}.prof"))
            c = time.process_time()
            engine.wait_idle(600)  # the gate's work on the round's decisions is the round's
            cpu += time.process_time() - c
            own = prometheus_evaluation(url, intervals)
            row = {
                "wall": wall,
                "prom": own if own is not None else float("nan"),
                "cpu": cpu,
                "decisions": sum_samples(counted) - before,
                "rss": rss_mib(),
            }
            rows.append(row)
            print(
                f"  round {n}: engine {wall:6.2f} s, Prometheus {row['prom']:6.2f} s "
                f"({wall / row['prom']:.2f}x), engine CPU {cpu:6.2f} s "
                f"({cpu / gpus * 1e6:5.1f} us/GPU), decisions {row['decisions']:6.0f}, "
                f"RSS {row['rss']:5.0f} MiB",
                flush=True,
            )
            if row["decisions"]:
                print(f"    {breakdown(parts, by_label(counted))}", flush=True)
    finally:
        engine.stop()
    fire = max(rows, key=lambda r: r["decisions"])
    after_fire = rows[rows.index(fire) + 1 :]
    # steady: every round after the fire (as bench_round), the rounds in which the stored
    # values come due for their refresh included; before the fire fewer targets are pending
    # and none fires (no clear_expr), so a round then is not a steady one
    steady = after_fire or rows[1:] or rows
    covers = len(after_fire) * ROUND_S > REFRESH_S
    print(
        f"  {gpus} GPUs: steady = the {len(after_fire)} rounds after the fire"
        + ("" if covers else f" (NOT covering a refresh, {REFRESH_S:.0f} s: run more rounds)"),
        flush=True,
    )
    return {
        "gpus": gpus,
        "wall": statistics.median(r["wall"] for r in steady),
        "prom": statistics.median(r["prom"] for r in steady),
        "cpu_us": statistics.mean(r["cpu"] for r in steady) / gpus * 1e6,
        "fire_wall": fire["wall"],
        "fire_decisions": fire["decisions"],
        "after_fire": max((r["decisions"] for r in after_fire), default=float("nan")),
        "rss": max(r["rss"] for r in rows),
    }


def sum_samples(counter: Any) -> float:
    return sum(by_label(counter).values())


def by_label(counter: Any) -> dict[tuple[str, ...], float]:
    """The counter's ``_total`` samples by their label values."""
    return {
        tuple(s.labels.values()): s.value
        for m in counter.collect()
        for s in m.samples
        if s.name.endswith("_total")
    }


def breakdown(
    before: Mapping[tuple[str, ...], float], after: Mapping[tuple[str, ...], float]
) -> str:
    """The largest parts of a round's decisions, by policy, transition and verdict."""
    parts = sorted(((v - before.get(k, 0.0), k) for k, v in after.items()), reverse=True)
    return ", ".join(f"{'/'.join(k)} {n:.0f}" for n, k in parts[:4] if n > 0)


def table(results: list[dict[str, float]]) -> Iterator[str]:
    yield (
        "| GPUs | steady cycle, all groups per 30 s round | Prometheus' own evaluation | ratio |"
        " engine CPU per GPU per round (mean) | fire round: wall, decisions | most decisions in a"
        " round after it | engine RSS |"
    )
    yield "|---|---|---|---|---|---|---|---|"
    for r in results:
        yield (
            f"| {r['gpus']:,.0f} | {r['wall']:.2f} s | {r['prom']:.2f} s |"
            f" {r['wall'] / r['prom']:.2f}x | {r['cpu_us']:.1f} us | {r['fire_wall']:.1f} s,"
            f" {r['fire_decisions']:,.0f} | {r['after_fire']:,.0f} | {r['rss']:.0f} MiB |"
        )


def other_figures() -> Iterator[str]:
    """The audit and exporter rows of the table, from their own benchmarks when they are
    there."""
    try:
        from tests.benchmarks import bench_audit, bench_exporter
    except ImportError:
        return
    for gpus, scrapes in ((8, 200), (64, 50)):
        m = bench_exporter.measure(gpus, scrapes)
        goal = 1 if gpus == 8 else 8
        yield f"exporter CPU per scrape, {gpus} fake GPUs: {m['own']:.2f} ms (goal <= {goal} ms)"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bench_audit.throughput(20_000, batch=250, threads=4, validate=True, uniform=False)
    for line in out.getvalue().splitlines():
        yield f"audit, {line.strip()}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", default="1000,10000,50000")
    parser.add_argument("--rounds", type=int, default=14)
    parser.add_argument("--rounds-50k", type=int, default=4)
    parser.add_argument("--no-others", action="store_true", help="skip the audit and exporter rows")
    parser.add_argument("--profile", type=Path, help="write a cProfile of each round here")
    parser.add_argument("--write", help=argparse.SUPPRESS)
    parser.add_argument("--step", type=float, default=30.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write:
        write_fleet(args.write, int(args.gpus), HISTORY_MIN, args.step)
        return
    print(f"machine: {os.cpu_count()} CPUs, {os.uname().machine}, Python {sys.version.split()[0]}")
    results = []
    for gpus in (int(g) for g in args.gpus.split(",")):
        rounds = args.rounds_50k if gpus > 20_000 else args.rounds
        results.append(one_fleet(gpus, rounds, args.profile))
    print()
    for line in table(results):
        print(line)
    if not args.no_others:
        print()
        for line in other_figures():
            print(line, flush=True)


if __name__ == "__main__":
    main()
