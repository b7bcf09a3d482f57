"""ledger_contract.space: an old SQLite file switched to incremental vacuum. Giving pages back after a purge
is tested with the archive job (tests/spark_etl/test_archive.py)."""

from __future__ import annotations

import os
import sqlite3

from ledger_contract.space import full_vacuum


def test_full_vacuum_switches_an_old_file_to_incremental(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x BLOB)")
    conn.executemany("INSERT INTO t VALUES (?)", [(os.urandom(3000),) for _ in range(500)])
    conn.commit()
    conn.execute("DELETE FROM t")
    conn.commit()
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    conn.close()
    before = path.stat().st_size
    done = full_vacuum(f"sqlite:///{path}")
    assert done["auto_vacuum"] == 2 and done["after"] < before / 10
