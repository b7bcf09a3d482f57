"""What ``b2bgw db stats`` shows: the store's tables, its file (SQLite), the documents online and the
retention policy's next run."""

from __future__ import annotations

import datetime as _dt
from typing import Any

import sqlalchemy as sa

from ledger_contract.lifecycle import due_counts, list_runs, now_ms
from ledger_contract.retention import RetentionPolicy
from ledger_contract.space import sqlite_space
from ledger_contract.tables import STATUSES, documents

__all__ = ["db_stats", "format_stats", "live_instances", "next_run_time"]


def live_instances(engine: sa.Engine, within_ms: int = 30_000) -> int:
    """Broker processes that have beaten their heartbeat lately (a running gateway, worker...)."""
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table("b2b_instances"):
            return 0
        n = conn.execute(
            sa.text("SELECT count(*) FROM b2b_instances WHERE heartbeat > :t"), {"t": now_ms() - within_ms}
        ).scalar()
        conn.rollback()
    return int(n or 0)


_TABLES = (
    "b2b_ledger",
    "b2b_ledger_events",
    "b2b_ledger_tombstones",
    "b2b_messages",
    "b2b_entries",
    "b2b_archive_batches",
    "b2b_archive_runs",
    "etl_runs",
)


def next_run_time(policy: RetentionPolicy, now: _dt.datetime | None = None) -> _dt.datetime | None:
    from apscheduler.triggers.cron import CronTrigger

    now = now or _dt.datetime.now(_dt.UTC)
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
                sizes = {
                    r[0]: int(r[1]) for r in conn.exec_driver_sql("SELECT name, sum(pgsize) FROM dbstat GROUP BY name")
                }
            except sa.exc.OperationalError:  # SQLite built without the dbstat table
                sizes = {}
        for name in _TABLES:
            if name not in present:
                continue
            if pg:
                row = conn.execute(
                    sa.text(
                        "SELECT greatest(c.reltuples, 0)::bigint, pg_total_relation_size(c.oid) FROM pg_class c "
                        "WHERE c.oid = to_regclass(:t)"
                    ),
                    {"t": name},
                ).first()
                rows, size, estimated = (int(row[0]), int(row[1]), True) if row else (None, None, True)
            else:
                rows = int(conn.exec_driver_sql(f"SELECT count(*) FROM {name}").scalar())
                indexes = [i["name"] for i in inspector.get_indexes(name)]
                size = (
                    (
                        sizes.get(name, 0)
                        + sum(sizes.get(i, 0) for i in indexes)
                        + sum(v for k, v in sizes.items() if k.startswith(f"sqlite_autoindex_{name}_"))
                    )
                    if sizes
                    else None
                )
                estimated = False
            out["tables"].append({"table": name, "rows": rows, "bytes": size, "estimated": estimated})
        if "b2b_ledger" in present:
            by_status = {
                r[0]: int(r[1])
                for r in conn.execute(sa.select(documents.c.status, sa.func.count()).group_by(documents.c.status))
            }
            out["documents"] = {s: by_status.get(s, 0) for s in STATUSES} | {
                s: n for s, n in by_status.items() if s not in STATUSES
            }
            oldest = None
            for status in STATUSES:
                row = conn.execute(
                    sa.select(
                        documents.c.message_id, documents.c.received_at, documents.c.updated_at, documents.c.status
                    )
                    .where(documents.c.status == status)
                    .order_by(documents.c.updated_at, documents.c.message_id)
                    .limit(1)
                ).first()
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


def shown_ms(ms: int | None) -> str:
    """Epoch milliseconds as people read them in the commands' tables (to the second, UTC); ``-`` for none."""
    if not ms:
        return "-"
    return _dt.datetime.fromtimestamp(ms / 1000, _dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def format_stats(stats: dict[str, Any]) -> str:
    """``b2bgw db stats`` as text."""
    lines = [f"store: {stats['dialect']}"]
    rows = [("TABLE", "ROWS", "SIZE")]
    for t in stats["tables"]:
        rows.append(
            (
                t["table"],
                ("~" if t["estimated"] else "") + (f"{t['rows']:,}" if t["rows"] is not None else "-"),
                _size(t["bytes"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines += [
        "  " + "  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)) for r in rows
    ]
    f = stats.get("file")
    if f:
        lines.append(
            f"file: {f['file']}: {_size(f['file_bytes'])} (WAL {_size(f['wal_bytes'])}), "
            f"{f['pages']:,} pages of {f['page_size']} bytes, {f['free_pages']:,} free "
            f"({_size(f['free_bytes'])}); auto_vacuum {f['auto_vacuum']}"
        )
        if f["auto_vacuum"] != "incremental":
            lines.append(
                "  free pages are reused by new documents, but not given back to the file system: run "
                "`b2bgw db vacuum --full` once, with the gateway stopped, to switch to incremental vacuum"
            )
    docs = stats.get("documents")
    if docs is not None:
        lines.append("documents online: " + ", ".join(f"{n:,} {s}" for s, n in docs.items()))
        old = stats.get("oldest_online")
        if old:
            lines.append(
                f"oldest online document: {old['message_id']} ({old['status']}), received "
                f"{shown_ms(old['received_at'])}, last changed {shown_ms(old['updated_at'])}"
            )
    ret = stats.get("retention")
    if ret is None:
        lines.append("retention: none configured (ledger.retention): documents stay online for ever")
    else:
        lines.append(
            f"retention: {'enabled' if ret['enabled'] else 'DISABLED (ledger.retention.enabled: false)'}, "
            f"schedule {ret['schedule']}, next run {ret['next_run'] or '-'}"
        )
        due = ret.get("due_at_next_run")
        if due:
            lines.append(
                f"  due at the next run: {due['archive']:,} to archive and purge, {due['purge']:,} to purge; "
                f"{due['not_final']:,} as old but not in a final status (they stay online)"
            )
            for c in due["classes"]:
                lines.append(f"    {c['class']}: online {c['online_days']:g} days, then {c['after']}: {c['due']:,} due")
        last = ret.get("last_run")
        if last:
            lines.append(
                f"  last run {last['run_id']} {last['status']} {shown_ms(last['started_at'])}: "
                f"{last['archived']:,} archived, {last['purged']:,} purged, {last['waiting']:,} waiting for "
                f"the warehouse load" + (f"; {last['error'].splitlines()[0][:100]}" if last["error"] else "")
            )
    return "\n".join(lines)
