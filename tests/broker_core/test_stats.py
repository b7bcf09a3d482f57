"""Destination statistics: broker.destinations() and broker.stats()."""

from __future__ import annotations

import dataclasses
import time

from broker_core import AckMode, DestinationStats, Queue, Topic

A = Queue("a")


def test_stats_follow_a_queue_through_its_life(broker, conn, send):
    send(A, *"12345")
    stats = broker.stats(A)
    assert isinstance(stats, DestinationStats)
    assert stats.name == "queue://a"
    assert (stats.depth, stats.in_flight, stats.enqueued, stats.dequeued) == (5, 0, 5, 0)
    assert (stats.expired, stats.dead_lettered, stats.consumers) == (0, 0, 0)

    # A store may prefetch for a consumer (ActiveMQ-style): prefetched messages
    # count as in flight, so while a consumer is open only bounds are exact.
    session = conn.create_session(ack_mode=AckMode.CLIENT)
    consumer = session.create_consumer(A)
    assert broker.stats(A).consumers == 1
    received = [consumer.receive(timeout=2) for _ in range(2)]
    stats = broker.stats(A)
    assert stats.in_flight >= 2 and stats.depth <= 3
    assert (stats.depth + stats.in_flight, stats.dequeued) == (5, 0)

    received[-1].acknowledge()
    stats = broker.stats(A)
    assert (stats.depth + stats.in_flight, stats.dequeued) == (3, 2)

    consumer.receive(timeout=2)
    session.recover()
    stats = broker.stats(A)
    assert (stats.depth + stats.in_flight, stats.dequeued, stats.enqueued) == (3, 2, 5)

    consumer.close()
    session.close()
    stats = broker.stats(A)
    assert (stats.depth, stats.in_flight, stats.dequeued, stats.enqueued, stats.consumers) == (3, 0, 2, 5, 0)


def test_consumer_count(broker, conn):
    consumers = [conn.create_session().create_consumer(A) for _ in range(3)]
    assert broker.stats(A).consumers == 3
    consumers[0].close()
    assert broker.stats(A).consumers == 2
    conn.close()
    assert broker.stats(A).consumers == 0


def test_destinations_lists_every_queue_sorted(broker, send):
    send(Queue("b"), "x")
    send(A, "x", "y")
    send(Queue("c.d"), "z")
    stats = broker.destinations()
    names = [s.name for s in stats]
    assert names == sorted(names)
    assert {"queue://a", "queue://b", "queue://c.d"} <= set(names)
    by_name = {s.name: s for s in stats}
    assert by_name["queue://a"].depth == 2
    assert by_name["queue://b"].depth == 1
    assert broker.stats(A) == by_name["queue://a"]
    assert broker.stats("queue://a") == by_name["queue://a"]


def test_stats_of_an_unknown_queue_are_zero(broker):
    stats = broker.stats(Queue("never"))
    assert stats.name == "queue://never"
    assert all(getattr(stats, f.name) in (0, None) for f in dataclasses.fields(stats) if f.name != "name")


def test_expired_and_dead_lettered_are_counted(make_broker):
    broker = make_broker(max_deliveries=1)
    conn = broker.connect()
    conn.start()
    session = conn.create_session()
    producer = session.create_producer(A)
    producer.send(session.create_text_message("dies"), time_to_live=100)
    producer.send(session.create_text_message("fails"))
    time.sleep(0.3)
    tx = conn.create_session(transacted=True)
    assert tx.create_consumer(A).receive(timeout=2).text == "fails"
    tx.rollback()
    stats = broker.stats(A)
    assert stats.expired == 1
    assert stats.dead_lettered == 1
    assert stats.depth == 0 and stats.in_flight == 0
    assert broker.stats(Queue("DLQ.a")).depth == 1
    assert broker.stats(Queue("DLQ.a")).enqueued == 1


def test_topic_subscriptions_have_their_own_stats(broker, conn, send):
    topic = Topic("t")
    subscriber = conn.create_session(ack_mode=AckMode.CLIENT).create_consumer(topic)
    send(topic, "1", "2")
    subscriptions = [s for s in broker.destinations() if s.topic == "topic://t"]
    assert len(subscriptions) == 1
    assert subscriptions[0].depth == 2
    assert subscriptions[0].consumers == 1
    subscriber.receive(timeout=2)
    (sub,) = [s for s in broker.destinations() if s.topic == "topic://t"]
    assert (sub.depth + sub.in_flight, sub.enqueued, sub.dequeued) == (2, 2, 0)
    assert sub.in_flight >= 1
    subscriber.close()
    assert [s for s in broker.destinations() if s.topic == "topic://t" and s.consumers] == []
