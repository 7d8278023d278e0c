"""API users, roles and bearer tokens.

``TokenStore`` reads users from the tokens file and/or an environment variable (both YAML:
``users: [{name, roles, token_sha256}]``), keeps only the SHA-256 of each token and compares in
constant time. The file is watched like the rule files: a change (a user added by ``gpuops
token new --tokens-file``, one removed) is read before the next request is authenticated; a
broken file leaves the current users and is logged. ``ROLE_PERMISSIONS`` is the permission
table of docs/api.md. Used by ``gpuops.api.auth`` (the middleware and route dependencies) and
``gpuops token new``.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

log = logging.getLogger(__name__)

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class Permission(StrEnum):
    RULES_READ = "rules:read"
    RULES_VALIDATE = "rules:validate"
    RULES_WRITE = "rules:write"
    DECISIONS_READ = "decisions:read"
    APPROVALS_READ = "approvals:read"
    APPROVALS_DECIDE = "approvals:decide"
    QUOTA_READ = "quota:read"
    QUOTA_REQUEST = "quota:request"
    QUOTA_DECIDE = "quota:decide"
    ENGINE_READ = "engine:read"
    ENGINE_CONTROL = "engine:control"
    AUTH_RELOAD = "auth:reload"
    ALERTS_RECEIVE = "alerts:receive"
    AUDIT_READ = "audit:read"


_READ = frozenset(
    {
        Permission.RULES_READ,
        Permission.DECISIONS_READ,
        Permission.APPROVALS_READ,
        Permission.QUOTA_READ,
        Permission.ENGINE_READ,
    }
)

ROLE_PERMISSIONS: Mapping[str, frozenset[Permission]] = MappingProxyType(
    {
        "admin": frozenset(Permission),
        "developer": _READ | {Permission.RULES_VALIDATE, Permission.QUOTA_REQUEST},
        "auditor": _READ | {Permission.AUDIT_READ},
        "alertmanager": frozenset({Permission.ALERTS_RECEIVE}),
    }
)
"""What each role may do; a user with several roles may do what any of them may."""


class TokensError(Exception):
    """The tokens file or variable cannot be used; the message names the source and the key."""


def hash_token(token: str) -> str:
    """The form tokens are stored in: lowercase hex SHA-256 of the UTF-8 token
    (``printf %s "$TOKEN" | sha256sum``)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Principal:
    """An authenticated user."""

    name: str
    roles: tuple[str, ...]

    def can(self, permission: Permission) -> bool:
        return any(permission in ROLE_PERMISSIONS.get(role, frozenset()) for role in self.roles)


class _User(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.@-]+$")
    roles: tuple[str, ...] = Field(min_length=1)
    token_sha256: str

    @field_validator("roles")
    @classmethod
    def _known_roles(cls, roles: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(roles) - set(ROLE_PERMISSIONS))
        if unknown:
            raise ValueError(
                f"unknown role {unknown[0]!r} (allowed: {', '.join(sorted(ROLE_PERMISSIONS))})"
            )
        return roles

    @field_validator("token_sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        if not _SHA256_HEX.fullmatch(value):
            raise ValueError(
                "expected the 64 lowercase hex digits of the token's SHA-256, never the token "
                'itself (printf %s "$TOKEN" | sha256sum)'
            )
        return value


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    users: list[_User] = []


def parse_users(text: str, source: str) -> list[_User]:
    """The users of one tokens document; ``source`` names it in messages."""
    try:
        raw: Any = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise TokensError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise TokensError(
            f"{source}: expected a mapping with the key users "
            f"(users: [{{name, roles, token_sha256}}]), found a {type(raw).__name__}"
        )
    try:
        return _File.model_validate(raw).users
    except ValidationError as exc:
        # pydantic's messages quote the input; never echo a token_sha256 value or anything else.
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise TokensError(f"{source}: {problems}") from None


def add_user(path: Path, user: Mapping[str, Any]) -> None:
    """Add ``user`` (``name``, ``roles``, ``token_sha256``) to the tokens file at ``path``, made
    with mode 0600 when missing; the result is checked like the engine checks it and replaces
    the file atomically. ``TokensError`` when the file is broken or already has that name."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    except OSError as exc:
        raise TokensError(f"{path}: cannot read: {exc.strerror}") from None
    existing = parse_users(text, str(path))
    if any(u.name == user["name"] for u in existing):
        raise TokensError(f"{path}: user {user['name']!r} exists already; choose another name")
    users = [u.model_dump(mode="json") for u in existing] + [dict(user)]
    body = yaml.safe_dump({"users": users}, sort_keys=False)
    parse_users(body, str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(body)
    os.replace(tmp, path)


class TokenStore:
    """The users allowed to call the API, reloadable; only token hashes are kept."""

    def __init__(
        self,
        tokens_file: Path | None,
        env_name: str = "GPUOPS_API_TOKENS",
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.tokens_file = tokens_file
        self.env_name = env_name
        self._environ = environ
        self._lock = threading.Lock()
        self._users: tuple[_User, ...] = ()
        self._seen: tuple[int, ...] | None = None
        """The tokens file as last read (``_signature``): a change is read again."""
        self._refused: tuple[int, ...] | None = None
        """The version of the file a watched reload refused (logged once)."""

    @property
    def users(self) -> list[Principal]:
        self._follow()
        return [Principal(u.name, u.roles) for u in self._users]

    def reload(self) -> int:
        """Read the file and the variable again; on error keep the current users and raise."""
        environ = os.environ if self._environ is None else self._environ
        users: list[_User] = []
        sources: list[str] = []
        seen: tuple[int, ...] | None = None
        if self.tokens_file is not None:
            sources.append(str(self.tokens_file))
            seen = self._signature()
            try:
                text = self.tokens_file.read_text(encoding="utf-8")
            except OSError as exc:
                raise TokensError(f"{self.tokens_file}: cannot read: {exc.strerror}") from None
            users += parse_users(text, str(self.tokens_file))
        if environ.get(self.env_name):
            sources.append(f"${self.env_name}")
            users += parse_users(environ[self.env_name], f"${self.env_name}")
        names = [u.name for u in users]
        hashes = [u.token_sha256 for u in users]
        if len(set(names)) != len(names):
            twice = sorted({n for n in names if names.count(n) > 1})
            raise TokensError(f"{' + '.join(sources)}: user {twice[0]!r} is defined more than once")
        if len(set(hashes)) != len(hashes):
            twice = sorted({u.name for u in users if hashes.count(u.token_sha256) > 1})
            raise TokensError(
                f"{' + '.join(sources)}: users {', '.join(twice)} share one token; "
                "give each its own"
            )
        with self._lock:
            self._users = tuple(users)
            self._seen = seen
        log.info("API users loaded: %d", len(users))
        return len(users)

    def _signature(self) -> tuple[int, ...] | None:
        """What says the tokens file changed: its inode (``add_user`` replaces it), size and
        modification time; None when it cannot be read."""
        assert self.tokens_file is not None
        try:
            st = self.tokens_file.stat()
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _follow(self) -> None:
        """Read the tokens file again when it changed since it was read (once it was read: a
        store never loaded stays empty). A file that cannot be used keeps the current users;
        the problem is logged once per version of the file."""
        if self.tokens_file is None or self._seen is None:
            return
        now = self._signature()
        if now == self._seen or now == self._refused:
            return
        try:
            count = self.reload()
        except TokensError as exc:
            self._refused = now
            log.error("API users not reloaded, the current ones stay: %s", exc)
        else:
            log.info("tokens file %s changed: %d API users now", self.tokens_file, count)

    def authenticate(self, token: str) -> Principal | None:
        """The user whose token this is, or None. Every stored hash is compared (in constant
        time), so the time taken says nothing about which user or how much matched."""
        self._follow()
        digest = hash_token(token)
        found: _User | None = None
        with self._lock:
            users = self._users
        for user in users:
            if hmac.compare_digest(digest, user.token_sha256):
                found = user
        return Principal(found.name, found.roles) if found else None

    def holder(self, token_sha256: str) -> Principal | None:
        """The user whose token has this SHA-256 now: None once the token was removed or
        replaced (the console's sessions end with the token they were made with)."""
        self._follow()
        found: _User | None = None
        with self._lock:
            users = self._users
        for user in users:
            if hmac.compare_digest(token_sha256, user.token_sha256):
                found = user
        return Principal(found.name, found.roles) if found else None

    def authenticate_basic(self, username: str, password: str) -> Principal | None:
        """HTTP Basic (what Alertmanager's ``basic_auth`` sends): user name, token as password."""
        principal = self.authenticate(password)
        if principal is None or not hmac.compare_digest(principal.name.encode(), username.encode()):
            return None
        return principal
