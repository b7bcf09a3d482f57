"""Engines and schema upgrades for the SQL store, and the write turn of the
processes sharing one SQLite file."""

from __future__ import annotations

import functools
import os
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from .._options import check_store_options

__all__ = ["make_engine", "upgrade_database"]

_PG_WRITE_LOCK = 0x62326267  # "b2bg": serialises writers so ids grow in commit order


def _split_url(url: str) -> tuple[str, str | None]:
    """Remove our own ``schema=`` query option (PostgreSQL search path)."""
    parsed = sa.engine.make_url(url)
    schema = parsed.query.get("schema")
    if schema is None:
        return url, None
    return parsed.difference_update_query(["schema"]).render_as_string(hide_password=False), str(schema)


def make_engine(url: str, *, sqlite_synchronous: str = "FULL", pool_size: int = 5) -> sa.Engine:
    """An engine set up for the store (WAL, busy timeout, search path)."""
    clean, schema = _split_url(url)
    if clean.startswith("sqlite"):
        sqlite_synchronous = check_store_options(clean, {"sqlite_synchronous": sqlite_synchronous})["sqlite_synchronous"]
        path = sa.engine.make_url(clean).database
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        engine = sa.create_engine(clean, pool_size=pool_size, max_overflow=10, connect_args={"timeout": 30,
                                                                                           "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, record: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            # 16 KB pages (a new database only; no effect on an existing one): a business document of
            # 10-15 KB then fits in one page instead of a chain of overflow pages, which cost the
            # gateway's writer about three times the CPU per stored document
            cur.execute("PRAGMA page_size=16384")
            # likewise for a new database only: pages freed by deletes can be given back to the file system a
            # few at a time (PRAGMA incremental_vacuum, in short write transactions) instead of only by a
            # VACUUM, which rewrites the whole file holding the write lock throughout
            cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
            cur.execute("PRAGMA journal_mode=WAL")
            # checkpoint at ~4 MB of WAL, as with 4 KB pages (the store's writer checkpoints after its
            # transactions instead, outside the write turn: SQLStore._checkpoint)
            cur.execute("PRAGMA wal_autocheckpoint=256")
            cur.execute(f"PRAGMA synchronous={sqlite_synchronous}")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA secure_delete=OFF")  # freed pages are not zeroed: far less to write per ack
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: sa.Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("b2b_write") else "BEGIN")

        return engine
    connect_args: dict[str, Any] = {"connect_timeout": 10}
    if schema:
        connect_args["options"] = f"-csearch_path={schema}"
    return sa.create_engine(clean, pool_size=pool_size, max_overflow=10, pool_pre_ping=True,
                            connect_args=connect_args)


def upgrade_database(url: str) -> str:
    """Create or upgrade the store's tables with Alembic; returns the revision."""
    engine = make_engine(url)
    try:
        _upgrade(engine)
        return _current_revision(engine) or ""
    finally:
        engine.dispose()


def _alembic_config() -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", os.path.join(os.path.dirname(__file__), "migrations"))
    return cfg


def _upgrade(engine: sa.Engine) -> None:
    from alembic import command

    cfg = _alembic_config()
    with engine.connect().execution_options(b2b_write=True) as conn:  # SQLite: BEGIN IMMEDIATE, waits its turn
        if conn.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": _PG_WRITE_LOCK + 1})
        try:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
            conn.commit()
        finally:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_WRITE_LOCK + 1})
                conn.commit()


def _current_revision(engine: sa.Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"version_table": "b2b_broker_version"})
        return ctx.get_current_revision()


@functools.lru_cache(maxsize=1)
def _head_revision() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


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
    def for_url(url: str) -> "_WriteTurn | None":
        path = sa.engine.make_url(_split_url(url)[0]).database
        if not path or path == ":memory:" or path.startswith("file:"):
            return None
        try:
            return _WriteTurn(os.path.abspath(path) + "-writer.lock")
        except (ImportError, OSError):  # no flock here (or a read-only folder): the busy timeout alone
            return None
