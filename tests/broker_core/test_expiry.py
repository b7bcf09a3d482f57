"""Expiry: a message past its time to live is never delivered (receive,
listener, browser); it is counted, moved to the expiry queue when one is
configured, and swept by ``sweep_expired()``."""

from __future__ import annotations

import threading
import time

import pytest

from broker_core import InvalidArgumentError, Queue, Topic

TTL_MS = 150
PAST_TTL_S = 0.4


def test_expired_messages_are_not_received(broker, session, send, drain):
    queue = Queue("exp")
    send(queue, "dies", time_to_live=TTL_MS)
    send(queue, "lives")
    send(queue, "lives long", time_to_live=600_000)
    time.sleep(PAST_TTL_S)
    assert [m.text for m in drain(session.create_consumer(queue))] == ["lives", "lives long"]
    assert broker.stats(queue).expired == 1


def test_expired_high_priority_message_does_not_hide_others(broker, session, send, drain):
    queue = Queue("exp.prio")
    send(queue, "urgent but dead", time_to_live=TTL_MS, priority=9)
    send(queue, "normal")
    time.sleep(PAST_TTL_S)
    assert [m.text for m in drain(session.create_consumer(queue))] == ["normal"]


def test_expiration_header(session):
    queue = Queue("exp.header")
    producer = session.create_producer(queue)
    forever = session.create_text_message("forever")
    producer.send(forever)
    timed = session.create_text_message("timed")
    producer.send(timed, time_to_live=60_000)
    consumer = session.create_consumer(queue)
    assert forever.jms_expiration == 0
    assert consumer.receive(timeout=2).jms_expiration == 0
    assert timed.jms_expiration == timed.jms_timestamp + 60_000
    assert consumer.receive(timeout=2).jms_expiration == timed.jms_expiration


def test_negative_time_to_live_is_refused(session):
    with pytest.raises(InvalidArgumentError):
        session.create_producer(Queue("exp.neg")).send(session.create_text_message("x"), time_to_live=-1)


def test_expired_messages_are_not_given_to_listeners(broker, send):
    queue = Queue("exp.listener")
    conn = broker.connect()  # stopped until the messages have expired
    got = []
    done = threading.Event()

    def on_message(message):
        got.append(message.text)
        if message.text == "last":
            done.set()

    conn.create_session().create_consumer(queue).set_message_listener(on_message)
    send(queue, "dies 1", time_to_live=TTL_MS)
    send(queue, "lives")
    send(queue, "dies 2", time_to_live=TTL_MS)
    send(queue, "last")
    time.sleep(PAST_TTL_S)
    conn.start()
    assert done.wait(5)
    assert got == ["lives", "last"]


def test_expired_messages_are_not_browsed(session, send):
    queue = Queue("exp.browse")
    send(queue, "dies", time_to_live=TTL_MS)
    send(queue, "lives")
    time.sleep(PAST_TTL_S)
    assert [m.text for m in session.create_browser(queue)] == ["lives"]


def test_expired_messages_are_not_delivered_to_subscribers(session, send, drain):
    topic = Topic("exp.topic")
    subscriber = session.create_consumer(topic)
    send(topic, "dies", time_to_live=TTL_MS)
    send(topic, "lives")
    time.sleep(PAST_TTL_S)
    assert [m.text for m in drain(subscriber)] == ["lives"]


def test_sweep_expired_removes_and_counts(broker, send):
    queue = Queue("exp.sweep")
    send(queue, "a", "b", time_to_live=TTL_MS)
    send(queue, "c")
    assert broker.stats(queue).depth == 3
    time.sleep(PAST_TTL_S)
    assert broker.sweep_expired() == 2
    stats = broker.stats(queue)
    assert stats.depth == 1
    assert stats.expired == 2
    assert broker.sweep_expired() == 0


def test_sweep_removes_expired_messages_waiting_for_redelivery(make_broker):
    broker = make_broker(redelivery_delay=30)
    conn = broker.connect()
    conn.start()
    session = conn.create_session()
    session.create_producer(Queue("exp.delayed")).send(session.create_text_message("x"), time_to_live=300)
    tx = conn.create_session(transacted=True)
    assert tx.create_consumer(Queue("exp.delayed")).receive(timeout=2) is not None
    tx.rollback()  # waits 30 s before it is redelivered; it expires long before
    time.sleep(PAST_TTL_S)
    assert broker.sweep_expired() == 1
    stats = broker.stats(Queue("exp.delayed"))
    assert (stats.depth, stats.in_flight, stats.expired) == (0, 0, 1)


def test_expired_messages_move_to_the_expiry_queue(make_broker):
    broker = make_broker(expiry_queue="ExpiryQueue")
    conn = broker.connect()
    conn.start()
    session = conn.create_session()
    producer = session.create_producer(Queue("exp.moved"))
    dead = session.create_text_message("dies")
    dead.set_string_property("partner", "acme")
    producer.send(dead, time_to_live=TTL_MS)
    producer.send(session.create_text_message("lives"))
    time.sleep(PAST_TTL_S)
    assert session.create_consumer(Queue("exp.moved")).receive(timeout=2).text == "lives"
    moved = session.create_consumer(Queue("ExpiryQueue")).receive(timeout=2)
    assert moved is not None
    assert moved.text == "dies"
    assert moved.jms_message_id == dead.jms_message_id
    assert moved.get_string_property("partner") == "acme"
    assert moved.get_string_property("JMS_DLQ_OriginalDestination") == "queue://exp.moved"
    assert broker.stats(Queue("exp.moved")).expired == 1


def test_swept_messages_move_to_the_expiry_queue(make_broker):
    broker = make_broker(expiry_queue="ExpiryQueue")
    conn = broker.connect()
    conn.start()
    session = conn.create_session()
    session.create_producer(Queue("exp.swept")).send(session.create_text_message("dies"), time_to_live=TTL_MS)
    time.sleep(PAST_TTL_S)
    assert broker.sweep_expired() == 1
    moved = session.create_consumer(Queue("ExpiryQueue")).receive(timeout=2)
    assert moved is not None and moved.text == "dies"
    time.sleep(PAST_TTL_S)
    assert broker.sweep_expired() == 0, "a message in the expiry queue must not expire again"


def test_without_expiry_queue_expired_messages_are_dropped(broker, session, send):
    queue = Queue("exp.dropped")
    send(queue, "dies", time_to_live=TTL_MS)
    time.sleep(PAST_TTL_S)
    assert session.create_consumer(queue).receive(timeout=0.2) is None
    names = {s.name for s in broker.destinations()}
    assert not any("xpir" in name for name in names)


def test_background_sweeper(make_broker):
    broker = make_broker(sweep_interval=0.1)
    conn = broker.connect()
    session = conn.create_session()
    session.create_producer(Queue("exp.bg")).send(session.create_text_message("dies"), time_to_live=TTL_MS)
    deadline = time.monotonic() + 10
    while broker.stats(Queue("exp.bg")).expired == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = broker.stats(Queue("exp.bg"))
    assert stats.expired == 1
    assert stats.depth == 0


def test_a_message_expiring_in_flight_is_still_acknowledgeable(broker, conn, send):
    from broker_core import AckMode

    queue = Queue("exp.inflight")
    send(queue, "short", time_to_live=1000)
    session = conn.create_session(ack_mode=AckMode.CLIENT)
    message = session.create_consumer(queue).receive(timeout=2)
    assert message.text == "short"
    time.sleep(1.1)
    message.acknowledge()
    assert broker.stats(queue).dequeued == 1
    assert session.create_consumer(queue).receive(timeout=0.2) is None
