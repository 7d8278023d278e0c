"""The answers of ``/api/v1/auth``: who the caller is, and how many users a reload read. Built
by ``gpuops.api.routes.control``.
"""

from __future__ import annotations

from gpuops.api.responses import Out
from gpuops.api.tokens import Permission


class WhoAmIOut(Out):
    name: str
    roles: list[str]
    permissions: list[Permission]


class UsersReloadedOut(Out):
    users: int
