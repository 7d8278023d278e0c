"""Power, throughput and price of the simulated fleet: what a GPU draws at a utilization and a
clock limit, how fast its job progresses at that clock, and what a kWh costs at an hour.

Used by ``exporters.fleet.model`` (each GPU's power and its job's progress) and
``exporters.fleet.cluster`` (energy counters, the price series). Pure functions and frozen
values; no I/O.

The model, and where its shape comes from:

- Power at full clock is linear in utilization between the idle draw and the board power
  limit (the shape NVML readings show on A100/V100 under steady load).
- A clock limit ``s`` (share of the maximum SM clock) scales the dynamic part of the power by
  ``s ** POWER_EXPONENT``: dynamic power goes with f*V^2 and the voltage falls with the clock
  in the DVFS range. MIT Lincoln Laboratory's power-capping study (Zhao et al., "Sustainable
  Supercomputing for AI: GPU Power Capping at HPC Scale", SoCC 2023) capped V100s at 150 W and
  reports ~12-15 % less energy for ~3 % longer training; Zeus (You, Chung, Chowdhury, NSDI
  2023) and Perseus (Chung et al., SOSP 2024) measure the same convex energy/time trade-off:
  the first clock steps below the maximum save much power and cost little time.
- Throughput at clock share ``s`` is ``1 / (m + (1 - m) / s)`` where ``m`` is the share of the
  job's time bound by memory or communication (which a lower SM clock does not slow). With
  ``m`` = 0.85 for training, a clock at 0.78 of the maximum costs ~4 % throughput, in the range
  the studies above report for deep-learning training; inference and light jobs are less
  memory-bound.
"""

from __future__ import annotations

from dataclasses import dataclass

POWER_EXPONENT = 2.5
"""Exponent of the clock share in the dynamic power (f*V^2 with V falling with f)."""

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
