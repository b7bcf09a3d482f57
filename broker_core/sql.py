"""The SQL store's database, for the packages that keep their own tables in it.

The gateway's ledger and the warehouse load live in the broker's database. They
open it with :func:`make_engine` (the same SQLite set-up as the store, so
processes sharing one file agree on WAL, page size and locking), write through
connections from :func:`write_connection` (or :meth:`broker_core.Broker.write`,
which runs in the store's own transactions), and create their tables with
:func:`migrate`, which takes the store's write lock so that processes starting
together upgrade one after the other.

URLs are the store's: ``sqlite:///path`` or ``postgresql+psycopg://...``,
optionally with the store's own ``?schema=NAME`` option (the PostgreSQL search
path).
"""

from __future__ import annotations

import functools
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from ._options import check_store_options

__all__ = [
    "MIGRATIONS",
    "VERSION_TABLE",
    "WRITE",
    "absolute_url",
    "current_revision",
    "head_revision",
    "make_engine",
    "migrate",
    "relative_sqlite_path",
    "run_migrations",
    "split_url",
    "upgrade_database",
    "write_connection",
]

#: The Alembic script directory of the broker's own tables.
MIGRATIONS = str(Path(__file__).parent / "_sql" / "migrations")
#: The Alembic version table of the broker's own tables.
VERSION_TABLE = "b2b_broker_version"
#: The execution option of a connection that writes: on SQLite its transactions
#: begin with ``BEGIN IMMEDIATE``, so writers queue for the lock at BEGIN instead
#: of failing when a reading transaction turns into a writing one.
WRITE = "b2b_write"

#: PostgreSQL advisory lock of the store's writers (ids grow in commit order).
PG_WRITE_LOCK = 0x62326267  # "b2bg"
_PG_MIGRATE_LOCK = PG_WRITE_LOCK + 1  # one migrator at a time, whichever tables it upgrades
_READ_MMAP = 1 << 34  # bytes of the file SQLite may map (16 GiB of address space, not memory)
# Alembic's context and op proxies are module globals: one migration at a time in a process.
_MIGRATE_LOCK = threading.Lock()


def split_url(url: str) -> tuple[str, str | None]:
    """The URL without the store's own ``schema=`` query option, and that option (the PostgreSQL search path)."""
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
    directory; any other URL as it is. A relative path means the current
    directory of whichever process reads it: pin it down before handing the
    URL to processes that run elsewhere (Spark's executors)."""
    path = relative_sqlite_path(url)
    if path is None:
        return url
    parsed = sa.engine.make_url(url)
    return parsed.set(database=os.path.abspath(path)).render_as_string(hide_password=False)


def make_engine(
    url: str,
    *,
    read_only: bool = False,
    pool_size: int = 5,
    max_overflow: int = 10,
    sqlite_pooled: bool = True,
    sqlite_synchronous: str = "FULL",
) -> sa.Engine:
    """An engine on the store's database.

    SQLite: the store's settings (WAL, 16 KB pages, incremental vacuum, 30 s
    busy timeout, ``synchronous``), transactions begun by us: ``BEGIN``, or
    ``BEGIN IMMEDIATE`` on :data:`WRITE` connections. ``read_only`` opens the
    file with ``mode=ro`` and memory-mapped reads, unpooled (what processes
    that only read, such as Spark's tasks, want). ``sqlite_pooled=False``: every
    connection opens the file anew (short-lived and forked processes).
    PostgreSQL: the ``schema=`` option becomes the search path.
    """
    clean, schema = split_url(url)
    if clean.startswith("sqlite"):
        path = sa.engine.make_url(clean).database
        if read_only and path and path != ":memory:":
            return _read_only_sqlite(path)
        sqlite_synchronous = check_store_options(clean, {"sqlite_synchronous": sqlite_synchronous})[
            "sqlite_synchronous"
        ]
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        connect_args = {"timeout": 30, "check_same_thread": False}
        if sqlite_pooled:
            engine = sa.create_engine(clean, pool_size=pool_size, max_overflow=max_overflow, connect_args=connect_args)
        else:
            engine = sa.create_engine(clean, poolclass=sa.pool.NullPool, connect_args=connect_args)
        _set_up_sqlite(engine, sqlite_synchronous)
        return engine
    pg_args: dict[str, Any] = {"connect_timeout": 10}
    if schema:
        pg_args["options"] = f"-csearch_path={schema}"
    return sa.create_engine(
        clean, pool_size=pool_size, max_overflow=max_overflow, pool_pre_ping=True, connect_args=pg_args
    )


def _read_only_sqlite(path: str) -> sa.Engine:
    uri = f"file:{os.path.abspath(path)}?mode=ro"

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(uri, uri=True, timeout=30, check_same_thread=False)
        # memory-mapped reads: a column stored after a large document in its row is reached by walking the
        # document's overflow pages, which mapped pages make much cheaper than read() calls
        conn.execute(f"PRAGMA mmap_size={_READ_MMAP}")
        return conn

    return sa.create_engine("sqlite://", creator=connect, poolclass=sa.pool.NullPool)


def _set_up_sqlite(engine: sa.Engine, synchronous: str) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        # 16 KB pages (a new database only; no effect on an existing one): a business document of
        # 10-15 KB then fits in one page instead of a chain of overflow pages, which cost the writer
        # far more CPU per stored document
        cur.execute("PRAGMA page_size=16384")
        # likewise for a new database only: pages freed by deletes can be given back to the file system a
        # few at a time (PRAGMA incremental_vacuum, in short write transactions) instead of only by a
        # VACUUM, which rewrites the whole file holding the write lock throughout
        cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
        cur.execute("PRAGMA journal_mode=WAL")
        # checkpoint at ~4 MB of WAL, as with 4 KB pages (the store's writer checkpoints after its
        # transactions instead, outside the write turn: SQLStore._checkpoint)
        cur.execute("PRAGMA wal_autocheckpoint=256")
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA secure_delete=OFF")  # freed pages are not zeroed: far less to write per ack
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(WRITE) else "BEGIN")


def write_connection(engine: sa.Engine) -> sa.Connection:
    """A connection whose transactions take SQLite's write lock at BEGIN (see :data:`WRITE`)."""
    return engine.connect().execution_options(**{WRITE: True})


def _alembic_config(script_location: str) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", script_location)
    return cfg


@functools.cache
def head_revision(script_location: str) -> str:
    """The head revision of an Alembic script directory (read once per process)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config(script_location)).get_current_head() or ""


def current_revision(bind: sa.Engine | sa.Connection, version_table: str) -> str | None:
    """The revision recorded in *version_table* (None: no tables yet)."""
    from alembic.runtime.migration import MigrationContext

    if isinstance(bind, sa.Connection):
        return MigrationContext.configure(bind, opts={"version_table": version_table}).get_current_revision()
    with bind.connect() as conn:
        revision = current_revision(conn, version_table)
        conn.rollback()
        return revision


def migrate(bind: sa.Engine | sa.Connection, script_location: str, version_table: str) -> str:
    """Upgrade the tables of an Alembic chain to its head; returns the head.

    The upgrade holds the store's write lock (SQLite: ``BEGIN IMMEDIATE``;
    PostgreSQL: an advisory lock), so processes that start together upgrade one
    after the other and the later ones find the work done. A connection passed
    in is used in its own transaction: open it with :func:`write_connection`.
    """
    head = head_revision(script_location)
    with _MIGRATE_LOCK:
        if isinstance(bind, sa.Connection):
            _upgrade(bind, script_location)
            return head
        if current_revision(bind, version_table) == head:
            return head
        with write_connection(bind) as conn:
            _upgrade(conn, script_location)
            conn.commit()
    return head


def run_migrations(metadata: sa.MetaData, version_table: str) -> None:
    """The body of each chain's Alembic ``env.py``: its migrations on the connection :func:`migrate` passes
    in, recorded in the chain's own version table, so the chains live side by side in one database."""
    from alembic import context

    connection = context.config.attributes["connection"]
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=version_table,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def _upgrade(conn: sa.Connection, script_location: str) -> None:
    from alembic import command

    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATE_LOCK})
    cfg = _alembic_config(script_location)
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, "head")


def upgrade_database(url: str) -> str:
    """Create or upgrade the broker's own tables; returns the revision (``b2bgw db upgrade``)."""
    engine = make_engine(url)
    try:
        return migrate(engine, MIGRATIONS, VERSION_TABLE)
    finally:
        engine.dispose()
