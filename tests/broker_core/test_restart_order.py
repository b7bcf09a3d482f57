"""Where delivery restarts after ``Session.recover()`` and ``Session.rollback()``.

JMS 2.0 section 6.2.12 (recover) and 6.2.11 (rollback): the session's
stream of messages restarts with its oldest unacknowledged message. Messages
a consumer claimed ahead (prefetch) but never handed to the application are
part of that stream: they come after the unacknowledged ones, in the order
they were sent within each priority, and are not marked redelivered.
"""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_core import AckMode, Queue

#: None: the store's own prefetch (the SQL store claims up to 64 ahead); 1: one at a time.
PREFETCH = [pytest.param(None, id="prefetch-store"), pytest.param(1, id="prefetch-1")]


def fresh_queue() -> Queue:
    return Queue(f"restart.{uuid.uuid4().hex[:12]}")


def send(session, queue, *items):
    """Send ``(text, priority)`` pairs (or plain texts at priority 4)."""
    producer = session.create_producer(queue)
    for item in items:
        text, priority = item if isinstance(item, tuple) else (item, 4)
        producer.send(session.create_text_message(text), priority=priority)
    producer.close()


def receive(consumer, n):
    out = []
    for _ in range(n):
        message = consumer.receive(timeout=2)
        assert message is not None, f"expected a message after {[m.text for m in out]}"
        out.append(message)
    return out


@pytest.mark.parametrize("prefetch", PREFETCH)
def test_recover_restarts_with_the_oldest_unacknowledged_message(conn, prefetch):
    queue = fresh_queue()
    send(conn.create_session(), queue, "0", "1", "2")
    session = conn.create_session(ack_mode=AckMode.CLIENT)
    consumer = session.create_consumer(queue, prefetch=prefetch)
    assert [m.text for m in receive(consumer, 2)] == ["0", "1"]
    session.recover()
    again = receive(consumer, 3)
    assert [m.text for m in again] == ["0", "1", "2"]
    assert [m.jms_redelivered for m in again] == [True, True, False]
    assert [m.get_int_property("JMSXDeliveryCount") for m in again] == [2, 2, 1]


@pytest.mark.parametrize("prefetch", PREFETCH)
def test_rollback_restarts_with_the_oldest_unacknowledged_message(conn, prefetch):
    queue = fresh_queue()
    send(conn.create_session(), queue, "0", "1", "2", "3")
    session = conn.create_session(transacted=True)
    consumer = session.create_consumer(queue, prefetch=prefetch)
    assert [m.text for m in receive(consumer, 1)] == ["0"]
    session.commit()
    assert [m.text for m in receive(consumer, 2)] == ["1", "2"]
    session.rollback()
    again = receive(consumer, 3)
    assert [m.text for m in again] == ["1", "2", "3"]
    assert [m.jms_redelivered for m in again] == [True, True, False]


@pytest.mark.parametrize("prefetch", PREFETCH)
def test_restart_keeps_priority_order_then_send_order(conn, prefetch):
    queue = fresh_queue()
    send(conn.create_session(), queue, ("low-a", 2), ("high-a", 8), ("low-b", 2), ("mid", 5), ("high-b", 8))
    session = conn.create_session(ack_mode=AckMode.CLIENT)
    consumer = session.create_consumer(queue, prefetch=prefetch)
    assert [m.text for m in receive(consumer, 2)] == ["high-a", "high-b"]
    session.recover()
    assert [m.text for m in receive(consumer, 5)] == ["high-a", "high-b", "mid", "low-a", "low-b"]


@pytest.mark.parametrize("prefetch", PREFETCH)
def test_what_another_consumer_could_take_is_not_held_back_by_a_recovered_session(broker, conn, prefetch):
    """After recover, what the session held prefetched is back in the queue: a
    competing consumer of another session can take it."""
    queue = fresh_queue()
    send(conn.create_session(), queue, "0", "1", "2")
    session = conn.create_session(ack_mode=AckMode.CLIENT)
    consumer = session.create_consumer(queue, prefetch=prefetch)
    assert consumer.receive(timeout=2).text == "0"
    session.recover()
    consumer.close()
    other = conn.create_session(ack_mode=AckMode.CLIENT)
    got = receive(other.create_consumer(queue), 3)
    assert [m.text for m in got] == ["0", "1", "2"]
    assert [m.jms_redelivered for m in got] == [True, False, False]


# ---------------------------------------------------------------------------------- any sequence

OPS = st.lists(
    st.sampled_from([("send",), ("receive",), ("settle",), ("restart",)]),  # settle: acknowledge / commit
    min_size=1,
    max_size=30,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    first=st.lists(st.integers(0, 9), max_size=8),
    ops=OPS,
    transacted=st.booleans(),
    prefetch=st.sampled_from([None, 1, 3]),
)
def test_any_sequence_of_sends_receives_and_restarts_follows_the_model(make_broker, first, ops, transacted, prefetch):
    """A model of one queue and one consumer: a receive returns the waiting
    message of highest priority, oldest first; a restart (recover or
    rollback) makes every unacknowledged message wait again as it was sent;
    a settle (acknowledge or commit) removes them.

    ``first`` are sent before anything else, at the priorities given; the
    sends among ``ops`` go at priority 0. (A message of a higher priority sent
    while the consumer holds prefetched ones of a lower priority may come
    after them: JMS makes priority order a best effort, not a rule.)"""
    broker = make_broker(max_deliveries=1000)
    conn = broker.connect()
    conn.start()
    try:
        queue = fresh_queue()
        producer_session = conn.create_session()
        producer = producer_session.create_producer(queue)
        if transacted:
            session = conn.create_session(transacted=True)
        else:
            session = conn.create_session(ack_mode=AckMode.CLIENT)

        waiting: list[tuple[int, int, str]] = []  # (-priority, n, text)
        unacked: list[tuple[int, int, str]] = []
        deliveries: dict[str, int] = {}

        def send(priority: int) -> None:
            n = len(deliveries)
            text = f"m{n}"
            producer.send(producer_session.create_text_message(text), priority=priority)
            waiting.append((-priority, n, text))
            deliveries[text] = 0

        for priority in first:
            send(priority)
        consumer = session.create_consumer(queue, prefetch=prefetch)
        for op in ops:
            if op[0] == "send":
                send(0)
            elif op[0] == "receive":
                message = consumer.receive(timeout=2) if waiting else consumer.receive_no_wait()
                if not waiting:
                    assert message is None, f"nothing waits, yet {message.text} came"
                    continue
                expected = min(waiting)
                waiting.remove(expected)
                unacked.append(expected)
                assert message is not None, f"expected {expected[2]}, got nothing"
                assert message.text == expected[2]
                deliveries[message.text] += 1
                assert message.get_int_property("JMSXDeliveryCount") == deliveries[message.text]
                assert message.jms_redelivered is (deliveries[message.text] > 1)
            elif op[0] == "settle":
                session.commit() if transacted else session.acknowledge()
                unacked.clear()
            else:
                session.rollback() if transacted else session.recover()
                waiting.extend(unacked)
                unacked.clear()
    finally:
        conn.close()
