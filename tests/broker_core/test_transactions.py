"""Transacted sessions: sends and receives are staged; commit makes them
happen atomically, rollback discards the sends and redelivers the receives."""

from __future__ import annotations

import pytest

from broker_core import AckMode, IllegalStateError, Queue, Topic

IN = Queue("tx.in")
OUT = Queue("tx.out")


@pytest.fixture
def tx(conn):
    return conn.create_session(transacted=True)


@pytest.fixture
def observer(broker):
    """A consumer session on another connection, for what others can see."""
    conn = broker.connect()
    conn.start()
    return conn.create_session()


def test_transacted_session_reports_transacted_mode(conn):
    for mode in (AckMode.AUTO, AckMode.CLIENT, AckMode.INDIVIDUAL):
        session = conn.create_session(transacted=True, ack_mode=mode)
        assert session.transacted is True
        assert session.ack_mode == AckMode.TRANSACTED


def test_sends_are_seen_only_after_commit(broker, tx, observer, drain):
    producer = tx.create_producer(OUT)
    producer.send(tx.create_text_message("1"))
    producer.send(tx.create_text_message("2"))
    watcher = observer.create_consumer(OUT)
    assert watcher.receive(timeout=0.2) is None
    assert broker.stats(OUT).depth == 0
    tx.commit()
    assert [m.text for m in drain(watcher)] == ["1", "2"]


def test_rollback_discards_sends(tx, observer, drain):
    tx.create_producer(OUT).send(tx.create_text_message("discarded"))
    tx.rollback()
    tx.create_producer(OUT).send(tx.create_text_message("kept"))
    tx.commit()
    assert [m.text for m in drain(observer.create_consumer(OUT))] == ["kept"]


def test_consumed_messages_are_gone_after_commit(broker, tx, send, observer, drain):
    send(IN, "a", "b")
    consumer = tx.create_consumer(IN)
    assert [m.text for m in drain(consumer)] == ["a", "b"]
    assert broker.stats(IN).in_flight == 2
    tx.commit()
    tx.rollback()  # nothing left to roll back
    assert drain(consumer) == []
    tx.close()
    assert drain(observer.create_consumer(IN)) == []
    assert broker.stats(IN).dequeued == 2


def test_rollback_redelivers_consumed_messages_in_order(tx, send, drain):
    send(IN, "a", "b", "c")
    consumer = tx.create_consumer(IN)
    first = drain(consumer)
    tx.rollback()
    again = drain(consumer)
    assert [m.text for m in again] == ["a", "b", "c"]
    assert [m.jms_message_id for m in again] == [m.jms_message_id for m in first]
    assert all(m.jms_redelivered for m in again)
    assert [m.get_int_property("JMSXDeliveryCount") for m in again] == [2, 2, 2]
    tx.commit()
    assert drain(consumer) == []


def test_commit_is_atomic_across_receives_and_sends(broker, tx, send, observer, drain):
    send(IN, "order")
    received = tx.create_consumer(IN).receive(timeout=2)
    tx.create_producer(OUT).send(tx.create_text_message(f"processed {received.text}"))
    tx.create_producer(Queue("tx.audit")).send(tx.create_text_message("audit"))
    in_watch = observer.create_consumer(IN)
    out_watch = observer.create_consumer(OUT)
    assert in_watch.receive_no_wait() is None and out_watch.receive_no_wait() is None
    tx.commit()
    assert [m.text for m in drain(out_watch)] == ["processed order"]
    assert [m.text for m in drain(observer.create_consumer(Queue("tx.audit")))] == ["audit"]
    assert drain(in_watch) == []
    assert broker.stats(IN).dequeued == 1


def test_rollback_undoes_receives_and_sends_together(tx, send, observer, drain):
    send(IN, "order")
    consumer = tx.create_consumer(IN)
    consumer.receive(timeout=2)
    tx.create_producer(OUT).send(tx.create_text_message("never"))
    tx.rollback()
    assert drain(observer.create_consumer(OUT)) == []
    again = consumer.receive(timeout=2)
    assert again.text == "order" and again.jms_redelivered


def test_transactions_follow_one_another(tx, send, observer, drain):
    producer = tx.create_producer(OUT)
    producer.send(tx.create_text_message("t1"))
    tx.commit()
    producer.send(tx.create_text_message("t2"))
    tx.rollback()
    producer.send(tx.create_text_message("t3"))
    tx.commit()
    assert [m.text for m in drain(observer.create_consumer(OUT))] == ["t1", "t3"]


def test_transacted_publish_to_a_topic(tx, observer, drain):
    topic = Topic("tx.topic")
    subscriber = observer.create_consumer(topic)
    tx.create_producer(topic).send(tx.create_text_message("news"))
    assert subscriber.receive(timeout=0.2) is None
    tx.commit()
    assert [m.text for m in drain(subscriber)] == ["news"]


def test_closing_a_transacted_session_rolls_back(broker, conn, send, observer, drain):
    send(IN, "a")
    tx = conn.create_session(transacted=True)
    tx.create_consumer(IN).receive(timeout=2)
    tx.create_producer(OUT).send(tx.create_text_message("never"))
    tx.close()
    assert drain(observer.create_consumer(OUT)) == []
    again = drain(observer.create_consumer(IN))
    assert [m.text for m in again] == ["a"] and again[0].jms_redelivered


def test_closing_the_connection_rolls_back(broker, send, observer, drain):
    send(IN, "a")
    conn = broker.connect()
    conn.start()
    tx = conn.create_session(transacted=True)
    tx.create_consumer(IN).receive(timeout=2)
    tx.create_producer(OUT).send(tx.create_text_message("never"))
    conn.close()
    assert drain(observer.create_consumer(OUT)) == []
    assert [m.text for m in drain(observer.create_consumer(IN))] == ["a"]


def test_acknowledge_does_not_commit(tx, send, drain):
    send(IN, "a")
    consumer = tx.create_consumer(IN)
    consumer.receive(timeout=2).acknowledge()
    tx.rollback()
    again = consumer.receive(timeout=2)
    assert again is not None and again.text == "a"


def test_sent_message_headers_are_set_at_send(tx):
    message = tx.create_text_message("x")
    tx.create_producer(OUT).send(message, priority=6)
    assert message.jms_message_id.startswith("ID:")
    assert message.jms_priority == 6
    tx.rollback()


def test_changing_a_staged_message_does_not_change_what_commit_sends(tx, observer, drain):
    message = tx.create_text_message("as sent")
    message.set_string_property("state", "as sent")
    tx.create_producer(OUT).send(message)
    message.text = "changed before commit"
    message.set_string_property("state", "changed")
    tx.commit()
    (got,) = drain(observer.create_consumer(OUT))
    assert (got.text, got.get_string_property("state")) == ("as sent", "as sent")


def test_commit_and_rollback_need_a_transacted_session(session):
    with pytest.raises(IllegalStateError):
        session.commit()
    with pytest.raises(IllegalStateError):
        session.rollback()


def test_commit_after_close_fails(conn):
    tx = conn.create_session(transacted=True)
    tx.close()
    with pytest.raises(IllegalStateError):
        tx.commit()
    with pytest.raises(IllegalStateError):
        tx.rollback()


def test_many_messages_in_one_transaction(tx, observer, drain):
    producer = tx.create_producer(OUT)
    for i in range(150):
        producer.send(tx.create_text_message(str(i)))
    tx.commit()
    assert [m.text for m in drain(observer.create_consumer(OUT))] == [str(i) for i in range(150)]
