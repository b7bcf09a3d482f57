"""The SQLite store's space: its file, pages and free pages, and giving free pages back to the file system
(``b2bgw db vacuum``, and the archive job after a purge). PostgreSQL's space is autovacuum's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from .lifecycle import Write

__all__ = ["full_vacuum", "sqlite_space", "vacuum", "vacuum_step"]


def sqlite_space(engine: sa.Engine) -> dict[str, Any]:
    """SQLite: the file, its WAL, page size, pages and free pages, auto_vacuum mode."""
    path = engine.url.database or ""
    with engine.connect() as conn:
        page_size, pages, free, mode = (
            conn.exec_driver_sql(f"PRAGMA {p}").scalar()
            for p in ("page_size", "page_count", "freelist_count", "auto_vacuum")
        )
        conn.rollback()
    wal = path + "-wal"
    return {
        "file": path,
        "file_bytes": os.path.getsize(path) if os.path.exists(path) else None,
        "wal_bytes": os.path.getsize(wal) if os.path.exists(wal) else 0,
        "page_size": page_size,
        "pages": pages,
        "free_pages": free,
        "free_bytes": free * page_size,
        "auto_vacuum": {0: "none", 1: "full", 2: "incremental"}.get(mode, str(mode)),
    }


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


def vacuum(
    engine: sa.Engine,
    write: Write,
    *,
    step_pages: int = 256,
    max_pages: int | None = None,
    rest: float = 1.0,
    stop: Callable[[], bool] = lambda: False,
) -> int:
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
        free = write(lambda conn, want=want: vacuum_step(conn, want))
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
