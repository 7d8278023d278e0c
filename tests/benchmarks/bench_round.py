"""The engine's own CPU in a steady round of ``bench_scale``'s 24 policies, without
Prometheus: a loopback HTTP server in a child process answers every query at once with what a
real Prometheus gives for the synthetic fleet of ``bench_scale`` (its idle, underused and busy
GPUs, down nodes and queues, as JSON bytes made once), so what is measured is the engine's
side only: HTTP, decoding, freshness, evaluation, state compare, judgement, SQLite. With
``--churn F`` (default 0.01) that fraction of the GPUs changes between idle and busy every
round after the fire, so the answers' series change (``--churn 0``: the same series every
round, a best case). ``--churn-mode stay`` (the default): each GPU that changes stays changed
for a number of rounds drawn from a seeded distribution (mean ``--stay``, default 4; most
longer than the policies' ``for``), then goes back (``Stays``): in most rounds some pending
targets reach ``for`` and fire (through the one gate, with the guardrails and budgets as they
are) and some firing ones clear. ``--churn-mode flip``: the same GPUs back and forth every
other round (their targets leave before ``for``: the churn path's best case). Every series'
value moves a little every round (0.1 + round / 10,000, the same for all), as Prometheus'
values do, so the states' values and the decisions' evidence change.

Prints per round: wall, engine CPU and CPU per GPU; with ``--profile FILE`` the cProfile of
the steady rounds, in the evaluating thread's CPU time (``time.thread_time``: not the waits on
Prometheus and fsync). The steady figure is the mean over every round after the fire round
(round 2), the rounds in which stored values come due for their refresh
(``gpuops.store.sqlite.REFRESH_S`` after the fire) included: the default 14 rounds reach past it (a
shorter run says so). Never fails on noise.

Run: ``python -m tests.benchmarks.bench_round [--gpus 10000] [--rounds 14] [--churn 0.01]
[--churn-mode stay|flip] [--stay 4]``.
"""

from __future__ import annotations

import argparse
import cProfile
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import orjson

from gpuops.audit import AuditLog, AuditSettings
from gpuops.model.rules.loader import load_rules
from gpuops.runtime import collect_less
from gpuops.runtime.metrics import EngineMetrics
from gpuops.settings import GuardrailSettings, PrometheusSettings
from gpuops.store.sql.policy_seen import REFRESH_S
from tests.benchmarks.bench_scale import (
    ROOT,
    SPOOL_BYTES,
    fleet,
    policies,
    registry,
    rss_mib,
    sum_samples,
)
from tests.builders import build_engine


def answers(gpus: int) -> dict[str, list[dict[str, Any]]]:
    """The series of each kind of query for the fleet (labels only; values set when served)."""
    by_kind: dict[str, list[dict[str, Any]]] = {"idle": [], "under": [], "busy": [], "down": []}
    by_kind["queue"] = []
    for labels, value in fleet(gpus).items():
        metric = dict(labels)
        name = metric["__name__"]
        if name == "up" and value == 0.0:
            by_kind["down"].append(metric)
        elif name == "gpuops_queue_pending_jobs" and value > 10:
            by_kind["queue"].append({"pool": metric["pool"]})
        elif name == "nvml_gpu_utilization_ratio":
            del metric["__name__"]
            kind = "idle" if value < 0.2 else "under" if value < 0.3 else "busy" if value else ""
            if kind:
                by_kind[kind].append(metric)
    return by_kind


STAY_ROUNDS = 4.0
"""``--churn-mode stay``: the mean number of rounds a GPU that changed stays changed."""


class Stays:
    """``--churn-mode stay``: from round 3 on (after the fire), every round ``flip`` of the
    idle GPUs that are as they were turn busy and as many busy ones turn idle, each for a
    number of rounds drawn from a seeded distribution (1 + an exponential of mean
    ``stay - 1``, at most 30: most stay longer than the policies' ``for: 1m``, two rounds),
    then go back. So in most rounds some pending targets reach ``for`` (a GPU that turned
    idle and stayed: a fire), some firing ones clear (one that turned busy, or went back),
    some new ones come and some leave before ``for``. Each answer keeps the fleet's order
    (a GPU that comes back comes back in its place), as Prometheus' does."""

    def __init__(
        self, idle: list[dict[str, Any]], busy: list[dict[str, Any]], flip: int, stay: float
    ) -> None:
        self.idle, self.busy, self.flip, self.stay = idle, busy, flip, stay
        self.rng = random.Random(15)
        self.until: dict[tuple[str, int], int] = {}  # (kind it came from, index): back then
        self.rounds: list[dict[str, list[dict[str, Any]]]] = []

    def at(self, n: int) -> dict[str, list[dict[str, Any]]]:
        """The idle and busy answers of round ``n`` (made in order, once each)."""
        while len(self.rounds) <= n:
            r = len(self.rounds)
            self.until = {k: end for k, end in self.until.items() if end > r}
            if r > 2 and self.flip:
                for kind, gpus in (("idle", self.idle), ("busy", self.busy)):
                    home = [i for i in range(len(gpus)) if (kind, i) not in self.until]
                    for i in self.rng.sample(home, min(self.flip, len(home))):
                        longer = min(30, round(self.rng.expovariate(1 / max(self.stay - 1, 0.1))))
                        self.until[kind, i] = r + 1 + longer
            moved = self.until.keys()
            idle = [(i, m) for i, m in enumerate(self.idle) if ("idle", i) not in moved]
            busy = [(i, m) for i, m in enumerate(self.busy) if ("busy", i) not in moved]
            idle += [(i, self.busy[i]) for kind, i in moved if kind == "busy"]
            busy += [(i, self.idle[i]) for kind, i in moved if kind == "idle"]
            self.rounds.append(
                {  # the fleet's order: the two kinds' GPUs interleaved by their index
                    "idle": [m for _, m in sorted(idle, key=lambda p: p[0])],
                    "busy": [m for _, m in sorted(busy, key=lambda p: p[0])],
                }
            )
        return self.rounds[n]


KINDS: tuple[tuple[str, Callable[[str], bool]], ...] = (
    ("queue", lambda e: "gpuops_queue_pending_jobs" in e),
    ("down", lambda e: e.startswith(('up{job="gpu-nodes"}', "count(up"))),
    # downclock's expr says "unless max_over_time(...[30m])" too: [10m] tells it apart
    ("under", lambda e: "[10m]" in e and "gpuops_queue" not in e),
    ("idle", lambda e: "max_over_time" in e and "[10m]" not in e),
    ("busy", lambda e: "[2m]" in e and "max_over_time" not in e),
    ("population", lambda e: e.startswith(("group by", "count(group by"))),
)
"""How the canned server tells the policies' queries apart (their answers: ``answers``); an
expression that is none of them, or more than one, is refused (``kind_of``): a rule edit
that changes a query must change this too, not silently change the workload (a new
expression answered as another policy's would)."""


def kind_of(expr: str) -> str:
    """The kind of answer ``expr`` gets (``KINDS``), or ``UnknownQuery``."""
    kinds = [name for name, test in KINDS if test(expr)]
    if len(kinds) != 1:
        raise UnknownQuery(f"{expr!r} matches {kinds or 'no kind'} of the canned answers")
    return kinds[0]


class UnknownQuery(Exception):
    """A query the canned server has no answer for (``kind_of``)."""


class Canned(ThreadingHTTPServer):
    """Answers /api/v1/query like Prometheus for ``bench_scale``'s policies."""

    daemon_threads = True

    def __init__(
        self,
        gpus: int,
        churn: float = 0.0,
        start: float = 0.0,
        mode: str = "stay",
        stay: float = STAY_ROUNDS,
    ) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.kinds = answers(gpus)
        self.start = start
        self.mode = mode
        flip = round(gpus * churn / 2)  # as many idle GPUs turn busy as busy ones idle
        idle, busy = self.kinds["idle"], self.kinds["busy"]
        self.flipped = {
            **self.kinds,
            "idle": idle[flip:] + busy[:flip],
            "busy": busy[flip:] + idle[:flip],
        }
        self.stays = Stays(idle, busy, flip, stay)
        self.bodies: dict[tuple[str, str], bytes] = {}
        self.unknown: list[str] = []
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()

    def body(self, expr: str, at: str) -> bytes:
        key = (expr, at)
        known = self.bodies.get(key)
        if known is None:
            t = float(at)
            if "gpuops_input" in expr:  # the stale-series probe: every sample is fresh
                result = []
            else:  # the values move every round (as Prometheus' do), the series as churned
                value = f"{0.1 + round((t - self.start) / 30) % 50 / 10_000:.4f}"
                result = [{"metric": m, "value": [t, value]} for m in self._series(expr, t)]
            if expr.startswith("count("):
                result = [{"metric": {}, "value": [t, str(len(self._series(expr, t)))]}]
            data = {"resultType": "vector", "result": result}
            known = self.bodies[key] = orjson.dumps({"status": "success", "data": data})
            if len(self.bodies) > 64:
                self.bodies.clear()
        return known

    def _series(self, expr: str, t: float) -> list[dict[str, Any]]:
        n = round((t - self.start) / 30)  # the round (the engine's clock moves 30 s a round)
        if self.mode == "flip":  # the same GPUs back and forth, every other round
            kinds = self.flipped if n > 2 and n % 2 else self.kinds
        else:
            kinds = {**self.kinds, **self.stays.at(n)}
        kind = kind_of(expr)
        if kind == "down":
            return kinds["down"] if "== 0" in expr else kinds["down"] * 100
        if kind == "busy":  # clear_expr: busy GPUs, narrowed or not
            wanted = re.search(r'uuid=~"([^"]*)"', expr)
            busy = kinds["busy"]
            if wanted is None:
                return busy
            uuids = set(wanted.group(1).replace("\\", "").split("|"))
            return [m for m in busy if m["uuid"] in uuids]
        if kind == "population":
            return kinds["idle"] * 2
        return kinds[kind]


class _Handler(BaseHTTPRequestHandler):
    server: Canned
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        self._answer(parse_qs(urlparse(self.path).query))

    def do_POST(self) -> None:  # a long query comes as a form (gpuops.sources.prometheus)
        length = int(self.headers.get("Content-Length", "0"))
        self._answer(parse_qs(self.rfile.read(length).decode()))

    def _answer(self, params: dict[str, list[str]]) -> None:
        try:
            body = self.server.body(params["query"][0], params.get("time", ["0"])[0])
        except UnknownQuery as exc:  # a 400, as Prometheus refuses a bad query; and the
            print(f"UNKNOWN QUERY {exc}", file=sys.stderr, flush=True)  # run fails at its end
            self.server.unknown.append(str(exc))
            self.send_error(400, str(exc)[:200])
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def serve(gpus: int, churn: float, start: float, mode: str, stay: float) -> None:
    """The child process: serve the canned answers until killed (its CPU is not the
    engine's); its first line is its port. ``churn``: the fraction of GPUs that change
    between idle and busy every round after the fire (round 2; the engine's clock is
    ``start`` in round 0), half of them each way, so the answers' series change; ``mode``
    and ``stay``: how long they stay changed (``Stays``, or back and forth)."""
    server = Canned(gpus, churn, start, mode, stay)
    print(server.server_address[1], flush=True)
    threading.Event().wait()


def run(
    gpus: int,
    rounds: int,
    profile: Path | None,
    churn: float = 0.0,
    mode: str = "stay",
    stay: float = STAY_ROUNDS,
) -> Mapping[str, float]:
    clock = [time.time()]
    child = subprocess.Popen(
        [
            sys.executable,
            *("-m", "tests.benchmarks.bench_round", "--serve", str(gpus)),
            *("--churn", str(churn), "--start", repr(clock[0])),
            *("--churn-mode", mode, "--stay", str(stay)),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert child.stdout is not None
    url = f"http://127.0.0.1:{int(child.stdout.readline())}"
    with tempfile.TemporaryDirectory(prefix="bench-round-") as tmp:
        work = Path(tmp)
        rules = policies(work)
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
            clock=lambda: clock[0],
            metrics=metrics,
            audit_log=audit,
            prometheus=PrometheusSettings(url=url, timeout=60, max_sample_age=1800),
            guardrails=GuardrailSettings(global_max_per_hour=100),
        )
        load_rules([rules])
        # CPU, not wall (waits on Prometheus' answers and on fsync are not the engine's CPU)
        profiler = cProfile.Profile(time.thread_time) if profile is not None else None
        rows: list[dict[str, float]] = []
        try:
            for n in range(rounds):
                decided, audited = sum_samples(engine.metrics.decisions), spool_bytes(work)
                wall, cpu, own = time.perf_counter(), time.process_time(), time.thread_time()
                steady = n >= 3  # round 0 new, 2 fires (for: 1m)
                if profiler is not None and steady:
                    profiler.enable()
                for group in engine.rules.groups:
                    for _ in range(round(30 / group.interval_s)):
                        engine.evaluate_group(group)
                if profiler is not None and steady:
                    profiler.disable()
                own = time.thread_time() - own  # the evaluating thread's own CPU
                engine.wait_idle(600)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                row = {
                    "wall": wall,
                    "cpu": cpu,
                    "decisions": sum_samples(engine.metrics.decisions) - decided,
                    "audit": spool_bytes(work) - audited,
                    "rss": rss_mib(),
                    "own": own,
                }
                rows.append(row)
                print(
                    f"  round {n}: wall {wall:6.2f} s, engine CPU {cpu:6.2f} s "
                    f"({cpu / gpus * 1e6:6.1f} us/GPU; evaluating thread {own:5.2f} s), "
                    f"decisions {row['decisions']:6.0f}, "
                    f"audit {row['audit'] / 1e6:6.2f} MB, RSS {row['rss']:4.0f} MiB",
                    flush=True,
                )
                clock[0] += 30
            failed = sum_samples(engine.metrics.query_failures)
        finally:
            engine.stop()
            child.terminate()
            child.wait(30)
            child.stdout.close()
    if failed:  # a query the canned server refused (it printed which): not the workload meant
        raise SystemExit(f"{failed:.0f} queries failed: the figures above are not comparable")
    if profiler is not None and profile is not None:
        profiler.dump_stats(str(profile))
    fire = max(range(len(rows)), key=lambda i: rows[i]["decisions"])
    after = rows[fire + 1 :]
    cpus = [r["cpu"] for r in after]  # every steady round: the refresh rounds too
    cpu = statistics.mean(cpus) if cpus else float("nan")
    return {
        "gpus": gpus,
        "cpu": cpu,
        "cpu_us": cpu / gpus * 1e6,
        "cpu_min_us": min(cpus, default=float("nan")) / gpus * 1e6,
        "cpu_max_us": max(cpus, default=float("nan")) / gpus * 1e6,
        "steady_rounds": len(cpus),
        "covers_refresh": len(cpus) * 30 > REFRESH_S,
        "fire_wall": rows[fire]["wall"],
        "fire_decisions": rows[fire]["decisions"],
        "after_fire": max((r["decisions"] for r in after), default=float("nan")),
        "after_audit": max((r["audit"] for r in after), default=float("nan")),
        "rss": max(r["rss"] for r in rows),
    }


def spool_bytes(work: Path) -> int:
    return sum(p.stat().st_size for p in (work / "audit").rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=14)
    parser.add_argument("--profile", type=Path)
    parser.add_argument(
        "--churn",
        type=float,
        default=0.01,
        help="fraction of GPUs that change between idle and busy every round after the fire"
        " (0: the same series every round, a best case)",
    )
    parser.add_argument(
        "--churn-mode",
        choices=("stay", "flip"),
        default="stay",
        help="stay: each GPU that changes stays changed for a seeded number of rounds (mean"
        " --stay), then goes back; flip: the same GPUs back and forth every other round",
    )
    parser.add_argument(
        "--stay",
        type=float,
        default=STAY_ROUNDS,
        help="--churn-mode stay: mean rounds a GPU stays changed",
    )
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--start", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.churn, args.start, args.churn_mode, args.stay)
        return
    collect_less()  # as `gpuops engine run` does
    r = run(args.gpus, args.rounds, args.profile, args.churn, args.churn_mode, args.stay)
    print(
        f"{r['gpus']:.0f} GPUs, steady rounds without Prometheus (the {r['steady_rounds']:.0f}"
        f" after the fire), churn {args.churn:g} of the GPUs a round ({args.churn_mode}"
        + (f", mean {args.stay:g} rounds" if args.churn_mode == "stay" else "")
        + "):"
        f" engine CPU {r['cpu']:.2f} s per 30 s round on average,"
        f" {r['cpu_us']:.1f} us per GPU (rounds {r['cpu_min_us']:.1f}-{r['cpu_max_us']:.1f};"
        " goal <= 40)"
        + ("" if r["covers_refresh"] else f", NOT covering a refresh ({REFRESH_S:.0f} s)")
        + "; fire round"
        f" {r['fire_wall']:.1f} s, {r['fire_decisions']:.0f} decisions; most decisions in a"
        f" round after it {r['after_fire']:.0f} ({r['after_audit'] / 1e6:.2f} MB of audit);"
        f" RSS {r['rss']:.0f} MiB"
    )


if __name__ == "__main__":
    main()
