"""Console sessions: an API token exchanged at sign-in for a random session id (the cookie), and
a CSRF token per session that every console form carries back.

``SignInLimiter`` counts failed sign-ins per source address (``gpuops.api.console.signin``
refuses sign-in from one that failed too often, for a while).

Used by ``gpuops.api.console.pages`` and ``gpuops.api.console.actions``. Sessions live in this
process's memory only (a restart signs everyone out); the token itself is never kept — only the
user name and the token's SHA-256 (what the ``TokenStore`` keeps too). Both are checked against
the ``TokenStore`` on every request and the roles read again, so a user removed, or whose token
was replaced, by a reload loses their sessions at once. One user keeps at most
``max_per_user`` sessions (the oldest end first), so signing in in a loop cannot grow the table.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from gpuops.api.tokens import Principal, TokenStore, hash_token

COOKIE = "gpuops_session"
"""The session cookie (HttpOnly, SameSite=Strict, Secure over TLS)."""
LOGIN_COOKIE = "gpuops_login_csrf"
"""The sign-in form's CSRF cookie (double submit: the form carries the same value)."""


@dataclass(frozen=True)
class Session:
    user: str
    csrf: str
    created: float
    expires: float
    token_sha256: str


def _key(session_id: str) -> str:
    # only a digest of the id is kept, so the table says nothing a cookie could be made from
    return hashlib.sha256(session_id.encode()).hexdigest()


def same(a: str | None, b: str | None) -> bool:
    """Constant-time equality of two secrets; None or empty never matches."""
    return bool(a) and bool(b) and hmac.compare_digest(str(a).encode(), str(b).encode())


class SessionStore:
    """Signed-in users by session id, each until ``ttl`` seconds after sign-in."""

    def __init__(
        self,
        tokens: TokenStore,
        ttl: float,
        clock: Callable[[], float] = time.time,
        max_per_user: int = 20,
    ) -> None:
        self.tokens = tokens
        self.ttl = ttl
        self.clock = clock
        self.max_per_user = max_per_user
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def sign_in(self, token: str) -> tuple[str, Session, Principal] | None:
        """A new session for the owner of ``token`` (its id for the cookie), or None. The
        user's oldest sessions end when they would have more than ``max_per_user``."""
        principal = self.tokens.authenticate(token)
        if principal is None:
            return None
        now = self.clock()
        session_id = secrets.token_urlsafe(32)
        session = Session(
            principal.name, secrets.token_urlsafe(32), now, now + self.ttl, hash_token(token)
        )
        with self._lock:
            live = {k: s for k, s in self._sessions.items() if s.expires > now}
            mine = [k for k, s in live.items() if s.user == principal.name]  # oldest first
            for key in mine[: max(0, len(mine) - self.max_per_user + 1)]:
                del live[key]
            live[_key(session_id)] = session
            self._sessions = live
        return session_id, session, principal

    def find(self, session_id: str | None) -> tuple[Session, Principal] | None:
        """The live session of this id and its user's current roles; None when there is none,
        it expired, or the user is no longer known."""
        if not session_id:
            return None
        key = _key(session_id)
        with self._lock:
            session = self._sessions.get(key)
            if session is not None and session.expires <= self.clock():
                del self._sessions[key]
                session = None
        if session is None:
            return None
        principal = self.tokens.holder(session.token_sha256)
        if principal is None or principal.name != session.user:
            return None
        return session, principal

    def sign_out(self, session_id: str | None) -> None:
        if session_id:
            with self._lock:
                self._sessions.pop(_key(session_id), None)


class SignInLimiter:
    """Failed sign-ins by source address: after ``failures`` of them within ``window`` seconds,
    sign-in from that address is refused until the oldest of those is ``window`` old. Refused
    attempts do not count (no token is tried then). At most ``max_addresses`` are remembered,
    the longest quiet forgotten first, so a flood from many addresses cannot grow it unbounded."""

    def __init__(
        self,
        failures: int,
        window: float,
        clock: Callable[[], float] = time.time,
        max_addresses: int = 10_000,
    ) -> None:
        self.failures = failures
        self.window = window
        self.clock = clock
        self.max_addresses = max_addresses
        self._lock = threading.Lock()
        self._failed: OrderedDict[str, deque[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._failed)

    def retry_after(self, address: str) -> int | None:
        """Whole seconds until ``address`` may try again; None when it may now."""
        with self._lock:
            now = self.clock()
            times = self._failed.get(address)
            if times is None:
                return None
            while times and times[0] <= now - self.window:
                times.popleft()
            if not times:
                del self._failed[address]
                return None
            if len(times) < self.failures:
                return None
            return max(1, math.ceil(times[-self.failures] + self.window - now))

    def failed(self, address: str) -> None:
        with self._lock:
            times = self._failed.pop(address, None) or deque(maxlen=self.failures)
            times.append(self.clock())
            self._failed[address] = times  # now the most recent
            while len(self._failed) > self.max_addresses:
                self._failed.popitem(last=False)
