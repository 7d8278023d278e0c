"""The engine's scheduler: interval jobs on the monotonic clock, cron jobs on the wall clock,
re-anchored when the wall clock steps (docs/policies.md, "Clock").

Built by ``gpuops.runtime.jobs.Jobs`` for ``gpuops.runtime.facade.Engine`` (group evaluations,
cron ``schedule`` policies, approvals expiry, the quota ticker, audit retry, the rule watcher,
pruning). One thread
per engine waits on an ``Event`` for the next due job (at most ``CHECK_S``) and hands due jobs to
a small pool; a job still running is not started again (its missed runs coalesce into one).

Why not APScheduler's ``BackgroundScheduler``: 3.x keeps every job's next run time as a wall-clock
``datetime`` and sleeps ``next - datetime.now()``, so a step back of 1 h delays every job by an
hour, and no option changes that. Here an interval job's next run is a
``time.monotonic()`` value, which no step moves. A cron job's next run is a wall time (cron
means wall times); a step — wall minus monotonic changing by more than ``STEP_BOUND_S`` between
two checks — re-anchors it to the next cron time after the new wall time: no burst of missed
runs after a step forward, no stall after a step back. ``on_step`` is told once per step.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from apscheduler.triggers.cron import CronTrigger

log = logging.getLogger(__name__)

CHECK_S = 1.0
"""The longest the scheduler thread waits between two checks: a step is seen within it."""

STEP_BOUND_S = 2.0
"""A change of wall minus monotonic above this between two checks (``CHECK_S`` apart) is a
step. NTP's slewing changes it by at most 0.5 ms per second, far below; a step is a jump."""


@dataclass
class Job:
    """One scheduled job: ``interval_s`` (monotonic) or ``cron`` (wall clock)."""

    id: str
    func: Callable[[], None]
    interval_s: float | None = None
    cron: CronTrigger | None = None
    due: float = 0.0
    """Interval job: the monotonic time of its next run; cron job: the wall time."""

    @property
    def next_run_time(self) -> float:
        return self.due


class Scheduler:
    """``add_interval``/``add_cron`` jobs; ``start`` runs them on a thread; ``run_pending``
    is one check (the thread's loop, and the tests with stepped fake clocks)."""

    def __init__(
        self,
        *,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        on_step: Callable[[float], None] = lambda step: None,
        workers: int = 10,
        submit: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        """``submit`` runs a due job (default: the pool; tests pass a direct call)."""
        self._wall = wall
        self._monotonic = monotonic
        self._on_step = on_step
        self._jobs: dict[str, Job] = {}
        self._running: set[str] = set()  # by id: a replaced job still running is not doubled
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        if submit is None:
            self._pool = ThreadPoolExecutor(workers, thread_name_prefix="gpuops-job")
            pool = self._pool

            def submit(run: Callable[[], None]) -> None:
                pool.submit(run)

        self._submit = submit
        self._offset = wall() - monotonic()

    # --- jobs ------------------------------------------------------------------------------
    def add_interval(
        self, job_id: str, func: Callable[[], None], interval_s: float, first_in: float = 0.0
    ) -> Job:
        """Run ``func`` every ``interval_s`` seconds of monotonic time, first in ``first_in``
        (replaces a job of the same id)."""
        job = Job(job_id, func, interval_s=interval_s, due=self._monotonic() + first_in)
        with self._lock:
            self._jobs[job_id] = job
        return job

    def add_cron(self, job_id: str, func: Callable[[], None], cron: CronTrigger) -> Job:
        """Run ``func`` at the wall times of ``cron`` (replaces a job of the same id)."""
        job = Job(job_id, func, cron=cron, due=_next_cron(cron, self._wall()))
        with self._lock:
            self._jobs[job_id] = job
        return job

    def get_job(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def get_jobs(self) -> list[Job]:
        with self._lock:
            return list(self._jobs.values())

    def remove(self, job_id: str) -> None:
        with self._lock:
            self._jobs.pop(job_id, None)

    def wall_time_of(self, job: Job) -> float:
        """The wall time of ``job``'s next run as the clocks stand now."""
        if job.cron is not None:
            return job.due
        return job.due + self._offset

    # --- running ---------------------------------------------------------------------------
    def run_pending(self) -> float:
        """Detect a step, start the due jobs; returns seconds until the next check."""
        mono = self._monotonic()
        wall = self._wall()
        offset = wall - mono
        step = offset - self._offset
        self._offset = offset
        if abs(step) > STEP_BOUND_S:
            with self._lock:
                for job in self._jobs.values():
                    if job.cron is not None:
                        job.due = _next_cron(job.cron, wall)
            log.warning(
                "wall clock stepped %+.1f s (against the monotonic clock): interval jobs keep "
                "their monotonic times, cron jobs re-anchored to the new wall time",
                step,
            )
            try:
                self._on_step(step)
            except Exception:  # the jobs must keep running
                log.exception("handling the clock step failed")
        due: list[Job] = []
        wait = CHECK_S
        with self._lock:
            for job in self._jobs.values():
                now = wall if job.cron is not None else mono
                if job.due <= now:
                    if job.id not in self._running:
                        self._running.add(job.id)
                        due.append(job)
                    job.due = self._next(job, now)
                wait = min(wait, job.due - now)
        for job in due:
            self._submit(self._runner(job))
        return max(wait, 0.0)

    def _next(self, job: Job, now: float) -> float:
        if job.cron is not None:
            return _next_cron(job.cron, now)
        assert job.interval_s is not None
        missed = (now - job.due) // job.interval_s  # coalesce, keep the phase
        return job.due + (missed + 1) * job.interval_s

    def _runner(self, job: Job) -> Callable[[], None]:
        def run() -> None:
            try:
                job.func()
            except Exception:  # one failing job must not stop the scheduler
                log.exception("scheduled job %s failed", job.id)
            finally:
                with self._lock:
                    self._running.discard(job.id)

        return run

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="gpuops-scheduler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        wait = 0.0
        while not self._stop.wait(wait):
            try:
                wait = self.run_pending()
            except Exception:  # keep scheduling
                log.exception("scheduler check failed")
                wait = CHECK_S

    def shutdown(self, wait: bool = True) -> None:
        """Stop the thread; with ``wait``, let running jobs finish (idempotent)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)


def group_offset(name: str, interval_s: float) -> float:
    """The phase of a group's runs within its interval, as Prometheus spreads its rule groups
    (a hash of the group's name modulo the interval): a group runs at the wall times ``t`` with
    ``t % interval_s == group_offset(...)``, the same on every restart and on every engine,
    and groups of one interval start at different instants instead of all at once."""
    if interval_s <= 0:
        return 0.0
    digest = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")
    return (digest % int(interval_s * 1000)) / 1000.0


def first_run_in(name: str, interval_s: float, wall: float) -> float:
    """Seconds from ``wall`` to the group's next run at its phase (``group_offset``)."""
    return (group_offset(name, interval_s) - wall) % interval_s if interval_s > 0 else 0.0


def _next_cron(cron: CronTrigger, wall: float) -> float:
    """The first time of ``cron`` strictly after ``wall``."""
    now = datetime.fromtimestamp(wall, cron.timezone)
    fire = cron.get_next_fire_time(None, now)
    if fire is not None and fire.timestamp() <= wall:
        fire = cron.get_next_fire_time(fire, datetime.fromtimestamp(wall + 1e-3, cron.timezone))
    return float("inf") if fire is None else fire.timestamp()
