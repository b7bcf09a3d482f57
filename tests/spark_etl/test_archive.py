"""The archive job: what ``archive_document`` holds, reading a document back, and crash safety. A run
killed at any step (a file written, all written, before verification, after it, during the purge) loses
nothing and duplicates nothing: after the next run every due document is in the archive exactly once and
out of the ledger, and the archive and the ledger agree (:func:`spark_etl.archive.verify`)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from archivetest import (
    REPLY,
    archived_ids,
    fill,
    online_ids,
    open_store,
    order,
    policy,
    tombstoned_ids,
)

from ledger_contract.lifecycle import Pacer
from ledger_contract.space import sqlite_space
from ledger_contract.tables import archive_batches, documents, events
from spark_etl import archive

WORKER = Path(__file__).resolve().parent / "archive_crash_worker.py"


@pytest.fixture
def store(tmp_path):
    broker = open_store(f"sqlite:///{tmp_path / 'gw.db'}")
    yield broker
    broker.close()


def run(broker, root, **kw):
    kw.setdefault("now", int(time.time() * 1000))
    kw.setdefault("wait_for_warehouse", False)
    kw.setdefault("purge_write", archive.store_writer(broker, durable=False))
    return archive.run(
        kw.pop("pol", policy()), engine=broker.engine, write=archive.store_writer(broker), root=str(root), **kw
    )


def test_archive_document_holds_record_history_and_xml(store, tmp_path):
    ids = fill(store, 30, days_ago=100)
    fill(store, 5, days_ago=10, start=100)  # not due
    root = tmp_path / "wh"
    result = run(store, root)
    assert (result.archived, result.purged, result.batches) == (30, 30, 1)
    assert online_ids(store) == {f"ID:test-{k:06d}" for k in range(100, 105)}
    assert tombstoned_ids(store) == set(ids)
    files = sorted((root / "archive_document").rglob("*.parquet"))
    assert len(files) == 2 and all(f.parent.name.startswith("received_date=") for f in files)  # two dates
    table = pq.read_table(files[0])
    assert {
        "message_id",
        "partner",
        "doc_type",
        "doc_id",
        "digest",
        "history",
        "request_xml",
        "reply_xml",
        "request_sha256",
        "reply_sha256",
        "status",
        "received_at",
        "archived_at",
    } <= set(table.column_names)
    row = table.slice(0, 1).to_pylist()[0]
    k = int(row["message_id"].rsplit("-", 1)[1])
    assert row["request_xml"].encode() == order(k)
    assert row["reply_xml"].encode() == REPLY
    assert row["request_sha256"] == hashlib.sha256(order(k)).hexdigest()
    assert row["digest"] == "sha256:" + hashlib.sha256(order(k)).hexdigest()
    assert [h["status"] for h in row["history"]] == ["accepted", "replied"]
    assert row["doc_id"] == f"PO-{k}" and row["status"] == "replied"
    # the files' dates are the documents' received dates
    day = files[0].parent.name.split("=", 1)[1]
    assert row["received_at"].strftime("%Y-%m-%d") == day
    with store.engine.connect() as conn:
        assert (
            conn.execute(sa.select(sa.func.count()).select_from(events).where(events.c.message_id.in_(ids))).scalar()
            == 0
        )
    assert archive.verify(store.engine, str(root))["ok"]


def test_get_returns_what_the_ledger_held(store, tmp_path):
    ids = fill(store, 12, days_ago=100)
    root = tmp_path / "wh"
    run(store, root)
    found = archive.get(ids[5], root=str(root), engine=store.engine)
    assert found is not None
    assert found.request == order(5) and found.reply == REPLY
    assert found.record["partner"] == "acme" and found.record["idempotency_key"] == "key-5"
    assert [h["status"] for h in found.history] == ["accepted", "replied"]
    # without the store (or once the tombstone is gone) the archive is searched
    assert archive.get(ids[5], root=str(root)).request == order(5)
    assert archive.get("ID:not-archived", root=str(root), engine=store.engine) is None


def test_purge_only_rule_keeps_no_copy(store, tmp_path):
    from ledger_contract.retention import Rule

    fill(store, 10, days_ago=100)
    root = tmp_path / "wh"
    result = run(store, root, pol=policy(default=Rule(90 * 86400.0, "purge")))
    assert (result.archived, result.purged) == (0, 10)
    assert not (root / "archive_document").exists()
    assert len(tombstoned_ids(store)) == 10 and not online_ids(store)


def test_a_batch_that_does_not_read_back_is_not_purged(store, tmp_path):
    ids = fill(store, 20, days_ago=100)
    root = tmp_path / "wh"

    def tamper(batch_id: int) -> None:  # the disk gives back something else than was written
        for path in (root / "archive_document").rglob("part-*.parquet"):
            table = pq.read_table(path)
            xml = table.column("request_xml").to_pylist()
            xml[0] = xml[0].replace("PO-", "PX-", 1)
            import pyarrow as pa

            table = table.set_column(table.column_names.index("request_xml"), "request_xml", pa.array(xml, pa.string()))
            pq.write_table(table, path)

    archive.hooks["before_verify"] = tamper
    try:
        with pytest.raises(archive.ArchiveError, match="does not have the ledger's SHA-256"):
            run(store, root)
    finally:
        archive.hooks.clear()
    assert online_ids(store) == set(ids) and not tombstoned_ids(store)
    assert archived_ids(root) == []  # its files were removed
    with store.engine.connect() as conn:
        assert conn.execute(sa.select(archive_batches.c.status)).scalars().all() == ["abandoned"]
    result = run(store, root)  # nothing wrong any more: archived once
    assert result.purged == 20 and sorted(archived_ids(root)) == sorted(ids)


def test_a_row_changed_after_archiving_stays_online(store, tmp_path):
    ids = fill(store, 6, days_ago=100)
    root = tmp_path / "wh"

    def change(batch_id: int) -> None:
        with store.engine.begin() as conn:
            conn.execute(
                documents.update()
                .where(documents.c.message_id == ids[0])
                .values(status="failed", updated_at=int(time.time() * 1000))
            )

    archive.hooks["verified"] = change
    try:
        result = run(store, root)
    finally:
        archive.hooks.clear()
    assert result.purged == 5 and online_ids(store) == {ids[0]}


@pytest.mark.slow
@pytest.mark.parametrize("step", ["file_written", "written", "before_verify", "verified", "purging"])
def test_killed_at_any_step_loses_and_duplicates_nothing(tmp_path, step):
    url = f"sqlite:///{tmp_path / 'gw.db'}"
    root = tmp_path / "wh"
    broker = open_store(url)
    try:
        due = set(fill(broker, 100, days_ago=100))  # batches of 40: 40, 40, 20
        kept = set(fill(broker, 5, days_ago=1, start=500))
    finally:
        broker.close()
    proc = subprocess.run(
        [sys.executable, str(WORKER), url, str(root), step, "2"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    assert proc.returncode == -9, proc.stdout + proc.stderr  # killed in its second batch

    time.sleep(1.1)  # its lease (1 s) expires, as a crashed run's does
    broker = open_store(url)
    try:
        # the crash left the second batch unfinished; nothing unverified is purged
        with broker.engine.connect() as conn:
            statuses = dict(conn.execute(sa.select(archive_batches.c.batch_id, archive_batches.c.status)).all())
        # (a batch's purge runs while the next batch is written: the first may still be purging)
        assert statuses[1] in ("verified", "purged") and statuses[2] in ("writing", "written", "verified")
        tombstoned = tombstoned_ids(broker)
        assert tombstoned <= set(archived_ids(root))
        assert online_ids(broker) | tombstoned == due | kept and not online_ids(broker) & tombstoned

        result = run(broker, root, pacer=Pacer(first=7, most=7, least=7, rest=0, busy_rest=0))
        assert result.recovered == sum(1 for status in statuses.values() if status != "purged")
        assert online_ids(broker) == kept
        assert tombstoned_ids(broker) == due
        ids = archived_ids(root)
        assert sorted(ids) == sorted(due)  # each exactly once
        report = archive.verify(broker.engine, str(root))
        assert report["ok"], report
        assert not list(root.rglob("_tmp-*"))
        with broker.engine.connect() as conn:
            assert set(conn.execute(sa.select(archive_batches.c.status)).scalars()) <= {"purged", "abandoned"}
        # every archived document comes back as it was
        for mid in sorted(due)[::17]:
            k = int(mid.rsplit("-", 1)[1])
            assert archive.get(mid, root=str(root), engine=broker.engine).request == order(k)
    finally:
        broker.close()


def test_lease_held_elsewhere(store, tmp_path):
    from spark_etl import state

    engine = store.engine.execution_options(b2b_write=True)
    state.upgrade(engine)
    other = state.Lease(engine, name=archive.LEASE_NAME)
    assert other.acquire()
    try:
        with pytest.raises(archive.ArchiveBusyError):
            run(store, tmp_path / "wh")
    finally:
        other.release()


def test_sqlite_file_shrinks_after_purge_and_vacuum(tmp_path):
    url = f"sqlite:///{tmp_path / 'gw.db'}"
    broker = open_store(url)
    try:
        engine = broker.engine
        assert sqlite_space(engine)["auto_vacuum"] == "incremental"  # a new store
        fill(broker, 400, days_ago=100)
        fill(broker, 40, days_ago=1, start=1000)
        full = _checkpointed_size(engine)
        result = run(broker, tmp_path / "wh")
        assert result.purged == 400 and result.vacuumed_pages > 0
        after = _checkpointed_size(engine)
        assert sqlite_space(engine)["free_pages"] == 0
        import sqlite3

        fresh = tmp_path / "fresh.db"  # the same content written afresh: the least it can take
        with sqlite3.connect(engine.url.database) as conn:
            conn.execute("VACUUM INTO ?", (str(fresh),))
        assert after <= fresh.stat().st_size * 1.1 and after < full / 2, (full, after, fresh.stat().st_size)
    finally:
        broker.close()


def _checkpointed_size(engine) -> int:
    """The file's size once its write-ahead log is checkpointed: a checkpoint can be refused (busy) while
    the store's own connections read, so the size is read as the database's pages rather than the file's."""
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar()
        size = conn.exec_driver_sql("PRAGMA page_size").scalar()
        conn.rollback()
    return max(pages * size, os.path.getsize(engine.url.database))


def test_archive_on_postgresql(postgres_schema, tmp_path):
    broker = open_store(postgres_schema)
    try:
        ids = fill(broker, 25, days_ago=100)
        root = tmp_path / "wh"
        result = run(broker, root)
        assert result.purged == 25 and tombstoned_ids(broker) == set(ids) and not online_ids(broker)
        assert archive.verify(broker.engine, str(root))["ok"]
        assert archive.get(ids[3], root=str(root), engine=broker.engine).request == order(3)
        from gateway.ledger.stats import db_stats, format_stats

        stats = db_stats(broker.engine, policy())
        assert stats["documents"]["replied"] == 0 and stats["retention"]["last_run"]["purged"] == 25
        assert {t["table"] for t in stats["tables"]} >= {"b2b_ledger", "b2b_ledger_tombstones"}
        assert "retention: enabled" in format_stats(stats)
    finally:
        broker.close()


def test_scheduled_runs_take_the_lease_once_per_slot(store, tmp_path):
    """Every gateway process's scheduler fires; the first to take the lease for a slot runs the job, a
    late one for the same slot does nothing."""
    fill(store, 8, days_ago=100)
    url = str(store.engine.url)
    make = lambda: archive.ArchiveSchedule(
        policy(),
        url,
        engine=store.engine,
        write=archive.store_writer(store),
        root=str(tmp_path / "wh"),
        wait_for_warehouse=False,
    )
    first, second = make(), make()
    slot = int(time.time() * 1000)
    assert first.run_scheduled(slot) is True and first.last_result.purged == 8
    assert second.run_scheduled(slot) is False and second.last_result is None
    assert second.run_scheduled(slot + 1) is True and second.last_result.purged == 0  # the next night


def test_serve_schedules_the_archive_when_a_policy_is_configured(tmp_path):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
    from gwtest import SAMPLE_CONFIG, sample_data

    from gateway.config.loader import settings_from_mapping
    from gateway.exchange.assemble import assemble
    from gateway.runtime.serving import Runtime

    data = sample_data(tmp_path)
    settings = settings_from_mapping(data, config_path=SAMPLE_CONFIG, base_dir=tmp_path)
    assert settings.retention is not None
    runtime = Runtime(assemble(settings), workers=False, etl=True, reconcile=False)
    runtime.start()
    try:
        assert isinstance(runtime.archive, archive.ArchiveSchedule)
        job = runtime.archive.scheduler.get_job(archive.ArchiveSchedule.JOB_ID)
        assert job.next_run_time.hour == 3 and job.next_run_time.minute == 30
    finally:
        runtime.stop()
    assert runtime.archive is None
    runtime = Runtime(assemble(settings), workers=False, etl=False, reconcile=False)  # --no-etl: neither
    runtime.start()
    try:
        assert runtime.archive is None
    finally:
        runtime.stop()


def test_a_full_warehouse_rebuild_refuses_once_documents_were_purged(store, tmp_path):
    """A full rebuild reads the ledger alone: it would drop the purged documents' facts."""
    from spark_etl.config import resolve
    from spark_etl.job import EtlError
    from spark_etl.job import run as etl_run

    fill(store, 5, days_ago=100)
    run(store, tmp_path / "wh")
    settings = resolve({"warehouse": str(tmp_path / "wh"), "enabled": False})
    with pytest.raises(EtlError, match="purged 5 documents"):
        etl_run(settings, str(store.engine.url), full=True)


def test_the_purge_sees_the_intake_by_the_ledgers_newest_event(store, tmp_path):
    """What the purge's pacing watches (``lifecycle.activity_mark``) rises when documents come in, and stays
    when the purge removes old ones."""
    from ledger_contract.lifecycle import activity_mark

    assert activity_mark(store.engine) is None  # an empty ledger
    fill(store, 5, days_ago=100)
    fill(store, 1, days_ago=0, start=5)
    before = activity_mark(store.engine)
    assert before is not None
    assert run(store, tmp_path / "wh").purged == 5
    assert activity_mark(store.engine) == before
    fill(store, 1, days_ago=0, start=6)
    assert activity_mark(store.engine) > before
