"""Housekeeping: acknowledged messages do not pile up, expired ones are swept
periodically, and the store's size stays bounded in a long run."""

from __future__ import annotations

import importlib.util
import os
import sys
import time

import pytest

from broker_core import AckMode, Broker, DeliveryMode, Queue

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("broker_core._sql") is None, reason="the SQL store is not installed"
)

BODY = "x" * 2048


def db_size(path) -> int:
    return sum(os.path.getsize(p) for p in (str(path), f"{path}-wal") if os.path.exists(p))


def test_sqlite_file_stays_bounded_over_many_rounds(tmp_path):
    path = tmp_path / "long.db"
    sizes = []
    with Broker.open(f"sqlite:///{path}", sweep_interval=0) as broker, broker.connect() as conn:
        conn.start()
        session = conn.create_session(transacted=True)
        producer = session.create_producer(Queue("work"))
        consumer = session.create_consumer(Queue("work"))
        for _ in range(30):
            for _i in range(300):
                producer.send(session.create_text_message(BODY))
            session.commit()
            got = 0
            while consumer.receive(timeout=0.5) is not None:
                got += 1
            session.commit()
            assert got == 300
            sizes.append(db_size(path))
        assert broker.stats(Queue("work")).depth == 0
    # one round holds ~300 x 2 KB; the file must not grow with the number of rounds
    print(
        f"\nSQLite size after rounds 5, 15, 30: {sizes[4] // 1024} KB, {sizes[14] // 1024} KB, {sizes[-1] // 1024} KB"
    )
    assert sizes[-1] <= max(sizes[4] * 1.5, sizes[4] + 4 * 1024 * 1024)


def test_expired_messages_are_swept_periodically(broker_url):
    with Broker.open(broker_url, sweep_interval=0.2) as broker, broker.connect() as conn:
        session = conn.create_session()
        producer = session.create_producer(Queue("short"))
        for mode in (DeliveryMode.PERSISTENT, DeliveryMode.NON_PERSISTENT):
            for _ in range(20):
                producer.send(session.create_text_message("soon gone"), delivery_mode=mode, time_to_live=100)
        producer.send(session.create_text_message("stays"))
        deadline = time.monotonic() + 10
        while broker.stats(Queue("short")).depth > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        stats = broker.stats(Queue("short"))
        assert stats.depth == 1  # nobody consumed: the sweeper removed the 40 expired ones
        assert stats.expired == 40
        conn.start()
        consumer = conn.create_session(False, AckMode.AUTO).create_consumer(Queue("short"))
        assert consumer.receive(timeout=2).text == "stays"


def _backfilled(path) -> tuple[int, int]:
    """(frames in the WAL, frames copied back into the database), read from the WAL index without taking
    part: its header (the first 48 bytes, mxFrame at byte 16) and the checkpoint info (nBackfill at byte 96)."""
    data = (path.parent / f"{path.name}-shm").read_bytes()[:100]
    return int.from_bytes(data[16:20], sys.byteorder), int.from_bytes(data[96:100], sys.byteorder)


def test_sqlite_wal_is_checkpointed_after_commits_not_inside_them(tmp_path, monkeypatch):
    """Each process's writer copies the WAL back every CHECKPOINT_INTERVAL after its transaction, once the
    write turn is released; SQLite's automatic checkpoint (which would run inside a commit, the other
    processes' writers waiting on its copy and fsync) is only a last resort far above that."""
    from broker_core._sql import _store

    monkeypatch.setattr(_store, "CHECKPOINT_INTERVAL", 0.05)
    path = tmp_path / "ckpt.db"
    with Broker.open(f"sqlite:///{path}", sweep_interval=0) as broker, broker.connect() as conn:
        producer = conn.create_session().create_producer(Queue("work"))
        raw = broker.store._writer._conn.connection.dbapi_connection
        fallback = raw.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        page = raw.execute("PRAGMA page_size").fetchone()[0]
        assert fallback * page == 2 * _store.WAL_LIMIT_BYTES
        for _ in range(40):
            producer.send(conn.create_session().create_text_message("x" * 100_000))  # 4 MB in all
        time.sleep(0.1)
        producer.send(conn.create_session().create_text_message("after the interval"))
        deadline = time.monotonic() + 5  # the writer checkpoints once it has answered the sender
        while time.monotonic() < deadline and _backfilled(path)[1] < _backfilled(path)[0]:
            time.sleep(0.01)
        frames, copied = _backfilled(path)
        assert frames > 0 and copied == frames  # all copied back by the writer, with no commit after that one


def test_sqlite_wal_stays_bounded_with_two_writing_processes(tmp_path, monkeypatch):
    """Two brokers on one file (two writers, as two processes: each its own write turn), checkpointing
    outside the turn while the other appends: the WAL restarts as the run goes on (20 MB written, a limit
    of 1 MB) instead of growing with it. (Past WAL_LIMIT_BYTES a checkpoint also runs inside the turn,
    where no append can outrun it; in this run the passive ones kept up, at 2.4-2.9 MB.)"""
    from broker_core._sql import _store

    monkeypatch.setattr(_store, "CHECKPOINT_INTERVAL", 0.0)
    monkeypatch.setattr(_store, "WAL_LIMIT_BYTES", 1 << 20)
    path = tmp_path / "two.db"
    url = f"sqlite:///{path}"
    largest = 0
    with Broker.open(url, sweep_interval=0) as one, Broker.open(url, sweep_interval=0) as two:
        conns = [one.connect(), two.connect()]
        producers = [c.create_session().create_producer(Queue("work")) for c in conns]
        body = "y" * 20_000

        def send(producer, n):
            for _ in range(n):
                producer.send(conns[0].create_session().create_text_message(body))

        import threading

        threads = [threading.Thread(target=send, args=(p, 500)) for p in producers]  # 20 MB in all
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            largest = max(largest, os.path.getsize(f"{path}-wal"))
            time.sleep(0.01)
        for c in conns:
            c.close()
    assert largest < 8 << 20, f"the WAL grew to {largest >> 20} MB"
