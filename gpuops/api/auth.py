"""Route dependencies that check the permission of the principal ``gpuops.api.middleware`` found.

``require(Permission.X)`` is used by every route under ``/api/v1``; a missing permission is a
403 whose reason names the user, their roles and the permission (the middleware audits it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gpuops.api.tokens import Permission, Principal

_bearer = HTTPBearer(
    auto_error=False,
    description="A user's token (docs/api.md). HTTP Basic with the token as password also works.",
)


def caller(request: Request) -> Principal | None:
    """The user ``gpuops.api.middleware`` authenticated for ``request`` (None: nobody)."""
    found = getattr(request.state, "principal", None)
    return found if isinstance(found, Principal) else None


def require(permission: Permission) -> Callable[..., Principal]:
    """A dependency returning the caller when they hold ``permission``, else raising 403."""

    def check(
        request: Request,
        _: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
    ) -> Principal:
        principal = caller(request)
        if principal is None:  # the middleware authenticates every /api/v1 request first
            raise HTTPException(401, "no credentials: send 'Authorization: Bearer <token>'")
        if not principal.can(permission):
            raise HTTPException(
                403,
                f"forbidden: user {principal.name!r} (roles: {', '.join(principal.roles)}) "
                f"lacks the permission {permission.value}",
            )
        return principal

    return check
