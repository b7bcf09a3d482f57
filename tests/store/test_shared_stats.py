"""Operators' counters on a shared store: two brokers on one database (as two processes are) each see
what the other counted and the consumers it has open, counted once."""

from __future__ import annotations

import importlib.util
import time

import pytest

from broker_core import Broker, Queue

pytestmark = pytest.mark.skipif(importlib.util.find_spec("broker_core._sql") is None,
                                reason="the SQL store is not installed")

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
