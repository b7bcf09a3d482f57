"""How much a consumer of the SQL store claims ahead of ``receive``.

A consumer's claims grow while they come back full, up to its ``prefetch`` (ActiveMQ's prefetch: messages
dispatched to a consumer ahead of the application), and only while the bodies a claim got stay small: a
consumer with a large prefetch on large messages must not hold that many of them in memory, nor keep them
from the other consumers of the queue.
"""

from __future__ import annotations

import pytest

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


@pytest.mark.parametrize(
    ("count", "size", "first_takes", "claimed"),
    [
        # small bodies: claims of 1, 2, 4, 8, 16 and 32 (63 messages) for the 40 the first consumer received
        (300, 16, 40, 63),
        # 4 KiB bodies against a 64 KiB budget: the claims stop growing at 16 (1, 2, 4, 8, 16, 16: 47)
        (300, 4096, 40, 47),
        # a body larger than the budget: one claim per message, nothing held ahead
        (20, 200 * 1024, 5, 5),
    ],
    ids=["small", "budget", "huge"],
)
def test_a_consumers_claims_grow_while_their_bodies_stay_within_the_budget(
    tmp_path, monkeypatch, count, size, first_takes, claimed
):
    monkeypatch.setattr(_reader, "CLAIM_BYTES", 64 * 1024)
    queue = Queue("claims")
    with Broker.open(f"sqlite:///{tmp_path / 'c.db'}", sweep_interval=0) as broker:
        _backlog(broker, queue, count, size)
        assert _left_over(broker, queue, first_takes, prefetch=1000) == count - claimed
