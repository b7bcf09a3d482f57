"""Who may use the admin side, and how they prove it.

Operators are configured apart from partners (``operators:``; a partner's API key never opens the admin
side), each with a role: ``viewer`` reads, ``operator`` also acts. Their secrets are stored as the same
salted scrypt hashes as partner keys (:func:`gateway.routing.partners.hash_key`). Two ways in:

* the console logs in with name and secret and gets a session cookie (``HttpOnly``, ``SameSite=Strict``,
  ``Secure`` over https), whose SHA-256 names a ``b2b_admin_sessions`` row shared by every serving process.
  Every change made through a session carries its CSRF token (``X-CSRF-Token`` header or ``csrf`` form
  field), and a cross-site ``Origin`` or ``Sec-Fetch-Site`` is refused as well;
* API clients send HTTP Basic credentials with each request. Their changes must be JSON, which no cross-site
  form can send without a CORS preflight this server never grants.

Failed logins lock the pair of operator name and client address (``admin.login_attempts`` within
``admin.login_window``, then a lock that doubles with each further failure; kept in the store, so every
process agrees: :mod:`gateway.security.lockout`), and an address that fails four times as often, across
names, waits out the window (per process): then 429 with ``Retry-After``, without checking the secret.
Every failed login, of any kind (console form, JSON session, HTTP Basic), is audited under the name sent,
truncated and marked ``unverified`` (:mod:`gateway.security.names`). A secret
that verified is remembered by a keyed digest for a minute, so that API clients do not pay a scrypt per
request.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import hashlib
import hmac
import math
import os
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from broker_core import Broker
from gateway.admin.errors import CsrfError, ForbiddenError, OperatorAuthError, TooManyAttemptsError
from gateway.admin.tables import sessions
from gateway.config.operations import AdminSettings, Operator
from gateway.routing.partners import verify_key
from gateway.security.lockout import Lockout
from gateway.security.names import UNVERIFIED_ROLE, unverified_name

__all__ = ["Access", "Principal", "SESSION_COOKIE"]

SESSION_COOKIE = "b2bgw_session"
LOGIN_COOKIE = "b2bgw_login"
_SAFE = {"GET", "HEAD", "OPTIONS"}
_VERIFIED_FOR = 60.0  # s a verified Basic secret is remembered
_LIMITER_KEYS = 10_000


@dataclass(frozen=True)
class Principal:
    """An authenticated operator: how (``session`` or ``basic``), and the session's CSRF token."""

    operator: Operator
    via: str
    csrf: str | None = None
    session_id: str | None = None

    @property
    def name(self) -> str:
        return self.operator.name

    @property
    def role(self) -> str:
        return self.operator.role

    @property
    def can_act(self) -> bool:
        return self.operator.role in ("operator", "admin")

    @property
    def is_admin(self) -> bool:
        return self.operator.role == "admin"

    def require_operator(self) -> None:
        """Raise :class:`ForbiddenError` unless this principal may act."""
        if not self.can_act:
            raise ForbiddenError(f"{self.name} is a {self.role}: only operators may change anything.")

    def require_admin(self) -> None:
        """Raise :class:`ForbiddenError` unless this principal may change partners and their credentials."""
        if not self.is_admin:
            raise ForbiddenError(
                f"{self.name} is a{'n' if self.role == 'operator' else ''} {self.role}: only admins may change partners, keys and certificates."
            )


class _Limiter:
    """Failures per key within a sliding window (bounded number of keys)."""

    def __init__(self, attempts: int, window: float) -> None:
        self.attempts = attempts
        self.window = window
        self._lock = threading.Lock()
        self._failures: collections.OrderedDict[str, collections.deque[float]] = collections.OrderedDict()

    def retry_after(self, key: str, now: float) -> float:
        """Seconds until *key* may try again (0: now)."""
        with self._lock:
            times = self._failures.get(key)
            if not times:
                return 0.0
            while times and times[0] <= now - self.window:
                times.popleft()
            if len(times) < self.attempts:
                return 0.0
            return times[0] + self.window - now

    def fail(self, key: str, now: float) -> None:
        with self._lock:
            times = self._failures.pop(key, None) or collections.deque(maxlen=self.attempts)
            times.append(now)
            self._failures[key] = times
            while len(self._failures) > _LIMITER_KEYS:
                self._failures.popitem(last=False)

    def clear(self, key: str) -> None:
        with self._lock:
            self._failures.pop(key, None)


def _sha(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def client_address(scope: Any) -> str:
    client = scope.get("client")
    return str(client[0])[:100] if client else "unknown"


class Access:
    """Operators' authentication, sessions and CSRF checks (see the module docstring)."""

    def __init__(self, admin: AdminSettings, engine: sa.Engine, broker: Broker) -> None:
        self.admin = admin
        self.engine = engine
        self.broker = broker
        from gateway.admin.audit import Audit

        self.audit = Audit(engine, broker)
        self._limiter = _Limiter(admin.login_attempts * 4, admin.login_window)  # an address, across names
        self.lockout = Lockout(engine, broker.write, admin.login_attempts, admin.login_window)
        self._digest_key = os.urandom(32)
        self._verified: dict[bytes, tuple[str, float]] = {}
        self._semaphore: asyncio.Semaphore | None = None
        self._sessions: dict[str, tuple[float, Any]] = {}  # id -> (read at, row): a few seconds' cache
        #: scrypt verifications so far (tests count them)
        self.verifications = 0

    # ----------------------------------------------------------------- secrets

    async def verify(self, name: str, secret: str, client: str, via: str = "basic") -> Operator:
        """The operator *name* if *secret* is its own; :class:`OperatorAuthError` otherwise (after a
        scrypt, so a wrong secret and an unknown name take alike), :class:`TooManyAttemptsError` while the
        pair of name and address is locked, or the address failed too often (module docstring). *via*
        (``form``, ``json``, ``basic``) is what the audit trail says of a failure."""
        now = time.monotonic()
        address = f"addr:{client}"
        wait = max(
            self._limiter.retry_after(address, now), await asyncio.to_thread(self.lockout.retry_after, name, client)
        )
        if wait > 0:
            raise TooManyAttemptsError(
                f"Too many failed logins from this address or for this operator from it; "
                f"try again in {math.ceil(wait)} s.",
                retry_after=math.ceil(wait),
            )
        digest = hmac.new(self._digest_key, f"{name}\0{secret}".encode(), hashlib.blake2b).digest()
        remembered = self._verified.get(digest)
        operator = self.admin.operators.get(name)
        if remembered is not None and remembered[1] > now and operator is not None and remembered[0] == operator.hash:
            return operator
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(2)
        async with self._semaphore:
            # an unknown name is checked against a throwaway hash: the answer takes as long as a real one
            encoded = operator.hash if operator is not None else _DUMMY_HASH
            self.verifications += 1
            ok = await asyncio.to_thread(verify_key, secret, encoded) and operator is not None
        if not ok:
            self._limiter.fail(address, time.monotonic())
            await asyncio.to_thread(self._failed, name, client, via)
            raise OperatorAuthError("Unknown operator or wrong secret.")
        self._limiter.clear(address)
        await asyncio.to_thread(self.lockout.clear, name, client)
        if len(self._verified) > 1000:
            self._verified.clear()
        self._verified[digest] = (operator.hash, now + _VERIFIED_FOR)
        return operator

    def _failed(self, name: str, client: str, via: str) -> None:
        locked = self.lockout.fail(name, client)
        detail = f"failed {via} login" + (f"; this name is locked from this address for {locked} s" if locked else "")
        self.audit.record(
            operator=unverified_name(name),
            role=UNVERIFIED_ROLE,
            action="login",
            outcome="refused",
            client=client,
            detail=detail,
        )

    # ----------------------------------------------------------------- sessions

    def open_session(self, operator: Operator) -> tuple[str, str, int]:
        """A new session for *operator*: (cookie token, CSRF token, expiry epoch ms)."""
        token = secrets.token_urlsafe(32)
        csrf = secrets.token_urlsafe(32)
        now = int(time.time() * 1000)
        expires = now + int(self.admin.session_ttl * 1000)
        row = {"id": _sha(token), "operator": operator.name, "csrf": csrf, "created_at": now, "expires_at": expires}

        def insert(conn: sa.Connection) -> None:
            conn.execute(sessions.delete().where(sessions.c.expires_at < now))
            conn.execute(sessions.insert(), row)

        self.broker.write(insert)
        return token, csrf, expires

    def close_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self.broker.write(lambda conn: conn.execute(sessions.delete().where(sessions.c.id == session_id)))

    def _session_row(self, session_id: str) -> Any:
        now = time.monotonic()
        cached = self._sessions.get(session_id)
        if cached is not None and now - cached[0] < 5.0:
            return cached[1]
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(sessions).where(sessions.c.id == session_id)).first()
            conn.rollback()
        if len(self._sessions) > 1000:
            self._sessions.clear()
        self._sessions[session_id] = (now, row)
        return row

    def session(self, token: str | None) -> Principal | None:
        """The principal of a session cookie, if it names a live session of a configured operator."""
        if not token or len(token) > 100:
            return None
        session_id = _sha(token)
        row = self._session_row(session_id)
        if row is None or row.expires_at <= int(time.time() * 1000):
            return None
        operator = self.admin.operators.get(row.operator)
        if operator is None:  # removed from the configuration: its sessions end with it
            return None
        return Principal(operator, "session", row.csrf, session_id)

    # ----------------------------------------------------------------- requests

    async def authenticate(self, scope: Any, headers: Any, cookies: dict[str, str]) -> Principal:
        """The operator behind a request: its session cookie, else HTTP Basic credentials."""
        authorization = headers.get("authorization")
        if authorization:
            scheme, _, value = authorization.strip().partition(" ")
            if scheme.lower() != "basic":  # a partner's Bearer key, say: never an operator
                raise OperatorAuthError()
            try:
                decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError, ValueError):
                raise OperatorAuthError() from None
            name, sep, secret = decoded.partition(":")
            if not sep or not name or not secret or len(decoded) > 600:
                raise OperatorAuthError()
            operator = await self.verify(name, secret, client_address(scope), "basic")
            return Principal(operator, "basic")
        principal = await asyncio.to_thread(self.session, cookies.get(SESSION_COOKIE))
        if principal is None:
            raise OperatorAuthError()
        return principal

    @staticmethod
    def check_change(principal: Principal, method: str, headers: Any, form_token: str | None = None) -> None:
        """Refuse a change (not GET/HEAD) that could come from another site: through a session it needs
        the session's CSRF token and no cross-site Origin; through Basic credentials, a JSON body."""
        if method in _SAFE:
            return
        if principal.via == "basic":
            media = (headers.get("content-type") or "").split(";")[0].strip().lower()
            if media != "application/json":
                raise CsrfError("Changes through the API are JSON: send Content-Type: application/json.")
            return
        site = (headers.get("sec-fetch-site") or "").lower()
        if site and site not in ("same-origin", "none"):
            raise CsrfError("Changes must come from the console's own pages.")
        origin = headers.get("origin")
        host = headers.get("host")
        if origin and host and origin.split("://", 1)[-1] != host:
            raise CsrfError("Changes must come from the console's own pages.")
        token = headers.get("x-csrf-token") or form_token
        if not token or principal.csrf is None or not hmac.compare_digest(token, principal.csrf):
            raise CsrfError()

    def cookie_flags(self, scope: Any) -> str:
        """The attributes of the cookies the console sets."""
        secure = self.admin.secure_cookies == "true" or (
            self.admin.secure_cookies == "auto" and scope.get("scheme") == "https"
        )
        return "; Path=/; HttpOnly; SameSite=Strict" + ("; Secure" if secure else "")


_DUMMY_HASH = "scrypt$ln=14,r=8,p=1$c2FsdHNhbHRzYWx0c2FsdA$" + base64.b64encode(b"\0" * 32).decode().rstrip("=")
