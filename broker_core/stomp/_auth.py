"""CONNECT's login and passcode, checked cheaply when wrong.

* A passcode verified once for a login is remembered as its SHA-256 (one per
  login): a back end that reconnects costs a digest, not a scrypt.
* Failed logins are throttled per client address before any expensive work:
  after each failure the address must wait 1 s, then 2, 4... up to 60 s
  before its next check; a CONNECT inside that window is refused at once.
  A success clears the address.
* scrypt runs in a thread (the event loop keeps serving), one check at a
  time, with at most ``MAX_WAITING`` CONNECTs queued behind it; beyond that
  CONNECT is refused as busy.
* An unknown login costs the same scrypt as a wrong passcode.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import time
from collections.abc import Mapping

from ._passcodes import hash_passcode, verify_passcode
from ._users import StompUser

__all__ = ["Authenticator", "AuthenticationError"]

MAX_WAITING = 32
MAX_ADDRESSES = 10000
FIRST_DELAY = 1.0
MAX_DELAY = 60.0
FORGET_AFTER = 600.0


class AuthenticationError(Exception):
    """A CONNECT refused: ``title`` is the ERROR frame's message header, the
    text its body."""

    def __init__(self, title: str, detail: str) -> None:
        super().__init__(detail)
        self.title = title


class Authenticator:
    def __init__(self, users: Mapping[str, StompUser]) -> None:
        self.users = dict(users)
        self._verified: dict[str, bytes] = {}
        self._failures: collections.OrderedDict[str, tuple[int, float, float]] = collections.OrderedDict()
        self._semaphore: asyncio.Semaphore | None = None
        self._waiting = 0
        self._dummy_hash: str | None = None  # made at the first unknown login
        #: scrypt checks run so far (tests and metrics)
        self.checks = 0

    def _digest(self, login: str, passcode: str) -> bytes:
        return hashlib.sha256(login.encode("utf-8", "replace") + b"\0" + passcode.encode("utf-8", "replace")).digest()

    def throttled_for(self, address: str) -> float:
        """Seconds *address* must still wait before its next check (0: none)."""
        entry = self._failures.get(address)
        if entry is None:
            return 0.0
        now = time.monotonic()
        if now - entry[2] > FORGET_AFTER:
            del self._failures[address]
            return 0.0
        return max(0.0, entry[1] - now)

    def _failed(self, address: str) -> None:
        now = time.monotonic()
        count = self._failures.pop(address, (0, 0.0, 0.0))[0] + 1
        self._failures[address] = (count, now + min(MAX_DELAY, FIRST_DELAY * 2 ** (count - 1)), now)
        while len(self._failures) > MAX_ADDRESSES:
            self._failures.popitem(last=False)

    async def check(self, login: str | None, passcode: str | None, address: str) -> StompUser:
        """The user *login* names if *passcode* is its own; AuthenticationError otherwise."""
        user = self.users.get(login) if login is not None else None
        passcode = passcode or ""
        digest = self._digest(login or "", passcode)
        if user is not None:
            known = self._verified.get(user.login)
            if known is not None and hmac.compare_digest(known, digest):
                return user
        wait = self.throttled_for(address)
        if wait > 0:
            raise AuthenticationError(
                "authentication throttled",
                f"too many failed logins from {address}: try again in {wait:.0f} s (each failure doubles the wait, "
                f"up to {MAX_DELAY:.0f} s)",
            )
        if self._waiting >= MAX_WAITING:
            raise AuthenticationError(
                "authentication busy", "too many logins are being checked at once: try again in a few seconds"
            )
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(1)
        self._waiting += 1
        try:
            async with self._semaphore:
                self.checks += 1
                if user is not None:
                    encoded = user.passcode_hash
                else:
                    if self._dummy_hash is None:
                        self._dummy_hash = await asyncio.to_thread(hash_passcode, "")
                    encoded = self._dummy_hash
                ok = await asyncio.to_thread(verify_passcode, passcode, encoded)
        finally:
            self._waiting -= 1
        if ok and user is not None:
            self._verified[user.login] = digest
            self._failures.pop(address, None)
            return user
        self._failed(address)
        raise AuthenticationError(
            "authentication failed",
            f"login {(login or '')[:100]!r}: unknown user or wrong "
            "passcode (failed logins from one address are throttled)",
        )
