"""``Session.dead_letter(message, reason)``: an application sends a message it
can never process to the dead-letter queue at once, with its reason, instead
of letting redelivery repeat the failure ``max_deliveries`` times."""

from __future__ import annotations

import pytest

from broker_core import AckMode, DeliveryMode, IllegalStateError, InvalidArgumentError, Queue

ORDERS = Queue("orders.poison")
DLQ = Queue("DLQ.orders.poison")


def send(session, *texts, **options):
    producer = session.create_producer(ORDERS)
    sent = []
    for text in texts:
        message = session.create_text_message(text)
        message.set_string_property("customer", "C-77")
        producer.send(message, **options)
        sent.append(message)
    return sent


@pytest.mark.parametrize("mode", ["transacted", AckMode.CLIENT, AckMode.INDIVIDUAL])
def test_dead_letter_moves_the_message_at_once_with_its_reason(make_broker, drain, mode):
    broker = make_broker(max_deliveries=5)
    conn = broker.connect()
    conn.start()
    (sent,) = send(conn.create_session(), "order-1", priority=7)
    session = conn.create_session(transacted=True) if mode == "transacted" else conn.create_session(ack_mode=mode)
    consumer = session.create_consumer(ORDERS)
    received = consumer.receive(timeout=2)
    assert received.get_int_property("JMSXDeliveryCount") == 1
    session.dead_letter(received, "unknown customer C-77")
    assert consumer.receive(timeout=0.2) is None  # no redelivery
    assert broker.message_status([sent.jms_message_id]) == {sent.jms_message_id: "dead_lettered"}
    letters = drain(conn.create_session().create_consumer(DLQ))
    assert len(letters) == 1
    letter = letters[0]
    assert letter.jms_message_id == sent.jms_message_id
    assert letter.text == "order-1" and letter.jms_priority == 7
    assert letter.get_string_property("customer") == "C-77"
    assert letter.get_string_property("JMS_DLQ_Reason") == "unknown customer C-77"
    assert letter.get_string_property("JMS_DLQ_OriginalDestination") == "queue://orders.poison"
    stats = broker.stats(ORDERS)
    assert (stats.depth, stats.in_flight, stats.dead_lettered) == (0, 0, 1)


def test_a_later_rollback_does_not_bring_it_back_but_undoes_the_rest(broker, conn, drain):
    send(conn.create_session(), "poison", "fine")
    tx = conn.create_session(transacted=True)
    consumer = tx.create_consumer(ORDERS)
    poison, _fine = consumer.receive(timeout=2), consumer.receive(timeout=2)
    tx.create_producer(Queue("orders.out")).send(tx.create_text_message("never"))
    tx.dead_letter(poison, "poison")
    tx.rollback()
    again = drain(consumer)
    assert [m.text for m in again] == ["fine"]
    assert again[0].jms_redelivered is True
    tx.commit()
    assert [m.text for m in drain(conn.create_session().create_consumer(DLQ))] == ["poison"]
    assert drain(conn.create_session().create_consumer(Queue("orders.out"))) == []


def test_only_that_message_is_dead_lettered_and_the_others_still_wait(broker, conn, drain):
    send(conn.create_session(), "a", "b", "c")
    session = conn.create_session(ack_mode=AckMode.CLIENT)
    consumer = session.create_consumer(ORDERS)
    _a, b = consumer.receive(timeout=2), consumer.receive(timeout=2)
    session.dead_letter(b, "b is poison")
    session.recover()
    assert [m.text for m in drain(consumer)] == ["a", "c"]
    assert [m.text for m in drain(conn.create_session().create_consumer(DLQ))] == ["b"]


def test_non_persistent_messages_are_dead_lettered_too(broker, conn, drain):
    send(conn.create_session(), "volatile", delivery_mode=DeliveryMode.NON_PERSISTENT)
    session = conn.create_session(transacted=True)
    message = session.create_consumer(ORDERS).receive(timeout=2)
    session.dead_letter(message, "cannot parse")
    letters = drain(conn.create_session().create_consumer(DLQ))
    assert [m.get_string_property("JMS_DLQ_Reason") for m in letters] == ["cannot parse"]


def test_a_replayed_dead_letter_comes_back_without_the_dead_letter_properties(broker, conn, drain):
    send(conn.create_session(), "retry-me")
    session = conn.create_session(transacted=True)
    session.dead_letter(session.create_consumer(ORDERS).receive(timeout=2), "customer unknown yet")
    assert broker.replay_dead_letters(DLQ) == 1
    (back,) = drain(conn.create_session().create_consumer(ORDERS))
    assert back.text == "retry-me"
    assert not back.property_exists("JMS_DLQ_Reason")


def test_a_message_the_session_does_not_hold_is_refused(conn):
    send(conn.create_session(), "a", "b")
    auto = conn.create_session(ack_mode=AckMode.AUTO)
    received = auto.create_consumer(ORDERS).receive(timeout=2)
    with pytest.raises(IllegalStateError):
        auto.dead_letter(received, "too late: acknowledged on receipt")
    tx = conn.create_session(transacted=True)
    other = tx.create_consumer(ORDERS).receive(timeout=2)
    tx.commit()
    with pytest.raises(IllegalStateError):
        tx.dead_letter(other, "committed already")
    with pytest.raises(IllegalStateError):
        tx.dead_letter(tx.create_text_message("never sent"), "not received")
    with pytest.raises(InvalidArgumentError):
        tx.dead_letter(other, None)


def test_the_reason_of_the_last_rollback_is_recorded_in_the_dead_letter(make_broker, drain):
    broker = make_broker(max_deliveries=1)
    conn = broker.connect()
    conn.start()
    send(conn.create_session(), "unreadable")
    tx = conn.create_session(transacted=True)
    tx.create_consumer(ORDERS).receive(timeout=2)
    tx.rollback("the parser raised ValueError: bad date")
    (letter,) = drain(conn.create_session().create_consumer(DLQ))
    reason = letter.get_string_property("JMS_DLQ_Reason")
    assert reason.startswith("delivered 1 times without acknowledgement")
    assert reason.endswith("the transaction was rolled back: the parser raised ValueError: bad date")
