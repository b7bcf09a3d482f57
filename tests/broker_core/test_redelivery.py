"""Redelivery limits, dead-letter queues, replay, and redelivery delays."""

from __future__ import annotations

import time

import pytest

from broker_core import AckMode, InvalidArgumentError, Queue, Topic

ORDERS = Queue("orders")
DLQ = Queue("DLQ.orders")


def started(broker):
    conn = broker.connect()
    conn.start()
    return conn


def send_order(session, text="order-1", **props):
    message = session.create_text_message(text)
    message.jms_correlation_id = "PO-1001"
    for name, value in props.items():
        message.set_string_property(name, value)
    session.create_producer(ORDERS).send(message, priority=6)
    return message


def fail_with_rollback(session, consumer, times):
    counts = []
    for _ in range(times):
        message = consumer.receive(timeout=2)
        assert message is not None
        counts.append((message.get_int_property("JMSXDeliveryCount"), message.jms_redelivered))
        session.rollback()
    return counts


def test_dead_lettered_after_max_deliveries(make_broker, drain):
    broker = make_broker(max_deliveries=3)
    conn = started(broker)
    sent = send_order(conn.create_session(), partner="acme")
    tx = conn.create_session(transacted=True)
    consumer = tx.create_consumer(ORDERS)
    assert fail_with_rollback(tx, consumer, 3) == [(1, False), (2, True), (3, True)]
    assert consumer.receive(timeout=0.2) is None
    dead = drain(conn.create_session().create_consumer(DLQ))
    assert len(dead) == 1
    letter = dead[0]
    assert letter.text == "order-1"
    assert letter.jms_message_id == sent.jms_message_id
    assert letter.jms_correlation_id == "PO-1001"
    assert letter.jms_priority == 6
    assert letter.get_string_property("partner") == "acme"
    assert letter.get_string_property("JMS_DLQ_OriginalDestination") == "queue://orders"
    reason = letter.get_string_property("JMS_DLQ_Reason")
    assert isinstance(reason, str) and reason
    assert broker.stats(ORDERS).dead_lettered == 1
    assert broker.stats(ORDERS).depth == 0


def test_recover_counts_as_a_failed_delivery(make_broker, drain):
    broker = make_broker(max_deliveries=2)
    conn = started(broker)
    send_order(conn.create_session())
    session = conn.create_session(ack_mode=AckMode.CLIENT)
    consumer = session.create_consumer(ORDERS)
    for _ in range(2):
        assert consumer.receive(timeout=2) is not None
        session.recover()
    assert consumer.receive(timeout=0.2) is None
    assert [m.text for m in drain(conn.create_session().create_consumer(DLQ))] == ["order-1"]


def test_session_close_counts_as_a_failed_delivery(make_broker, drain):
    broker = make_broker(max_deliveries=2)
    conn = started(broker)
    send_order(conn.create_session())
    for _ in range(2):
        session = conn.create_session(ack_mode=AckMode.CLIENT)
        assert session.create_consumer(ORDERS).receive(timeout=2) is not None
        session.close()
    assert drain(conn.create_session().create_consumer(ORDERS)) == []
    assert len(drain(conn.create_session().create_consumer(DLQ))) == 1


def test_max_deliveries_one_dead_letters_at_the_first_failure(make_broker, drain):
    broker = make_broker(max_deliveries=1)
    conn = started(broker)
    send_order(conn.create_session())
    tx = conn.create_session(transacted=True)
    assert fail_with_rollback(tx, tx.create_consumer(ORDERS), 1) == [(1, False)]
    assert len(drain(conn.create_session().create_consumer(DLQ))) == 1


def test_acknowledged_on_the_last_allowed_delivery_is_not_dead_lettered(make_broker, drain):
    broker = make_broker(max_deliveries=3)
    conn = started(broker)
    send_order(conn.create_session())
    tx = conn.create_session(transacted=True)
    consumer = tx.create_consumer(ORDERS)
    fail_with_rollback(tx, consumer, 2)
    last = consumer.receive(timeout=2)
    assert last.get_int_property("JMSXDeliveryCount") == 3
    tx.commit()
    assert drain(conn.create_session().create_consumer(DLQ)) == []
    assert broker.stats(ORDERS).dead_lettered == 0
    assert broker.stats(ORDERS).dequeued == 1


def test_only_the_failing_message_is_dead_lettered(make_broker, drain):
    broker = make_broker(max_deliveries=2)
    conn = started(broker)
    producer_session = conn.create_session()
    send_order(producer_session, "poison")
    send_order(producer_session, "good")
    session = conn.create_session(ack_mode=AckMode.INDIVIDUAL)
    consumer = session.create_consumer(ORDERS)
    handled = []
    for _ in range(10):
        message = consumer.receive(timeout=0.5)
        if message is None:
            break
        if message.text == "poison":
            session.recover()
        else:
            message.acknowledge()
            handled.append(message.text)
    assert handled == ["good"]
    assert [m.text for m in drain(conn.create_session().create_consumer(DLQ))] == ["poison"]


def test_custom_dead_letter_prefix(make_broker, drain):
    broker = make_broker(max_deliveries=1, dead_letter_prefix="DEAD.")
    conn = started(broker)
    send_order(conn.create_session())
    tx = conn.create_session(transacted=True)
    fail_with_rollback(tx, tx.create_consumer(ORDERS), 1)
    assert len(drain(conn.create_session().create_consumer(Queue("DEAD.orders")))) == 1
    assert drain(conn.create_session().create_consumer(DLQ)) == []


def test_dead_letters_of_a_durable_subscription(make_broker, drain):
    broker = make_broker(max_deliveries=2)
    topic = Topic("events")
    conn = broker.connect(client_id="sub-client")
    conn.start()
    tx = conn.create_session(transacted=True)
    subscriber = tx.create_durable_subscriber(topic, "audit")
    publisher = conn.create_session()
    publisher.create_producer(topic).send(publisher.create_text_message("event"))
    for _ in range(2):
        assert subscriber.receive(timeout=2) is not None
        tx.rollback()
    dead = drain(conn.create_session().create_consumer(Queue("DLQ.events")))
    assert [m.text for m in dead] == ["event"]
    assert dead[0].get_string_property("JMS_DLQ_OriginalDestination") == "topic://events"


def test_dead_letters_can_be_browsed(make_broker):
    broker = make_broker(max_deliveries=1)
    conn = started(broker)
    for text in ("one", "two"):
        send_order(conn.create_session(), text)
    tx = conn.create_session(transacted=True)
    fail_with_rollback(tx, tx.create_consumer(ORDERS), 2)
    browsed = [m.text for m in conn.create_session().create_browser(DLQ)]
    assert browsed == ["one", "two"]
    assert [m.text for m in broker.browse(DLQ)] == ["one", "two"]
    assert [m.text for m in conn.create_session().create_browser(DLQ)] == ["one", "two"], "browsing consumed"


def test_replay_moves_dead_letters_back_to_their_destination(make_broker, drain):
    broker = make_broker(max_deliveries=2)
    conn = started(broker)
    for text in ("one", "two"):
        send_order(conn.create_session(), text, partner="acme")
    tx = conn.create_session(transacted=True)
    consumer = tx.create_consumer(ORDERS)
    fail_with_rollback(tx, consumer, 4)
    assert broker.stats(DLQ).depth == 2

    assert broker.replay_dead_letters(Queue("DLQ.orders")) == 2
    assert broker.stats(DLQ).depth == 0
    assert drain(conn.create_session().create_consumer(DLQ)) == []
    replayed = drain(conn.create_session().create_consumer(ORDERS))
    assert [m.text for m in replayed] == ["one", "two"]
    assert all(m.get_string_property("partner") == "acme" for m in replayed)
    assert all(m.get_int_property("JMSXDeliveryCount") == 1 for m in replayed)
    assert not any(m.jms_redelivered for m in replayed)
    assert all(m.jms_destination == ORDERS for m in replayed)


def test_replayed_messages_get_a_fresh_delivery_budget(make_broker, drain):
    broker = make_broker(max_deliveries=2)
    conn = started(broker)
    send_order(conn.create_session())
    tx = conn.create_session(transacted=True)
    consumer = tx.create_consumer(ORDERS)
    fail_with_rollback(tx, consumer, 2)
    assert broker.replay_dead_letters(DLQ) == 1
    assert fail_with_rollback(tx, consumer, 2) == [(1, False), (2, True)]
    assert len(drain(conn.create_session().create_consumer(DLQ))) == 1


def test_replay_of_an_empty_dead_letter_queue(broker):
    assert broker.replay_dead_letters(Queue("DLQ.nothing")) == 0


def test_replay_limit(make_broker, drain):
    broker = make_broker(max_deliveries=1)
    conn = started(broker)
    for text in ("one", "two", "three"):
        send_order(conn.create_session(), text)
    tx = conn.create_session(transacted=True)
    fail_with_rollback(tx, tx.create_consumer(ORDERS), 3)
    assert broker.replay_dead_letters(DLQ, limit=2) == 2
    assert [m.text for m in drain(conn.create_session().create_consumer(ORDERS))] == ["one", "two"]
    assert [m.text for m in drain(conn.create_session().create_consumer(DLQ))] == ["three"]


def test_redelivery_delay(make_broker):
    broker = make_broker(redelivery_delay=0.5)
    conn = started(broker)
    send_order(conn.create_session())
    tx = conn.create_session(transacted=True)
    consumer = tx.create_consumer(ORDERS)
    assert consumer.receive(timeout=2) is not None
    tx.rollback()
    rolled_back = time.monotonic()
    assert consumer.receive_no_wait() is None
    assert broker.stats(ORDERS).depth == 1, "a delayed redelivery still counts as waiting"
    again = consumer.receive(timeout=5)
    waited = time.monotonic() - rolled_back
    assert again is not None and again.jms_redelivered
    assert waited >= 0.4


def test_redelivery_delay_does_not_hold_back_other_messages(make_broker):
    broker = make_broker(redelivery_delay=2.0)
    conn = started(broker)
    send_order(conn.create_session(), "failing")
    tx = conn.create_session(transacted=True)
    consumer = tx.create_consumer(ORDERS)
    assert consumer.receive(timeout=2).text == "failing"
    tx.rollback()
    send_order(conn.create_session(), "fresh")
    got = consumer.receive(timeout=2)
    assert got is not None and got.text == "fresh"
    assert consumer.receive_no_wait() is None, "the delayed message came back early"


def test_redelivery_delay_backs_off(make_broker):
    broker = make_broker(redelivery_delay=0.2, redelivery_backoff=3.0)
    conn = started(broker)
    send_order(conn.create_session())
    tx = conn.create_session(transacted=True)
    consumer = tx.create_consumer(ORDERS)
    assert consumer.receive(timeout=2) is not None
    waits = []
    for _ in range(2):
        tx.rollback()
        start = time.monotonic()
        assert consumer.receive(timeout=5) is not None
        waits.append(time.monotonic() - start)
    assert waits[0] >= 0.15
    assert waits[1] >= 0.5  # 0.2 s * 3


def test_delayed_redelivery_wakes_a_listener(make_broker):
    import threading

    broker = make_broker(redelivery_delay=0.3)
    conn = started(broker)
    send_order(conn.create_session())
    session = conn.create_session(ack_mode=AckMode.AUTO)
    calls = []
    done = threading.Event()

    def on_message(message):
        calls.append((time.monotonic(), message.jms_redelivered))
        if len(calls) == 1:
            raise RuntimeError("first attempt fails")
        done.set()

    session.create_consumer(ORDERS).set_message_listener(on_message)
    assert done.wait(10)
    assert [flag for _, flag in calls] == [False, True]
    assert calls[1][0] - calls[0][0] >= 0.25


@pytest.mark.parametrize(
    "options",
    [{"max_deliveries": 0}, {"redelivery_delay": -1}, {"redelivery_backoff": 0.5}, {"dead_letter_prefix": ""}],
)
def test_invalid_redelivery_options_are_refused(make_broker, options):
    with pytest.raises(InvalidArgumentError):
        make_broker(**options)
