"""Fleet files: a fleet described in YAML (pools, projects, classes, job classes, tariff) read
into a ``FleetConfig``, every problem reported as ``file:line: key: what``.

Read by ``gpuops fleet sim --fleet FILE`` (``gpuops.cli.fleet``), ``gpuops whatif`` and tests;
the shipped examples are in ``examples/fleets/``, the format in ``docs/fleet-files.md``. From
the bottom: the schema (``schema``), YAML read with the line of every key (``positions``),
checks across sections (``checks``), the ``FleetConfig`` built (``build``), and the loader
that runs them in that order (``load``).
"""

from gpuops.sim.fleet.fleetfile.build import with_listeners
from gpuops.sim.fleet.fleetfile.load import FleetFileError, load_fleet, parse_fleet
from gpuops.sim.fleet.fleetfile.schema import seconds

__all__ = ["FleetFileError", "load_fleet", "parse_fleet", "seconds", "with_listeners"]
