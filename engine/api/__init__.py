"""The engine's REST API (DESIGN.md section 9): rules, decisions, approvals, quota requests,
engine controls and the Alertmanager receiver, with bearer-token users and roles.

Sits between ``engine.demo``/``engine.cli`` (which serve it) and ``engine.runtime`` (which it
drives); ``create_app`` builds one app per engine, ``ApiServer`` serves it with uvicorn.
"""

from engine.api.app import create_app
from engine.api.server import ApiServer
from engine.api.tokens import Permission, Principal, TokensError, hash_token

__all__ = ["ApiServer", "Permission", "Principal", "TokensError", "create_app", "hash_token"]
