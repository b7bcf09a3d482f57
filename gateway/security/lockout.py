"""The operators' lockout: failed logins by operator name *and* client address, with backoff, in the store.

Keyed on the name alone, five wrong guesses from anywhere would lock an operator out of every address (a
denial of service anyone who knows a name could keep up); keyed on the address alone, one address could try
every name. So a (name, address) pair is locked once it failed ``admin.login_attempts`` times, each failure
apart by less than ``admin.login_window``: for :data:`FIRST_LOCK` seconds, doubling with every further
failure, up to ``admin.login_window``. A login that succeeds clears its pair. The rows live in the store
(``b2b_login_failures``), so every serving process, and every host on one PostgreSQL, sees the same counts.
(Each address is also limited across names, in memory, by :class:`gateway.admin.access.Access`.)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from gateway.security.tables import login_failures

__all__ = ["FIRST_LOCK", "Lockout"]

#: Seconds of the first lock; each further failure doubles it, up to the login window.
FIRST_LOCK = 5.0
_KEEP = 24 * 3600 * 1000  # rows older than a day are swept at the next failure


def _subject(name: str, address: str) -> str:
    return f"{name[:64]}\n{address[:100]}"


class Lockout:
    """Reads on *engine*, writes through *write* (``broker.write``: the store writer's transaction)."""

    def __init__(self, engine: sa.Engine, write: Callable[..., list[Any]], attempts: int, window: float) -> None:
        self.engine = engine
        self._write = write
        self.attempts = attempts
        self.window = window

    def retry_after(self, name: str, address: str) -> int:
        """Whole seconds until (*name*, *address*) may try again; 0: now."""
        now = int(time.time() * 1000)
        with self.engine.connect() as conn:
            until = conn.execute(
                sa.select(login_failures.c.locked_until).where(login_failures.c.subject == _subject(name, address))
            ).scalar()
            conn.rollback()
        return 0 if until is None or until <= now else math.ceil((until - now) / 1000)

    def fail(self, name: str, address: str) -> int:
        """Count a failure of (*name*, *address*); returns the seconds it is now locked for (0: not locked)."""
        subject = _subject(name, address)
        window_ms = int(self.window * 1000)

        def count(conn: sa.Connection) -> int:
            now = int(time.time() * 1000)
            row = conn.execute(sa.select(login_failures).where(login_failures.c.subject == subject)).first()
            failures = 1 if row is None or now - row.updated_at > window_ms else row.failures + 1
            locked_ms = 0
            if failures >= self.attempts:
                locked_ms = int(min(self.window, FIRST_LOCK * 2 ** min(failures - self.attempts, 30)) * 1000)
            values = {"failures": failures, "locked_until": now + locked_ms, "updated_at": now}
            if row is None:
                conn.execute(sa.delete(login_failures).where(login_failures.c.updated_at < now - _KEEP))
                conn.execute(login_failures.insert(), {"subject": subject, **values})
            else:
                conn.execute(login_failures.update().where(login_failures.c.subject == subject), values)
            return math.ceil(locked_ms / 1000)

        return self._write(count)[0]

    def clear(self, name: str, address: str) -> None:
        subject = _subject(name, address)
        self._write(lambda conn: conn.execute(sa.delete(login_failures).where(login_failures.c.subject == subject)))
