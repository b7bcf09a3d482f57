"""How much a consumer of the SQL store claims ahead of ``receive``.

A consumer's claims grow while they come back full, up to its ``prefetch`` (ActiveMQ's prefetch: messages
dispatched to a consumer ahead of the application), and only while the bodies a claim got stay small: a
consumer with a large prefetch on large messages must not hold that many of them in memory, nor keep them
from the other consumers of the queue.
"""

from __future__ import annotations

from broker_core import Broker, Queue
from broker_core._sql import _reader


def _backlog(broker: Broker, queue: Queue, count: int, size: int) -> None:
    session = broker.connect().create_session(transacted=True)
    producer = session.create_producer(queue)
    for i in range(count):
        message = session.create_bytes_message()
        message.write_bytes(i.to_bytes(4, "big") + bytes(size - 4))
        producer.send(message)
    session.commit()


def _left_over(broker: Broker, queue: Queue, first_takes: int, prefetch: int) -> int:
    """A consumer with *prefetch* receives *first_takes* messages; how many a second one can take then
    (the rest the first one holds, claimed ahead)."""
    first = broker.connect()
    first.start()
    consumer = first.create_session().create_consumer(queue, prefetch=prefetch)
    for _ in range(first_takes):
        assert consumer.receive(timeout=5) is not None
    second = broker.connect()
    second.start()
    other = second.create_session().create_consumer(queue)
    got = 0
    while other.receive(timeout=0.5) is not None:
        got += 1
    first.close()
    second.close()
    return got


def test_claims_stop_growing_once_their_bodies_fill_the_claim_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(_reader, "CLAIM_BYTES", 64 * 1024)  # 16 bodies of 4 KiB
    queue = Queue("claims.large")
    with Broker.open(f"sqlite:///{tmp_path / 'c.db'}", sweep_interval=0) as broker:
        _backlog(broker, queue, 300, 4096)
        got = _left_over(broker, queue, 40, prefetch=1000)
    # the first consumer's claims went 1, 2, 4, 8, 16 and 16 (47 messages) for the 40 it received
    assert got == 300 - 47


def test_small_bodies_are_claimed_in_growing_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(_reader, "CLAIM_BYTES", 64 * 1024)
    queue = Queue("claims.small")
    with Broker.open(f"sqlite:///{tmp_path / 'c.db'}", sweep_interval=0) as broker:
        _backlog(broker, queue, 300, 16)
        got = _left_over(broker, queue, 40, prefetch=1000)
    # 1, 2, 4, 8, 16 and 32 (63 messages) claimed for the 40 the first consumer received
    assert got == 300 - 63


def test_a_body_larger_than_the_budget_is_claimed_one_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setattr(_reader, "CLAIM_BYTES", 64 * 1024)
    queue = Queue("claims.huge")
    with Broker.open(f"sqlite:///{tmp_path / 'c.db'}", sweep_interval=0) as broker:
        _backlog(broker, queue, 20, 200 * 1024)
        got = _left_over(broker, queue, 5, prefetch=1000)
    assert got == 20 - 5  # one claim per message: the first consumer holds none ahead
