"""The engine's REST API: rules, decisions, approvals, quota requests,
engine controls and the Alertmanager receiver, with bearer-token users and roles.

Sits between ``gpuops.sim.demo``/``gpuops.cli`` (which serve it) and ``gpuops.runtime`` (which it
drives); ``create_app`` builds one app per engine, ``ApiServer`` serves it with uvicorn.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from gpuops.api.tokens import Permission, Principal, TokensError, hash_token

if TYPE_CHECKING:
    from gpuops.api.app import create_app
    from gpuops.api.server import ApiServer

_LAZY = {"create_app": "gpuops.api.app", "ApiServer": "gpuops.api.server"}


def __getattr__(name: str) -> Any:
    """The app and its server, imported when first asked for: ``gpuops.api.tokens`` (the
    CLI's token commands) does not pull in FastAPI, uvicorn and the console."""
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ApiServer", "Permission", "Principal", "TokensError", "create_app", "hash_token"]
