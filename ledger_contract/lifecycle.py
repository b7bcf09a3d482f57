"""The ledger's side of retention: finding due documents, purging them (leaving tombstones) and the
archive job's journal. The archive job itself (Parquet, verification, crash recovery) is :mod:`spark_etl.archive`.

Writes are functions of a store transaction's connection, run by the store's writer (:meth:`broker_core.Broker.write`,
:func:`spark_etl.archive.store_writer`) like every other ledger write: on SQLite they take the processes' write
turn, on PostgreSQL the store's commit-order lock that the ledger's inserts take too, so a purge and a replay of
what it purges never interleave. Each purge transaction is bounded: :class:`Pacer` sizes them to about ten
milliseconds and pauses between them, long enough for a busy intake to keep nine tenths of the write turn.
Reads are short transactions on the store's engine: no PostgreSQL snapshot stays open across a batch (which
would hold back autovacuum).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from broker_core.clock import now_ms

from .retention import PolicyClass, RetentionPolicy
from .tables import FINAL_STATUSES, archive_batches, archive_cursors, archive_runs, documents, events, tombstones

__all__ = [
    "ARCHIVE_COLUMNS",
    "PURGE_COLUMNS",
    "Pacer",
    "activity_mark",
    "Write",
    "abandon_runs",
    "class_condition",
    "due_counts",
    "expire_tombstones",
    "expired_batches",
    "histories",
    "iter_chunks",
    "list_runs",
    "load_cursor",
    "new_batch",
    "now_ms",  # broker_core.clock's, still imported from here by gateway/store_stats.py
    "open_batches",
    "purge",
    "save_cursor",
    "scan_due",
    "set_batch",
    "start_run",
    "update_run",
    "warehouse_watermark",
]

#: The ledger columns an archived document keeps (the warehouse facts are in the warehouse already).
ARCHIVE_COLUMNS = [c for c in documents.c if c.name not in ("facts", "facts_version")]
#: What a purge without archive reads of a due row.
PURGE_COLUMNS = [documents.c.message_id, documents.c.updated_at]

Write = Callable[[Callable[[sa.Connection], Any]], Any]


# --------------------------------------------------------------------------- due documents


def class_condition(cls: PolicyClass) -> sa.ColumnElement[bool]:
    """The SQL condition of the documents a policy class holds."""
    conds: list[sa.ColumnElement[bool]] = []
    if cls.routes:
        conds.append(documents.c.route.in_(cls.routes))
    if cls.doc_types:
        conds.append(documents.c.doc_type.in_(cls.doc_types))
    if cls.except_routes:
        conds.append(documents.c.route.not_in(cls.except_routes))
    if cls.except_types:
        conds.append(documents.c.doc_type.not_in(cls.except_types))
    return sa.and_(sa.true(), *conds)


def scan_due(
    engine: sa.Engine,
    cls: PolicyClass,
    status: str,
    cutoff: int,
    after: tuple[int, str] | None,
    limit: int,
    columns: Sequence[sa.ColumnElement[Any]] = ARCHIVE_COLUMNS,
) -> list[Any]:
    """Up to *limit* ledger rows of *cls* in *status* last changed before *cutoff* (epoch ms), in
    (updated_at, message_id) order after the cursor *after*: a range of the ledger's status index.
    *columns*: what to read of them (:data:`PURGE_COLUMNS` for a purge, which needs no XML)."""
    query = sa.select(*columns).where(
        documents.c.status == status, documents.c.updated_at < cutoff, class_condition(cls)
    )
    if after is not None:
        query = query.where(sa.tuple_(documents.c.updated_at, documents.c.message_id) > sa.tuple_(*after))
    query = query.order_by(documents.c.updated_at, documents.c.message_id).limit(limit)
    with engine.connect() as conn:
        rows = list(conn.execute(query).mappings().all())
        conn.rollback()
    return rows


def histories(engine: sa.Engine, message_ids: Sequence[str], chunk: int = 900) -> dict[str, list[tuple[int, str, int]]]:
    """``message_id -> [(seq, status, at), ...]`` (in seq order) of the documents' ledger events."""
    out: dict[str, list[tuple[int, str, int]]] = {mid: [] for mid in message_ids}
    query = (
        sa.select(events.c.message_id, events.c.seq, events.c.status, events.c.at)
        .where(events.c.message_id.in_(sa.bindparam("ids", expanding=True)))
        .order_by(events.c.seq)
    )
    with engine.connect() as conn:
        for i in range(0, len(message_ids), chunk):
            for mid, seq, status, at in conn.execute(query, {"ids": list(message_ids[i : i + chunk])}).all():
                out[mid].append((seq, status, at))
        conn.rollback()
    return out


def warehouse_watermark(engine: sa.Engine) -> int | None:
    """The warehouse load's high-water mark (the ledger event seq its last successful run read up to), or
    None when the load has no tables in this store (it never ran here)."""
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table("etl_runs"):
            return None
        value = conn.execute(sa.text("SELECT max(seq_to) FROM etl_runs WHERE status = 'succeeded'")).scalar()
        conn.rollback()
    return int(value or 0)


def due_counts(engine: sa.Engine, policy: RetentionPolicy, at: int) -> dict[str, Any]:
    """How many documents the policy makes due by *at* (epoch ms), per class and what happens to them; and
    how many not-final documents are that old (they stay online)."""
    out: dict[str, Any] = {"archive": 0, "purge": 0, "not_final": 0, "classes": []}
    with engine.connect() as conn:
        for cls in policy.classes():
            cutoff = at - cls.rule.online_ms
            n = conn.execute(
                sa.select(sa.func.count())
                .select_from(documents)
                .where(documents.c.status.in_(FINAL_STATUSES), documents.c.updated_at < cutoff, class_condition(cls))
            ).scalar_one()
            waiting = conn.execute(
                sa.select(sa.func.count())
                .select_from(documents)
                .where(
                    documents.c.status.in_(("accepted", "dead_lettered")),
                    documents.c.updated_at < cutoff,
                    class_condition(cls),
                )
            ).scalar_one()
            out[cls.rule.after] += n
            out["not_final"] += waiting
            out["classes"].append(
                {
                    "class": _describe(cls),
                    "online_days": cls.rule.online / 86400,
                    "after": cls.rule.after,
                    "due": n,
                    "not_final": waiting,
                }
            )
        conn.rollback()
    return out


def _describe(cls: PolicyClass) -> str:
    if cls.routes:
        return "routes " + ", ".join(cls.routes)
    if cls.doc_types:
        return "document types " + ", ".join(cls.doc_types)
    return "every other document" if (cls.except_routes or cls.except_types) else "every document"


# --------------------------------------------------------------------------- purge (store transactions)


def purge(conn: sa.Connection, items: Sequence[tuple[str, int]], batch_id: int, archived: bool, at: int) -> int:
    """Remove the ledger rows *items* (``(message_id, updated_at)`` as archived) and their events, leaving a
    tombstone of each, in the caller's (the store writer's) transaction; the number purged. A row changed
    since it was archived is left alone: a change stamps it with its own time, later than any *items*
    holds. Repeating it is harmless: a row already purged matches nothing."""
    if not items:
        return 0
    ids = [mid for mid, _ in items]
    params = {
        "ids": ids,
        "newest": max(updated for _, updated in items),
        "at": at,
        "batch": batch_id,
        "archived": archived,
    }
    # set-based, by explicit id lists (index lookups on both databases)
    conn.execute(
        sa.text(
            f"INSERT INTO {tombstones.name} (message_id, partner, idempotency_key, digest, received_at, purged_at, "
            f"batch_id, archived) SELECT message_id, partner, idempotency_key, digest, received_at, :at, :batch, "
            f":archived FROM {documents.name} WHERE message_id IN :ids AND updated_at <= :newest"
        ).bindparams(sa.bindparam("ids", expanding=True)),
        params,
    )
    conn.execute(
        documents.delete().where(
            documents.c.message_id.in_(sa.bindparam("ids", expanding=True)),
            documents.c.updated_at <= sa.bindparam("newest"),
        ),
        params,
    )
    gone = list(
        conn.execute(
            sa.select(tombstones.c.message_id).where(
                tombstones.c.message_id.in_(ids), tombstones.c.batch_id == batch_id
            )
        ).scalars()
    )
    if gone:
        conn.execute(events.delete().where(events.c.message_id.in_(gone)))
    return len(gone)


def expire_tombstones(conn: sa.Connection, batch_id: int) -> int:
    """Drop the tombstones of one purged batch (their time is over); how many."""
    removed = conn.execute(tombstones.delete().where(tombstones.c.batch_id == batch_id)).rowcount
    conn.execute(
        archive_batches.update()
        .where(archive_batches.c.batch_id == batch_id)
        .values(status="expired", updated_at=now_ms())
    )
    return int(removed or 0)


class Pacer:
    """Sizes the purge's store transactions so each runs about ``target`` seconds, and pauses after each so
    that the intake keeps the store: ``rest`` times as long as the transaction ran while the store is
    otherwise quiet, ``busy_rest`` times as long as it took in all (its wait for the write turn and its
    commit included) once it is not. Busy: this transaction and the one before waited for the turn, or for
    other work committed with them, longer than they ran themselves, or ``activity()`` (a mark that
    others' writes raise: the ledger's newest event) rose since the last one. With the default a busy
    store's purge takes a tenth of the time at most, and runs at full speed once the intake is quiet."""

    def __init__(
        self,
        target: float = 0.01,
        rest: float = 0.25,
        busy_rest: float = 9.0,
        first: int = 50,
        most: int = 2000,
        least: int = 20,
        activity: Callable[[], Any] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.clock, self.sleep = clock, sleep  # injected by the tests, which keep time themselves
        self.target, self.rest, self.busy_rest = target, rest, busy_rest
        self.size, self.most, self.least = first, most, least
        self.activity = activity
        self.busy = 0  # transactions that found the store busy

    def run(
        self,
        write: Write,
        fn: Callable[[sa.Connection, Sequence[Any]], Any],
        items: Sequence[Any],
        stop: Callable[[], bool] = lambda: False,
    ) -> list[Any]:
        """``write(lambda conn: fn(conn, chunk))`` for consecutive chunks of *items*; the results."""
        results = []
        i = 0
        activity = self.activity
        mark = activity() if activity is not None else None
        waited_before = False
        clock = self.clock
        while i < len(items):
            if stop():
                break
            chunk = items[i : i + self.size]
            ran = [0.0]

            def timed(conn: sa.Connection, chunk: Sequence[Any] = chunk, ran: list[float] = ran) -> Any:
                t = clock()
                try:
                    return fn(conn, chunk)
                finally:
                    ran[0] = clock() - t

            t = clock()
            results.append(write(timed))
            took = clock() - t
            i += len(chunk)
            own = max(ran[0], 1e-6)
            self.size = max(self.least, min(self.most, int(self.target / (own / len(chunk)))))
            waited = took - own > max(own, 0.002)
            # one wait alone is no sign of a busy store: this process's own threads (the archive writing
            # the next batch, holding the GIL) delay a transaction now and then
            busy, waited_before = waited and waited_before, waited
            if activity is not None:
                now_mark = activity()
                if now_mark is not None and (mark is None or now_mark > mark):
                    busy, mark = True, now_mark
            self.busy += busy
            if i < len(items):
                self.sleep(took * self.busy_rest if busy else own * self.rest)
        return results


def activity_mark(engine: sa.Engine) -> int | None:
    """The ledger's newest event: it rises whenever the gateway takes in a document or records a status.
    (A purge removes old events only, unless every document is due: then it may fall, and the intake is
    quiet.)"""
    with engine.connect() as conn:
        mark = conn.execute(sa.select(sa.func.max(events.c.seq))).scalar()
        conn.rollback()
    return None if mark is None else int(mark)


# --------------------------------------------------------------------------- the archive job's journal


def start_run(write: Write, owner: str) -> int:
    def op(conn: sa.Connection) -> int:
        return int(
            conn.execute(
                archive_runs.insert().values(
                    owner=owner,
                    status="running",
                    started_at=now_ms(),
                    archived=0,
                    purged=0,
                    waiting=0,
                    tombstones_expired=0,
                    bytes=0,
                )
            ).inserted_primary_key[0]
        )

    return write(op)


def update_run(write: Write, run_id: int, **values: Any) -> None:
    if isinstance(values.get("stats"), dict):
        values["stats"] = json.dumps(values["stats"], sort_keys=True, default=str)
    write(lambda conn: conn.execute(archive_runs.update().where(archive_runs.c.run_id == run_id).values(**values)))


def new_batch(
    write: Write, run_id: int, kind: str, documents_: int, files: list[dict[str, Any]] | None, status: str
) -> int:
    def op(conn: sa.Connection) -> int:
        now = now_ms()
        return int(
            conn.execute(
                archive_batches.insert().values(
                    run_id=run_id,
                    kind=kind,
                    status=status,
                    created_at=now,
                    updated_at=now,
                    documents=documents_,
                    purged=0,
                    files=json.dumps(files) if files is not None else None,
                )
            ).inserted_primary_key[0]
        )

    return write(op)


def set_batch(write: Write, batch_id: int, **values: Any) -> None:
    if "files" in values and not isinstance(values["files"], (str, type(None))):
        values["files"] = json.dumps(values["files"])
    values.setdefault("updated_at", now_ms())
    write(
        lambda conn: conn.execute(
            archive_batches.update().where(archive_batches.c.batch_id == batch_id).values(**values)
        )
    )


def open_batches(engine: sa.Engine) -> list[dict[str, Any]]:
    """Batches a run left between ``writing`` and ``purged`` (a crash): recovery finishes them."""
    with engine.connect() as conn:
        rows = [
            dict(r._mapping)
            for r in conn.execute(
                sa.select(archive_batches)
                .where(archive_batches.c.status.in_(("writing", "written", "verified")))
                .order_by(archive_batches.c.batch_id)
            )
        ]
        conn.rollback()
    for row in rows:
        row["files"] = json.loads(row["files"]) if row["files"] else []
    return rows


def abandon_runs(write: Write) -> int:
    """Mark runs still ``running`` (their process died) as interrupted; how many."""

    def op(conn: sa.Connection) -> int:
        return int(
            conn.execute(
                archive_runs.update()
                .where(archive_runs.c.status == "running")
                .values(
                    status="interrupted",
                    finished_at=now_ms(),
                    error="the process ended during the run; the next run finished its batches",
                )
            ).rowcount
            or 0
        )

    return write(op)


def load_cursor(engine: sa.Engine, name: str) -> tuple[int, str] | None:
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(archive_cursors.c.updated_at, archive_cursors.c.message_id).where(archive_cursors.c.name == name)
        ).first()
        conn.rollback()
    return None if row is None else (int(row.updated_at), row.message_id)


def save_cursor(write: Write, name: str, cursor: tuple[int, str]) -> None:
    def op(conn: sa.Connection) -> None:
        values = {"updated_at": cursor[0], "message_id": cursor[1]}
        if conn.execute(archive_cursors.update().where(archive_cursors.c.name == name).values(**values)).rowcount == 0:
            conn.execute(archive_cursors.insert().values(name=name, **values))

    write(op)


def expired_batches(engine: sa.Engine, before: int, limit: int = 100) -> list[int]:
    """Purged batches whose tombstones are older than *before* (epoch ms)."""
    with engine.connect() as conn:
        ids = [
            int(r[0])
            for r in conn.execute(
                sa.select(archive_batches.c.batch_id)
                .where(archive_batches.c.status == "purged", archive_batches.c.updated_at < before)
                .order_by(archive_batches.c.batch_id)
                .limit(limit)
            )
        ]
        conn.rollback()
    return ids


def list_runs(engine: sa.Engine, limit: int = 20) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table(archive_runs.name):
            return []
        rows = [
            dict(r._mapping)
            for r in conn.execute(sa.select(archive_runs).order_by(archive_runs.c.run_id.desc()).limit(limit))
        ]
        conn.rollback()
    for row in rows:
        row["stats"] = json.loads(row["stats"]) if row["stats"] else None
    return rows


def iter_chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
