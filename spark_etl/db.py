"""Engines on the gateway's SQL store (SQLite or PostgreSQL).

The store URL is the gateway's (``store.url``): ``sqlite:///path`` or
``postgresql+psycopg://user@host/db``, optionally with the store's own
``?schema=NAME`` option (the PostgreSQL search path). A relative SQLite
path (``sqlite:///var/b2bgw.db``) is relative to the current directory of the
process that reads the URL: :func:`absolute_url` pins it down on the driver,
because Spark's executors run in working directories of their own.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

import sqlalchemy as sa

__all__ = ["absolute_url", "make_engine", "relative_sqlite_path", "split_url", "write_conn"]


def split_url(url: str) -> tuple[str, str | None]:
    """Remove the store's own ``schema=`` query option (PostgreSQL search path)."""
    parsed = sa.engine.make_url(url)
    schema = parsed.query.get("schema")
    if schema is None:
        return url, None
    return parsed.difference_update_query(["schema"]).render_as_string(hide_password=False), str(schema)


def relative_sqlite_path(url: str) -> str | None:
    """The file path of a SQLite URL when it is relative (else None: another
    database, an in-memory one, an absolute path or a ``file:`` URI name)."""
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    path = parsed.database
    if not path or path == ":memory:" or path.startswith("file:") or os.path.isabs(path):
        return None
    return path


def absolute_url(url: str) -> str:
    """*url* with a relative SQLite path made absolute against the current
    directory (what the gateway itself opens); any other URL as it is."""
    path = relative_sqlite_path(url)
    if path is None:
        return url
    parsed = sa.engine.make_url(url)
    return parsed.set(database=os.path.abspath(path)).render_as_string(hide_password=False)


_READ_MMAP = 1 << 34  # bytes of the file SQLite may map (16 GiB of address space, not memory)


def make_engine(url: str, *, read_only: bool = False, pool_size: int = 2) -> sa.Engine:
    """An engine on the store.

    SQLite: WAL-friendly, 30 s busy timeout, transactions issued by us
    (``BEGIN``, or ``BEGIN IMMEDIATE`` on connections opened through
    :func:`write_conn`, so writers queue instead of failing on upgrade);
    ``read_only`` opens the file with ``mode=ro`` (what the Spark tasks use).
    PostgreSQL: the ``schema=`` option becomes the search path.
    """
    clean, schema = split_url(url)
    if clean.startswith("sqlite"):
        path = sa.engine.make_url(clean).database
        if read_only and path and path != ":memory:":
            uri = f"file:{os.path.abspath(path)}?mode=ro"

            def connect() -> sqlite3.Connection:
                conn = sqlite3.connect(uri, uri=True, timeout=30, check_same_thread=False)
                # memory-mapped reads: the facts column lies after the XML in each row, and reaching it
                # walks the document's overflow pages; mapped, that walk costs half the CPU of read() calls
                conn.execute(f"PRAGMA mmap_size={_READ_MMAP}")
                return conn

            return sa.create_engine("sqlite://", creator=connect, poolclass=sa.pool.NullPool)
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        engine = sa.create_engine(clean, poolclass=sa.pool.NullPool,
                                  connect_args={"timeout": 30, "check_same_thread": False})  # fmt: skip

        @sa.event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, record: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @sa.event.listens_for(engine, "begin")
        def _on_begin(conn: sa.Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("etl_write") else "BEGIN")

        return engine
    connect_args: dict[str, Any] = {"connect_timeout": 10}
    if schema:
        connect_args["options"] = f"-csearch_path={schema}"
    return sa.create_engine(clean, pool_size=pool_size, max_overflow=4, pool_pre_ping=True, connect_args=connect_args)


def write_conn(engine: sa.Engine) -> sa.Connection:
    """A connection whose transactions take SQLite's write lock at BEGIN."""
    return engine.connect().execution_options(etl_write=True)
