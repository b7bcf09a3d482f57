"""Operators' counters on a shared store: two brokers on one database (as two processes are) each see
what the other counted and the consumers it has open, counted once."""

from __future__ import annotations

import importlib.util
import time

import pytest

from broker_core import Broker, Queue

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("broker_core._sql") is None, reason="the SQL store is not installed"
)

ORDERS = Queue("orders")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def shared_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.db'}"
    return request.getfixturevalue("postgres_schema")


def test_every_process_sees_the_counters_and_consumers_of_the_others(shared_url):
    one = Broker.open(shared_url, heartbeat_interval=0.05, sweep_interval=0)
    two = Broker.open(shared_url, heartbeat_interval=0.05, sweep_interval=0)
    try:
        _counted_once(one, two)
    finally:
        two.close()
        one.close()


def _counted_once(one, two):
    conn = one.connect()
    conn.start()
    producer = conn.create_session().create_producer(ORDERS)
    for text in "abc":
        producer.send(conn.create_session().create_text_message(text))
    consumers = [conn.create_session().create_consumer(ORDERS) for _ in range(2)]
    assert consumers[0].receive(timeout=2) is not None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        seen = two.stats(ORDERS)
        if seen.consumers == 2 and seen.enqueued == 3 and seen.dequeued == 1:
            break
        time.sleep(0.05)
    assert (seen.consumers, seen.enqueued, seen.dequeued, seen.depth) == (2, 3, 1, 2)
    local = one.stats(ORDERS)
    assert (local.consumers, local.enqueued, local.dequeued) == (2, 3, 1)  # counted once, not once per process
    for consumer in consumers:
        consumer.close()
    deadline = time.monotonic() + 10
    while two.stats(ORDERS).consumers and time.monotonic() < deadline:
        time.sleep(0.05)
    assert two.stats(ORDERS).consumers == 0


def _counted(broker, box: str) -> tuple[int, int]:
    stats = broker.stats(box)
    return stats.depth, stats.in_flight


def _scanned(broker, box: str) -> tuple[int, int]:
    """What the entries table itself holds (the count the store keeps must always agree)."""
    import sqlalchemy as sa

    with broker.store.engine.connect() as conn:
        rows = dict(
            conn.execute(
                sa.text("SELECT state, count(*) FROM b2b_entries WHERE box = :b GROUP BY state"), {"b": box}
            ).all()
        )
    return rows.get(0, 0), rows.get(1, 0)


def test_the_kept_counts_agree_with_the_entries_through_everything_that_adds_or_removes_them(shared_url):
    import subprocess
    import sys

    from broker_core import AckMode

    box = "queue://orders"
    broker = Broker.open(shared_url, max_deliveries=2, heartbeat_interval=0.1, lease_timeout=1.0, sweep_interval=0)
    try:
        conn = broker.connect()
        conn.start()
        session = conn.create_session()
        producer = session.create_producer(ORDERS)
        for i in range(10):
            producer.send(session.create_text_message(f"m{i}"), time_to_live=50 if i == 9 else 0)
        assert _counted(broker, box) == _scanned(broker, box) == (10, 0)
        client = conn.create_session(ack_mode=AckMode.CLIENT)
        held = client.create_consumer(ORDERS, prefetch=1).receive(timeout=2)
        assert _counted(broker, box) == _scanned(broker, box) == (9, 1)
        held.acknowledge()
        tx = conn.create_session(transacted=True)
        failing = tx.create_consumer(ORDERS, prefetch=1)
        for _ in range(2):  # the second failure dead-letters it
            assert failing.receive(timeout=2) is not None
            tx.rollback()
        failing.close()
        assert _counted(broker, box) == _scanned(broker, box) == (8, 0)
        assert _counted(broker, "queue://DLQ.orders") == _scanned(broker, "queue://DLQ.orders") == (1, 0)
        time.sleep(0.1)
        assert broker.sweep_expired() == 1
        assert _counted(broker, box) == _scanned(broker, box) == (7, 0)
        assert len(broker.remove_messages(box, selector="1 = 1", limit=2)) == 2
        assert broker.move_messages(box, "queue://parked", selector="1 = 1", limit=1)
        assert _counted(broker, box) == _scanned(broker, box) == (4, 0)
        assert _counted(broker, "queue://parked") == (1, 0)
        # another process stores two and dies without saying goodbye: its counts are folded by the reaper
        code = (
            "import os\nfrom broker_core import Broker, Queue\n"
            f"b = Broker.open({shared_url!r}, heartbeat_interval=0.1, sweep_interval=0)\n"
            "c = b.connect(); s = c.create_session(); p = s.create_producer(Queue('orders'))\n"
            "p.send(s.create_text_message('x')); p.send(s.create_text_message('y'))\nos._exit(0)\n"
        )
        subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
        assert _counted(broker, box) == _scanned(broker, box) == (6, 0)
        deadline = time.monotonic() + 15
        import sqlalchemy as sa

        while time.monotonic() < deadline:
            with broker.store.engine.connect() as c:
                instances = c.execute(sa.text("SELECT count(DISTINCT instance) FROM b2b_box_depth")).scalar()
            if instances <= 2:  # the base rows and this broker's own
                break
            time.sleep(0.1)
        assert instances <= 2
        assert _counted(broker, box) == _scanned(broker, box) == (6, 0)
        assert broker.purge(box) == 6
        assert _counted(broker, box) == _scanned(broker, box) == (0, 0)
        temp = conn.create_temporary_queue()
        session.create_producer(temp).send(session.create_text_message("reply"))
        assert broker.stats(str(temp)).depth == 1
        conn.close()  # the temporary queue goes, and its counts with it
        with broker.store.engine.connect() as c:
            left = c.execute(sa.text("SELECT count(*) FROM b2b_box_depth WHERE box = :b"), {"b": str(temp)}).scalar()
        assert left == 0
    finally:
        broker.close()


def test_a_queue_nothing_was_sent_to_is_listed_with_the_consumers_another_process_has_on_it(shared_url):
    one = Broker.open(shared_url, heartbeat_interval=0.05, sweep_interval=0)
    two = Broker.open(shared_url, heartbeat_interval=0.05, sweep_interval=0)
    try:
        conn = one.connect()
        conn.start()
        conn.create_session().create_consumer(Queue("quiet"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            listed = {s.name: s for s in two.destinations()}
            if "queue://quiet" in listed:
                break
            time.sleep(0.05)
        assert listed["queue://quiet"].consumers == 1 and listed["queue://quiet"].depth == 0
    finally:
        two.close()
        one.close()
