"""Power, throughput and price of the simulated fleet: what a GPU draws at a utilization and a
clock limit, how fast its job progresses at that clock, and what a kWh costs at an hour.

Used by ``gpuops.sim.fleet.model`` (each GPU's power and its job's progress) and
``gpuops.sim.fleet.cluster`` (energy counters, the price series). Pure functions and frozen
values; no I/O.

The model, and where its shape comes from:

- Power at full clock is linear in utilization between the idle draw and the board power
  limit (the shape NVML readings show on A100/V100 under steady load).
- A clock limit ``s`` (share of the maximum SM clock) scales the dynamic part of the power by
  ``s ** POWER_EXPONENT``. The exponent is fitted to the one measured pair of figures the
  model cites, not to f*V^2: MIT Lincoln Laboratory capped the V100s training language models
  at 150 W (of their 250 W default) and measured ~12-15 % less energy for ~3 % longer
  training (McDonald, Li, Frey, Tiwari, Gadepally, Samsi, "Great Power, Great
  Responsibility: Recommendations for Reducing Energy for Training Language Models",
  Findings of NAACL 2022, arXiv:2205.09646, whose abstract reports a 15 % decrease "with
  marginal increase in overall computation time"; the 12-15 % and ~3 % are the lab's summary
  of it, not read from the paper's tables; the cap at HPC scale: Zhao et al.,
  arXiv:2402.18593, 2024).
  Energy per unit of work is power times time, so -13.5 % energy at +3 % time means the
  capped GPU drew 0.84 of its uncapped power: far less than a cap at 60 % of the limit would
  take from a GPU drawing near its limit, i.e. those jobs did not draw near 250 W uncapped,
  and the figure to reproduce is the (time, energy) pair, not the watts. On the model's V100
  (``GPU_MODELS``: 40 W idle, 300 W limit) at training's ~0.9 load, the clock share that
  makes training 3 % longer (0.833, from ``throughput``) must draw 0.84 of full-clock
  power: ``s ** k`` = 0.811, k = 1.15 (``tests/unit/sim/fleet/test_energy.py`` checks the
  pair). An exponent of 2.5 (f*V^2 with V falling with f) would save ~30 % energy at +3 %
  time and ~40 % at a 150 W cap: twice what the study measured. The memory, uncore and
  board power an SM clock does not move are why the whole board's power falls about
  linearly, not cubically, with the SM clock.
- Throughput at clock share ``s`` is ``1 / (m + (1 - m) / s)`` where ``m`` is the share of the
  job's time bound by memory or communication (which a lower SM clock does not slow). With
  ``m`` = 0.85 for training, a clock at 0.78 of the maximum costs ~4 % throughput, in the range
  the studies above report for deep-learning training; inference and light jobs are less
  memory-bound (an assumption, not a measured figure).
- A node's host (CPUs, memory, NICs, NVSwitch, fans, PSU losses) draws power whenever the node
  is on: ``host_power_watts`` (``PoolSpec.host_idle_watts``/``host_peak_watts``), linear in
  the node's load between its idle and peak draw, the model of Fan, Weber and Barroso
  ("Power Provisioning for a Warehouse-sized Computer", ISCA 2007), whose model of a
  server's power linear in its CPU utilization tracked their measured machines closely; the
  host's load is taken to be its GPUs' mean utilization (an assumption: the host feeds the
  GPUs). Barroso and
  Hoelzle ("The Case for Energy-Proportional Computing", IEEE Computer 40(12), 2007) found
  even energy-efficient servers draw about half their peak power doing almost no work: the
  shipped fleets take host idle = 50 % of host peak from it. A powered-down node draws
  nothing (its BMC's few watts are not modelled); a booting node draws its host's idle power
  and its GPUs' idle power.
"""

from __future__ import annotations

from dataclasses import dataclass

POWER_EXPONENT = 1.15
"""Exponent of the clock share in the dynamic power: fitted to MIT Lincoln Laboratory's
measured -12-15 % energy at +3 % time (module docstring)."""

MEMORY_BOUND_SHARE = {"training": 0.85, "notebook": 0.5, "inference": 0.7, "light": 0.6}
"""Share of a job's run time that a lower SM clock does not stretch, per profile."""

JOULES_PER_KWH = 3_600_000.0


def power_watts(
    idle_watts: float, limit_watts: float, utilization: float, clock_share: float
) -> float:
    """Board power of one GPU at ``utilization`` (0-1) with its SM clock at ``clock_share`` of
    the maximum (0-1]; never above the limit nor below the idle draw."""
    share = min(max(clock_share, 0.0), 1.0)
    util = min(max(utilization, 0.0), 1.0)
    dynamic = (limit_watts - idle_watts) * util * share**POWER_EXPONENT
    return float(min(idle_watts + dynamic, limit_watts))


def host_power_watts(idle_watts: float, peak_watts: float, load: float) -> float:
    """Power of a node's host (everything but its GPUs) at ``load`` (0-1, its GPUs' mean
    utilization): linear between idle and peak (Fan, Weber, Barroso, ISCA 2007); a peak
    below idle (a ``PoolSpec`` given only ``host_idle_watts``) is a constant idle draw."""
    peak = max(peak_watts, idle_watts)
    return idle_watts + (peak - idle_watts) * min(max(load, 0.0), 1.0)


def throughput(profile: str, clock_share: float) -> float:
    """Work done per second at ``clock_share`` of the maximum clock, relative to full clock."""
    if clock_share >= 1.0:
        return 1.0
    m = MEMORY_BOUND_SHARE.get(profile, 0.7)
    return 1.0 / (m + (1.0 - m) / max(clock_share, 0.05))


@dataclass(frozen=True)
class TariffPeriod:
    """A price that holds from ``start_hour`` (inclusive) to ``end_hour`` (exclusive), local
    time; a period may wrap midnight (22 -> 6)."""

    start_hour: float
    end_hour: float
    price_per_kwh: float
    name: str = "peak"

    def covers(self, hour: float) -> bool:
        if self.start_hour <= self.end_hour:
            return self.start_hour <= hour < self.end_hour
        return hour >= self.start_hour or hour < self.end_hour


@dataclass(frozen=True)
class Tariff:
    """Electricity price by time of day (the seed's peak/valley tariff, 峰谷电价)."""

    base_price_per_kwh: float = 0.12
    """Price outside every period (currency units per kWh)."""
    periods: tuple[TariffPeriod, ...] = ()
    """The first period covering an hour sets its price."""
    currency: str = "USD"

    def price(self, hour_of_day: float) -> float:
        for period in self.periods:
            if period.covers(hour_of_day):
                return period.price_per_kwh
        return self.base_price_per_kwh

    def lowest_price(self) -> float:
        """The off-peak (valley) price: the lowest of the base price and every period's."""
        return min([self.base_price_per_kwh, *(p.price_per_kwh for p in self.periods)])

    def period_name(self, hour_of_day: float) -> str:
        for period in self.periods:
            if period.covers(hour_of_day):
                return period.name
        return "base"
