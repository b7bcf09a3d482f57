"""Housekeeping: acknowledged messages do not pile up, expired ones are swept
periodically, and the store's size stays bounded in a long run."""

from __future__ import annotations

import importlib.util
import os
import time

import pytest

from broker_core import AckMode, Broker, DeliveryMode, Queue

pytestmark = pytest.mark.skipif(importlib.util.find_spec("broker_core._sql") is None,
                                reason="the SQL store is not installed")

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
            for i in range(300):
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
    print(f"\nSQLite size after rounds 5, 15, 30: {sizes[4] // 1024} KB, {sizes[14] // 1024} KB, {sizes[-1] // 1024} KB")
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
