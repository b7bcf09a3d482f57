"""The load's bookkeeping in the SQL store: runs, watermark, quarantine, lock.

Tables (created by this package's own Alembic chain, ``spark_etl/migrations``,
version table ``b2b_etl_version``, upgraded automatically before every job):

``etl_runs``
    One row per run: mode (``incremental``, ``full``, ``since``), status
    (``running`` -> ``publishing`` -> ``succeeded`` or ``failed``), owner,
    start and end (epoch ms), the window ``(seq_from, seq_to]``, documents
    read, rows written, documents loaded / quarantined / skipped, the error,
    the publish journal (``manifest``, JSON) and statistics (``stats``, JSON:
    per-table rows, reconciliation figures). The **watermark** is the largest
    ``seq_to`` of a succeeded run: it moves only when a run is recorded as
    succeeded, which happens after its Parquet files are in place.

``etl_quarantine``
    Documents that could not be loaded: message id, partner, doc type, ledger
    seq, reason, run. A later run that loads the document (``--full`` after a
    fix) removes its row.

``etl_lock``
    A lease: ``name`` (one row, ``"warehouse"``), ``owner``, ``expires_at``
    (epoch ms) and ``slot`` (the scheduled time of the last nightly run that
    took it). Taking it is one conditional UPDATE (after an INSERT that only
    the first ever caller can win), so exactly one process gets it; the holder
    renews it while it works; a crashed holder's lease simply expires.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from broker_core import sql
from broker_core.clock import now_ms
from broker_core.sql import write_connection

from .errors import SparkEtlError

__all__ = [
    "Lease",
    "LockLostError",
    "RunRecord",
    "metadata",
    "upgrade",
]

log = logging.getLogger(__name__)

metadata = sa.MetaData()

runs = sa.Table(
    "etl_runs",
    metadata,
    sa.Column("run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("mode", sa.String(20), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("owner", sa.String(200), nullable=False),
    sa.Column("started_at", sa.BigInteger, nullable=False),
    sa.Column("finished_at", sa.BigInteger),
    sa.Column("seq_from", sa.BigInteger, nullable=False),
    sa.Column("seq_to", sa.BigInteger, nullable=False),
    sa.Column("docs_read", sa.BigInteger),
    sa.Column("rows_written", sa.BigInteger),
    sa.Column("loaded", sa.BigInteger),
    sa.Column("quarantined", sa.BigInteger),
    sa.Column("skipped", sa.BigInteger),
    sa.Column("error", sa.Text),
    sa.Column("manifest", sa.Text),
    sa.Column("stats", sa.Text),
    sa.Index("ix_etl_runs_status", "status", "seq_to"),
    sqlite_autoincrement=True,
)

quarantine = sa.Table(
    "etl_quarantine",
    metadata,
    sa.Column("message_id", sa.String(128), primary_key=True),
    sa.Column("run_id", sa.BigInteger, nullable=False),
    sa.Column("partner", sa.String(100), nullable=False),
    sa.Column("doc_type", sa.String(100), nullable=False),
    sa.Column("ledger_seq", sa.BigInteger, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("quarantined_at", sa.BigInteger, nullable=False),
    sa.Index("ix_etl_quarantine_run", "run_id"),
)

lock = sa.Table(
    "etl_lock",
    metadata,
    sa.Column("name", sa.String(100), primary_key=True),
    sa.Column("owner", sa.String(200)),
    sa.Column("acquired_at", sa.BigInteger),
    sa.Column("expires_at", sa.BigInteger, nullable=False),
    sa.Column("slot", sa.BigInteger),
)

VERSION_TABLE = "b2b_etl_version"


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------- migrations


#: The Alembic script directory of the load's tables.
MIGRATIONS = os.path.join(os.path.dirname(__file__), "migrations")


def upgrade(engine: sa.Engine) -> str:
    """Create or upgrade the load's tables (Alembic, ``b2b_etl_version``);
    serialised between processes (SQLite write lock, PostgreSQL advisory lock)."""
    return sql.migrate(engine, MIGRATIONS, VERSION_TABLE)


# --------------------------------------------------------------------------- runs


@dataclass
class RunRecord:
    run_id: int
    mode: str
    status: str
    owner: str
    started_at: int
    finished_at: int | None
    seq_from: int
    seq_to: int
    docs_read: int | None
    rows_written: int | None
    loaded: int | None
    quarantined: int | None
    skipped: int | None
    error: str | None
    manifest: dict | None
    stats: dict | None

    @property
    def watermark(self) -> int | None:
        return self.seq_to if self.status == "succeeded" else None


def _record(row: Any) -> RunRecord:
    d = dict(row._mapping)
    d["manifest"] = json.loads(d["manifest"]) if d.get("manifest") else None
    d["stats"] = json.loads(d["stats"]) if d.get("stats") else None
    return RunRecord(**d)


def watermark(conn: sa.Connection) -> int:
    """The high-water mark: the largest seq_to of a succeeded run (0 when none)."""
    q = sa.select(sa.func.max(runs.c.seq_to)).where(runs.c.status == "succeeded")
    return int(conn.execute(q).scalar_one() or 0)


def start_run(engine: sa.Engine, *, mode: str, owner: str, seq_from: int, seq_to: int) -> int:
    with write_connection(engine) as conn:
        run_id = conn.execute(
            runs.insert().values(
                mode=mode, status="running", owner=owner, started_at=now_ms(), seq_from=seq_from, seq_to=seq_to
            )  # fmt: skip
        ).inserted_primary_key[0]
        conn.commit()
    return int(run_id)


def update_run(engine: sa.Engine, run_id: int, **values: Any) -> None:
    for key in ("manifest", "stats"):
        if key in values and values[key] is not None and not isinstance(values[key], str):
            values[key] = json.dumps(values[key], sort_keys=True, default=str)
    with write_connection(engine) as conn:
        conn.execute(runs.update().where(runs.c.run_id == run_id).values(**values))
        conn.commit()


def list_runs(conn: sa.Connection, limit: int = 20) -> list[RunRecord]:
    rows = conn.execute(sa.select(runs).order_by(runs.c.run_id.desc()).limit(limit)).all()
    return [_record(r) for r in rows]


def unfinished_runs(conn: sa.Connection) -> list[RunRecord]:
    rows = conn.execute(
        sa.select(runs).where(runs.c.status.in_(("running", "publishing"))).order_by(runs.c.run_id)
    ).all()
    return [_record(r) for r in rows]


def finish_run(
    engine: sa.Engine,
    run_id: int,
    *,
    lease: Lease | None,
    quarantine_rows: Iterable[dict[str, Any]] = (),
    window_ids_cleared: tuple[int, int] | None = None,
    **values: Any,
) -> None:
    """Record the run as succeeded (which advances the watermark) and write
    its quarantine rows, in ONE transaction that also checks the lease is
    still ours (else :class:`LockLostError` and nothing changes)."""
    for key in ("manifest", "stats"):
        if key in values and values[key] is not None and not isinstance(values[key], str):
            values[key] = json.dumps(values[key], sort_keys=True, default=str)
    rows = list(quarantine_rows)
    now = now_ms()
    with write_connection(engine) as conn:
        if lease is not None and not lease.check(conn):
            conn.rollback()
            raise LockLostError("the warehouse lock was lost before the run could be recorded")
        if window_ids_cleared is not None:
            lo, hi = window_ids_cleared
            conn.execute(quarantine.delete().where(quarantine.c.ledger_seq > lo, quarantine.c.ledger_seq <= hi))
        if rows:
            conn.execute(quarantine.delete().where(quarantine.c.message_id.in_([r["message_id"] for r in rows])))
            conn.execute(quarantine.insert(), [{**r, "run_id": run_id, "quarantined_at": now} for r in rows])
        conn.execute(runs.update().where(runs.c.run_id == run_id).values(status="succeeded", finished_at=now, **values))
        conn.commit()


def list_quarantine(conn: sa.Connection, limit: int = 100) -> list[dict[str, Any]]:
    rows = conn.execute(sa.select(quarantine).order_by(quarantine.c.ledger_seq).limit(limit)).all()
    return [dict(r._mapping) for r in rows]


# --------------------------------------------------------------------------- lock


class LockLostError(SparkEtlError, RuntimeError):
    """The lease expired or was taken over while the job ran."""


class Lease:
    """The ``etl_lock`` lease. ``acquire()`` is atomic across processes: it is
    a single ``UPDATE ... WHERE expired OR ours`` (after an ``INSERT`` that
    creates the row the first time, which only one process can win); with a
    ``slot`` (the scheduled fire time of a nightly run) it also requires that
    no process already ran that slot, so a late scheduler in another gateway
    process does not run the same night twice. While held, a daemon thread
    renews it every ``ttl / 3``; ``lost`` turns true if a renewal finds it
    gone."""

    NAME = "warehouse"

    def __init__(self, engine: sa.Engine, *, ttl: float = 600.0, owner: str | None = None, name: str = NAME) -> None:
        self.engine = engine
        self.ttl_ms = int(ttl * 1000)
        self.owner = owner or owner_id()
        self.name = name
        self.lost = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self, slot: int | None = None) -> bool:
        now = now_ms()
        with write_connection(self.engine) as conn:
            exists = conn.execute(sa.select(lock.c.name).where(lock.c.name == self.name)).first()
            if exists is None:
                try:
                    conn.execute(lock.insert().values(name=self.name, owner=self.owner, acquired_at=now,
                                                      expires_at=now + self.ttl_ms, slot=slot))  # fmt: skip
                    conn.commit()
                    self._start_renewing()
                    return True
                except sa.exc.IntegrityError:  # another process created it first: compete below
                    conn.rollback()
            cond = [lock.c.name == self.name, sa.or_(lock.c.expires_at < now, lock.c.owner == self.owner)]
            values: dict[str, Any] = {"owner": self.owner, "acquired_at": now, "expires_at": now + self.ttl_ms}
            if slot is not None:
                cond.append(sa.or_(lock.c.slot.is_(None), lock.c.slot < slot))
                values["slot"] = slot
            won = conn.execute(lock.update().where(*cond).values(**values)).rowcount == 1
            conn.commit()
        if won:
            self._start_renewing()
        return won

    def check(self, conn: sa.Connection) -> bool:
        """Inside a write transaction: is the lease still ours (and extend it)?
        A lease that expired but that nobody took over is still ours."""
        res = conn.execute(
            lock.update()
            .where(lock.c.name == self.name, lock.c.owner == self.owner)
            .values(expires_at=now_ms() + self.ttl_ms)
        )
        return res.rowcount == 1

    def renew(self) -> bool:
        try:
            with write_connection(self.engine) as conn:
                ok = self.check(conn)
                conn.commit()
        except sa.exc.OperationalError as exc:  # a busy database: try again at the next beat
            log.warning("could not renew the warehouse lock: %s", exc)
            return True
        if not ok:
            self.lost = True
        return ok

    def _start_renewing(self) -> None:
        self.lost = False
        self._stop.clear()

        def beat() -> None:
            while not self._stop.wait(self.ttl_ms / 3000):
                if not self.renew():
                    log.error("the warehouse lock was lost (expired or taken over)")
                    return

        self._thread = threading.Thread(target=beat, name="etl-lock-renew", daemon=True)
        self._thread.start()

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        with write_connection(self.engine) as conn:
            conn.execute(
                lock.update()
                .where(lock.c.name == self.name, lock.c.owner == self.owner)
                .values(owner=None, expires_at=0)
            )
            conn.commit()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def open_store(url: str) -> sa.Engine:
    """An engine on the store with the load's tables up to date."""
    engine = sql.make_engine(url, pool_size=2, max_overflow=4, sqlite_pooled=False)
    upgrade(engine)
    return engine
