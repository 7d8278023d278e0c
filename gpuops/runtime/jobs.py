"""The engine's scheduled work: a job per rule group on its interval, one per cron ``schedule``
policy, and the periodic jobs (approvals expiry, quota, audit reconciliation, the rule watch,
pruning) — each run on the leader only (a standby skips it).

Built and started by ``gpuops.runtime.facade.Engine`` on one ``gpuops.runtime.clock.Scheduler``;
rescheduled after every reload; when the wall clock steps, each group's grid is re-anchored to
the wall time of its next (monotonic) run, so that evaluation times stay grid times on the new
wall clock (docs/policies.md, "Clock").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

from apscheduler.triggers.cron import CronTrigger

from gpuops.model.rules.model import Group
from gpuops.runtime.clock import Scheduler, first_run_in


class Jobs:
    """The jobs of one engine."""

    def __init__(
        self,
        *,
        wall: Callable[[], float],
        monotonic: Callable[[], float],
        leading: Callable[[], bool],
        groups: Callable[[], Sequence[Group]],
        evaluate: Callable[[Group, bool], None],
        epochs: dict[str, float],
        stepped: Callable[[float], None],
    ) -> None:
        """``groups``: the rule groups loaded now; ``evaluate``: one run of a group (scheduled:
        a cron policy's); ``epochs``: each group's first grid point, kept here for the cycle
        (``gpuops.runtime.cycle.Cycle.epochs``); ``stepped``: told of a wall-clock step
        before the grids are re-anchored."""
        self._wall = wall
        self._leading = leading
        self._groups = groups
        self._evaluate = evaluate
        self._epochs = epochs
        self._stepped = stepped
        self.scheduler = Scheduler(wall=wall, monotonic=monotonic, on_step=self._clock_stepped)

    def every(
        self, job_id: str, func: Callable[[], object], interval_s: float, first_in: float = 0.0
    ) -> None:
        """Run ``func`` every ``interval_s`` seconds on the leader, first in ``first_in``."""
        self.scheduler.add_interval(job_id, self._leader_only(func), interval_s, first_in=first_in)

    def _leader_only(self, func: Callable[[], object]) -> Callable[[], None]:
        """``func`` as a scheduled job that runs on the leader only (a standby skips it)."""

        def job() -> None:
            if self._leading():
                func()

        return job

    def schedule_groups(self) -> None:
        """A job per group loaded now, on its grid, and one per cron policy; the jobs of groups
        and policies no longer loaded go."""
        wanted: set[str] = set()
        for group in self._groups():
            job_id = f"group:{group.name}"
            wanted.add(job_id)
            first_in = first_run_in(group.name, group.interval_s, self._wall())
            self._epochs[group.name] = self._wall() + first_in  # its first grid point
            self.scheduler.add_interval(
                job_id,
                self._leader_only(partial(self._evaluate, group, False)),
                group.interval_s,
                first_in=first_in,
            )
            for policy in group.policies:
                if policy.schedule is None or policy.expr is None:
                    continue
                job_id = f"schedule:{policy.name}"
                wanted.add(job_id)
                one = replace(group, policies=(policy,))
                self.scheduler.add_cron(
                    job_id,
                    self._leader_only(partial(self._evaluate, one, True)),
                    CronTrigger.from_crontab(policy.schedule),
                )
        for job in self.scheduler.get_jobs():
            if job.id.startswith(("group:", "schedule:")) and job.id not in wanted:
                self.scheduler.remove(job.id)

    def _clock_stepped(self, step_s: float) -> None:
        """The scheduler saw the wall clock step by ``step_s`` seconds: say so, then re-anchor
        every group's grid to the wall time of its next run."""
        self._stepped(step_s)
        for group in self._groups():
            job = self.scheduler.get_job(f"group:{group.name}")
            if job is not None:
                self._epochs[group.name] = self.scheduler.wall_time_of(job)

    def start(self) -> None:
        self.scheduler.start()

    def shutdown(self) -> None:
        self.scheduler.shutdown(wait=True)
