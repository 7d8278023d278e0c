"""Errors the simulated fleet raises on a request it cannot honour.

Raised by ``gpuops.sim.fleet.cluster``; ``gpuops.sim.fleet.control`` turns each into its HTTP
status with ``{"error": message}``. The hierarchy::

    FleetError          (status 400)
    ├── BadRequest      400: a field is missing, of the wrong type or out of range
    ├── NotFound        404: unknown GPU uuid, node, pool or job
    └── Conflict        409: valid, but the fleet's current state does not allow it
"""

from __future__ import annotations


class FleetError(Exception):
    """A request the fleet refuses; ``status`` is the HTTP status the control API answers."""

    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(FleetError):
    status = 400


class NotFound(FleetError):
    status = 404


class Conflict(FleetError):
    status = 409
