"""The ledger's side of retention: finding due documents, purging them, tombstones, the archive job's
journal, the store's space (``b2bgw db stats``) and giving it back (``b2bgw db vacuum``).

The archive job itself (Parquet, verification, crash recovery) is :mod:`spark_etl.archive`; this module
holds what it does to the ledger, and needs nothing but SQLAlchemy.

Writes are functions of a store transaction's connection, run by the store's writer (:meth:`broker_core.Broker.write`)
like every other ledger write: on SQLite they take the processes' write turn, on PostgreSQL the store's
commit-order lock, the very lock the ledger's inserts take, so a purge and a replay of what it purges
never interleave. Each is bounded: a purge transaction holds at most a few hundred documents
(:class:`Pacer` sizes them to about ten milliseconds and pauses between them, long enough for the intake
to keep nine tenths of the write turn while it is busy), a vacuum step a few hundred pages.
Reads are short transactions on the store's engine: nothing of ours keeps a PostgreSQL snapshot open
across a batch (which would hold back autovacuum).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from .ledger_tables import (
    FINAL_STATUSES,
    STATUSES,
    archive_batches,
    archive_cursors,
    archive_runs,
    documents,
    events,
    tombstones,
)
from .retention import PolicyClass, RetentionPolicy

__all__ = [
    "ARCHIVE_COLUMNS",
    "Pacer",
    "abandon_runs",
    "class_condition",
    "db_stats",
    "due_counts",
    "expire_tombstones",
    "expired_batches",
    "format_stats",
    "full_vacuum",
    "histories",
    "iter_chunks",
    "list_runs",
    "live_instances",
    "load_cursor",
    "new_batch",
    "next_run_time",
    "open_batches",
    "purge",
    "save_cursor",
    "scan_due",
    "set_batch",
    "sqlite_space",
    "start_run",
    "update_run",
    "vacuum",
    "vacuum_step",
    "warehouse_watermark",
]

#: The ledger columns an archived document keeps (the warehouse facts are in the warehouse already).
ARCHIVE_COLUMNS = [c for c in documents.c if c.name not in ("facts", "facts_version")]

Write = Callable[[Callable[[sa.Connection], Any]], Any]


def now_ms() -> int:
    return int(time.time() * 1000)


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


def scan_due(engine: sa.Engine, cls: PolicyClass, status: str, cutoff: int, after: tuple[int, str] | None,
             limit: int) -> list[Any]:
    """Up to *limit* ledger rows of *cls* in *status* last changed before *cutoff* (epoch ms), in
    (updated_at, message_id) order after the cursor *after*: a range of the ledger's status index."""
    query = sa.select(*ARCHIVE_COLUMNS).where(documents.c.status == status, documents.c.updated_at < cutoff,
                                              class_condition(cls))
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
    query = (sa.select(events.c.message_id, events.c.seq, events.c.status, events.c.at)
             .where(events.c.message_id.in_(sa.bindparam("ids", expanding=True))).order_by(events.c.seq))
    with engine.connect() as conn:
        for i in range(0, len(message_ids), chunk):
            for mid, seq, status, at in conn.execute(query, {"ids": list(message_ids[i:i + chunk])}).all():
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
            n = conn.execute(sa.select(sa.func.count()).select_from(documents).where(
                documents.c.status.in_(FINAL_STATUSES), documents.c.updated_at < cutoff,
                class_condition(cls))).scalar_one()
            waiting = conn.execute(sa.select(sa.func.count()).select_from(documents).where(
                documents.c.status.in_(("accepted", "dead_lettered")), documents.c.updated_at < cutoff,
                class_condition(cls))).scalar_one()
            out[cls.rule.after] += n
            out["not_final"] += waiting
            out["classes"].append({"class": _describe(cls), "online_days": cls.rule.online / 86400,
                                   "after": cls.rule.after, "due": n, "not_final": waiting})
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
    params = {"ids": ids, "newest": max(updated for _, updated in items), "at": at, "batch": batch_id,
              "archived": archived}
    # set-based, by explicit id lists (index lookups on both databases)
    conn.execute(sa.text(
        f"INSERT INTO {tombstones.name} (message_id, partner, idempotency_key, digest, received_at, purged_at, "
        f"batch_id, archived) SELECT message_id, partner, idempotency_key, digest, received_at, :at, :batch, "
        f":archived FROM {documents.name} WHERE message_id IN :ids AND updated_at <= :newest"
    ).bindparams(sa.bindparam("ids", expanding=True)), params)
    conn.execute(documents.delete().where(documents.c.message_id.in_(sa.bindparam("ids", expanding=True)),
                                          documents.c.updated_at <= sa.bindparam("newest")), params)
    gone = list(conn.execute(sa.select(tombstones.c.message_id).where(
        tombstones.c.message_id.in_(ids), tombstones.c.batch_id == batch_id)).scalars())
    if gone:
        conn.execute(events.delete().where(events.c.message_id.in_(gone)))
    return len(gone)


def expire_tombstones(conn: sa.Connection, batch_id: int) -> int:
    """Drop the tombstones of one purged batch (their time is over); how many."""
    removed = conn.execute(tombstones.delete().where(tombstones.c.batch_id == batch_id)).rowcount
    conn.execute(archive_batches.update().where(archive_batches.c.batch_id == batch_id)
                 .values(status="expired", updated_at=now_ms()))
    return int(removed or 0)


class Pacer:
    """Sizes the purge's store transactions so each runs about ``target`` seconds, and pauses after each so
    that the intake keeps the write turn: ``rest`` times as long as the transaction ran while the store is
    otherwise quiet, ``busy_rest`` times as long once it is not (the transaction waited for the turn, or
    for other work committed with it, longer than it ran itself: with the default the purge then takes a
    tenth of the turn at most)."""

    def __init__(self, target: float = 0.01, rest: float = 0.25, busy_rest: float = 9.0, first: int = 50,
                 most: int = 2000, least: int = 20) -> None:
        self.target, self.rest, self.busy_rest = target, rest, busy_rest
        self.size, self.most, self.least = first, most, least
        self.busy = 0  # transactions that found the store busy

    def run(self, write: Write, fn: Callable[[sa.Connection, Sequence[Any]], Any], items: Sequence[Any],
            stop: Callable[[], bool] = lambda: False) -> list[Any]:
        """``write(lambda conn: fn(conn, chunk))`` for consecutive chunks of *items*; the results."""
        results = []
        i = 0
        while i < len(items):
            if stop():
                break
            chunk = items[i:i + self.size]
            ran = [0.0]

            def timed(conn: sa.Connection, chunk: Sequence[Any] = chunk) -> Any:
                t = time.perf_counter()
                try:
                    return fn(conn, chunk)
                finally:
                    ran[0] = time.perf_counter() - t

            t = time.perf_counter()
            results.append(write(timed))
            took = time.perf_counter() - t
            i += len(chunk)
            own = max(ran[0], 1e-6)
            self.size = max(self.least, min(self.most, int(self.target / (own / len(chunk)))))
            busy = took - own > max(own, 0.002)
            self.busy += busy
            if i < len(items):
                time.sleep(own * (self.busy_rest if busy else self.rest))
        return results


# --------------------------------------------------------------------------- the archive job's journal


def start_run(write: Write, owner: str) -> int:
    def op(conn: sa.Connection) -> int:
        return int(conn.execute(archive_runs.insert().values(
            owner=owner, status="running", started_at=now_ms(), archived=0, purged=0, waiting=0,
            tombstones_expired=0, bytes=0)).inserted_primary_key[0])

    return write(op)


def update_run(write: Write, run_id: int, **values: Any) -> None:
    if isinstance(values.get("stats"), dict):
        values["stats"] = json.dumps(values["stats"], sort_keys=True, default=str)
    write(lambda conn: conn.execute(archive_runs.update().where(archive_runs.c.run_id == run_id).values(**values)))


def new_batch(write: Write, run_id: int, kind: str, documents_: int, files: list[dict[str, Any]] | None,
              status: str) -> int:
    def op(conn: sa.Connection) -> int:
        now = now_ms()
        return int(conn.execute(archive_batches.insert().values(
            run_id=run_id, kind=kind, status=status, created_at=now, updated_at=now, documents=documents_,
            purged=0, files=json.dumps(files) if files is not None else None)).inserted_primary_key[0])

    return write(op)


def set_batch(write: Write, batch_id: int, **values: Any) -> None:
    if "files" in values and not isinstance(values["files"], (str, type(None))):
        values["files"] = json.dumps(values["files"])
    values.setdefault("updated_at", now_ms())
    write(lambda conn: conn.execute(archive_batches.update().where(archive_batches.c.batch_id == batch_id)
                                    .values(**values)))


def open_batches(engine: sa.Engine) -> list[dict[str, Any]]:
    """Batches a run left between ``writing`` and ``purged`` (a crash): recovery finishes them."""
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(
            sa.select(archive_batches).where(archive_batches.c.status.in_(("writing", "written", "verified")))
            .order_by(archive_batches.c.batch_id))]
        conn.rollback()
    for row in rows:
        row["files"] = json.loads(row["files"]) if row["files"] else []
    return rows


def abandon_runs(write: Write) -> int:
    """Mark runs still ``running`` (their process died) as interrupted; how many."""
    def op(conn: sa.Connection) -> int:
        return int(conn.execute(archive_runs.update().where(archive_runs.c.status == "running").values(
            status="interrupted", finished_at=now_ms(),
            error="the process ended during the run; the next run finished its batches")).rowcount or 0)

    return write(op)


def load_cursor(engine: sa.Engine, name: str) -> tuple[int, str] | None:
    with engine.connect() as conn:
        row = conn.execute(sa.select(archive_cursors.c.updated_at, archive_cursors.c.message_id)
                           .where(archive_cursors.c.name == name)).first()
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
        ids = [int(r[0]) for r in conn.execute(
            sa.select(archive_batches.c.batch_id).where(archive_batches.c.status == "purged",
                                                        archive_batches.c.updated_at < before)
            .order_by(archive_batches.c.batch_id).limit(limit))]
        conn.rollback()
    return ids


def list_runs(engine: sa.Engine, limit: int = 20) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table(archive_runs.name):
            return []
        rows = [dict(r._mapping) for r in conn.execute(
            sa.select(archive_runs).order_by(archive_runs.c.run_id.desc()).limit(limit))]
        conn.rollback()
    for row in rows:
        row["stats"] = json.loads(row["stats"]) if row["stats"] else None
    return rows


# --------------------------------------------------------------------------- space: stats and vacuum


def sqlite_space(engine: sa.Engine) -> dict[str, Any]:
    """SQLite: the file, its WAL, page size, pages and free pages, auto_vacuum mode."""
    path = engine.url.database or ""
    with engine.connect() as conn:
        page_size, pages, free, mode = (conn.exec_driver_sql(f"PRAGMA {p}").scalar() for p in
                                        ("page_size", "page_count", "freelist_count", "auto_vacuum"))
        conn.rollback()
    wal = path + "-wal"
    return {"file": path, "file_bytes": os.path.getsize(path) if os.path.exists(path) else None,
            "wal_bytes": os.path.getsize(wal) if os.path.exists(wal) else 0, "page_size": page_size,
            "pages": pages, "free_pages": free, "free_bytes": free * page_size,
            "auto_vacuum": {0: "none", 1: "full", 2: "incremental"}.get(mode, str(mode))}


def vacuum_step(conn: sa.Connection, pages: int) -> int:
    """SQLite, in a store transaction: give up to *pages* free pages back to the file system (incremental
    vacuum: the file is cut at the next checkpoint); how many were free before."""
    raw = conn.connection.dbapi_connection
    cursor = raw.cursor()
    try:
        free = cursor.execute("PRAGMA freelist_count").fetchone()[0]
        for _ in range(min(pages, free)):  # each step of the pragma frees one page
            cursor.execute("PRAGMA incremental_vacuum(1)").fetchall()
    finally:
        cursor.close()
    return int(free)


def vacuum(engine: sa.Engine, write: Write, *, step_pages: int = 256, max_pages: int | None = None,
           rest: float = 1.0, stop: Callable[[], bool] = lambda: False) -> int:
    """Give the free pages of a SQLite store back, *step_pages* per store transaction (pausing *rest* times
    as long as each took), up to *max_pages*; the pages freed. Nothing on PostgreSQL (autovacuum) or on a
    SQLite file whose auto_vacuum is not incremental (see :func:`full_vacuum`)."""
    if engine.dialect.name != "sqlite" or sqlite_space(engine)["auto_vacuum"] != "incremental":
        return 0
    freed = 0
    while not stop():
        want = step_pages if max_pages is None else min(step_pages, max_pages - freed)
        if want <= 0:
            break
        t = time.perf_counter()
        free = write(lambda conn: vacuum_step(conn, want))
        took = time.perf_counter() - t
        done = min(want, free)
        freed += done
        if done < want or free <= want:
            break
        time.sleep(took * rest)
    return freed


def full_vacuum(url: str) -> dict[str, Any]:
    """SQLite: rewrite the file once with ``auto_vacuum=INCREMENTAL`` (``VACUUM``: the whole file, holding
    its write lock throughout, with as much free disk again). Only with the gateway stopped."""
    import sqlite3

    path = sa.engine.make_url(url).database
    conn = sqlite3.connect(path, isolation_level=None, timeout=60)
    try:
        before = os.path.getsize(path)
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        mode = conn.execute("PRAGMA auto_vacuum").fetchone()[0]
    finally:
        conn.close()
    return {"before": before, "after": os.path.getsize(path), "auto_vacuum": mode}


def live_instances(engine: sa.Engine, within_ms: int = 30_000) -> int:
    """Broker processes that have beaten their heartbeat lately (a running gateway, worker...)."""
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table("b2b_instances"):
            return 0
        n = conn.execute(sa.text("SELECT count(*) FROM b2b_instances WHERE heartbeat > :t"),
                         {"t": now_ms() - within_ms}).scalar()
        conn.rollback()
    return int(n or 0)


_TABLES = ("b2b_ledger", "b2b_ledger_events", "b2b_ledger_tombstones", "b2b_messages", "b2b_entries",
           "b2b_archive_batches", "b2b_archive_runs", "etl_runs")


def next_run_time(policy: RetentionPolicy, now: _dt.datetime | None = None) -> _dt.datetime | None:
    from apscheduler.triggers.cron import CronTrigger

    now = now or _dt.datetime.now(_dt.timezone.utc)
    return CronTrigger.from_crontab(policy.schedule, timezone=policy.timezone).get_next_fire_time(None, now)


def db_stats(engine: sa.Engine, policy: RetentionPolicy | None) -> dict[str, Any]:
    """What ``b2bgw db stats`` shows: the tables' rows and sizes, the file (SQLite), the documents online by
    status, the oldest of them, the retention policy's next run and what it will take."""
    pg = engine.dialect.name == "postgresql"
    out: dict[str, Any] = {"dialect": engine.dialect.name, "tables": []}
    with engine.connect() as conn:
        inspector = sa.inspect(conn)
        present = set(inspector.get_table_names())
        sizes: dict[str, int | None] = {}
        if not pg:
            try:
                sizes = {r[0]: int(r[1]) for r in conn.exec_driver_sql(
                    "SELECT name, sum(pgsize) FROM dbstat GROUP BY name")}
            except sa.exc.OperationalError:  # SQLite built without the dbstat table
                sizes = {}
        for name in _TABLES:
            if name not in present:
                continue
            if pg:
                row = conn.execute(sa.text(
                    "SELECT greatest(c.reltuples, 0)::bigint, pg_total_relation_size(c.oid) FROM pg_class c "
                    "WHERE c.oid = to_regclass(:t)"), {"t": name}).first()
                rows, size, estimated = (int(row[0]), int(row[1]), True) if row else (None, None, True)
            else:
                rows = int(conn.exec_driver_sql(f"SELECT count(*) FROM {name}").scalar())
                indexes = [i["name"] for i in inspector.get_indexes(name)]
                size = (sizes.get(name, 0) + sum(sizes.get(i, 0) for i in indexes)
                        + sum(v for k, v in sizes.items() if k.startswith(f"sqlite_autoindex_{name}_"))) \
                    if sizes else None
                estimated = False
            out["tables"].append({"table": name, "rows": rows, "bytes": size, "estimated": estimated})
        if "b2b_ledger" in present:
            by_status = {r[0]: int(r[1]) for r in conn.execute(
                sa.select(documents.c.status, sa.func.count()).group_by(documents.c.status))}
            out["documents"] = {s: by_status.get(s, 0) for s in STATUSES} | {
                s: n for s, n in by_status.items() if s not in STATUSES}
            oldest = None
            for status in STATUSES:
                row = conn.execute(sa.select(documents.c.message_id, documents.c.received_at, documents.c.updated_at,
                                             documents.c.status).where(documents.c.status == status)
                                   .order_by(documents.c.updated_at, documents.c.message_id).limit(1)).first()
                if row is not None and (oldest is None or row.updated_at < oldest["updated_at"]):
                    oldest = dict(row._mapping)
            out["oldest_online"] = oldest
        conn.rollback()
    if not pg:
        out["file"] = sqlite_space(engine)
    out["retention"] = None
    if policy is not None:
        nxt = next_run_time(policy)
        at = int(nxt.timestamp() * 1000) if nxt is not None else now_ms()
        runs = list_runs(engine, 1)
        out["retention"] = {
            "enabled": policy.enabled,
            "schedule": f"{policy.schedule} ({policy.timezone})",
            "next_run": nxt.isoformat() if nxt is not None else None,
            "due_at_next_run": due_counts(engine, policy, at) if "b2b_ledger" in present else None,
            "last_run": runs[0] if runs else None,
        }
    return out


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def _iso(ms: int | None) -> str:
    if not ms:
        return "-"
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def format_stats(stats: dict[str, Any]) -> str:
    """``b2bgw db stats`` as text."""
    lines = [f"store: {stats['dialect']}"]
    rows = [("TABLE", "ROWS", "SIZE")]
    for t in stats["tables"]:
        rows.append((t["table"], ("~" if t["estimated"] else "") + (f"{t['rows']:,}" if t["rows"] is not None else "-"),
                     _size(t["bytes"])))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines += ["  " + "  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r))
              for r in rows]
    f = stats.get("file")
    if f:
        lines.append(f"file: {f['file']}: {_size(f['file_bytes'])} (WAL {_size(f['wal_bytes'])}), "
                     f"{f['pages']:,} pages of {f['page_size']} bytes, {f['free_pages']:,} free "
                     f"({_size(f['free_bytes'])}); auto_vacuum {f['auto_vacuum']}")
        if f["auto_vacuum"] != "incremental":
            lines.append("  free pages are reused by new documents, but not given back to the file system: run "
                         "`b2bgw db vacuum --full` once, with the gateway stopped, to switch to incremental vacuum")
    docs = stats.get("documents")
    if docs is not None:
        lines.append("documents online: " + ", ".join(f"{n:,} {s}" for s, n in docs.items()))
        old = stats.get("oldest_online")
        if old:
            lines.append(f"oldest online document: {old['message_id']} ({old['status']}), received "
                         f"{_iso(old['received_at'])}, last changed {_iso(old['updated_at'])}")
    ret = stats.get("retention")
    if ret is None:
        lines.append("retention: none configured (ledger.retention): documents stay online for ever")
    else:
        lines.append(f"retention: {'enabled' if ret['enabled'] else 'DISABLED (ledger.retention.enabled: false)'}, "
                     f"schedule {ret['schedule']}, next run {ret['next_run'] or '-'}")
        due = ret.get("due_at_next_run")
        if due:
            lines.append(f"  due at the next run: {due['archive']:,} to archive and purge, {due['purge']:,} to purge; "
                         f"{due['not_final']:,} as old but not in a final status (they stay online)")
            for c in due["classes"]:
                lines.append(f"    {c['class']}: online {c['online_days']:g} days, then {c['after']}: {c['due']:,} due")
        last = ret.get("last_run")
        if last:
            lines.append(f"  last run {last['run_id']} {last['status']} {_iso(last['started_at'])}: "
                         f"{last['archived']:,} archived, {last['purged']:,} purged, {last['waiting']:,} waiting for "
                         f"the warehouse load" + (f"; {last['error'].splitlines()[0][:100]}" if last["error"] else ""))
    return "\n".join(lines)


def iter_chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]

