"""The write turn of the processes sharing one SQLite file (engines and
migrations: :mod:`broker_core.sql`)."""

from __future__ import annotations

import os
from typing import Any

import sqlalchemy as sa

from ..sql import split_url


class _WriteTurn:
    """The write turn of the processes sharing one SQLite file. SQLite's own
    write lock is taken by polling (the busy handler sleeps 1, 2, 5 ... ms
    between tries), so competing writers of several processes waste most of
    their turns asleep; an ``flock`` on a file beside the database queues
    them in the kernel instead, and the next one runs as soon as the lock is
    released. (Writers that do not take it still work: they fall back on the
    busy timeout.)"""

    def __init__(self, path: str) -> None:
        import fcntl

        self._flock = fcntl.flock
        self._exclusive, self._unlock = fcntl.LOCK_EX, fcntl.LOCK_UN
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    def __enter__(self) -> None:
        self._flock(self._fd, self._exclusive)

    def __exit__(self, *exc: Any) -> None:
        self._flock(self._fd, self._unlock)

    def close(self) -> None:
        os.close(self._fd)

    @staticmethod
    def for_url(url: str) -> _WriteTurn | None:
        path = sa.engine.make_url(split_url(url)[0]).database
        if not path or path == ":memory:" or path.startswith("file:"):
            return None
        try:
            return _WriteTurn(os.path.abspath(path) + "-writer.lock")
        except (ImportError, OSError):  # no flock here (or a read-only folder): the busy timeout alone
            return None
