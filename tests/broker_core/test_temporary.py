"""Temporary destinations: consumed only by their creating connection, gone
with delete() or with that connection, always NON_PERSISTENT."""

from __future__ import annotations

import pytest

from broker_core import DeliveryMode, IllegalStateError, InvalidDestinationError, JMSError


@pytest.fixture
def other(broker):
    """A second, started connection."""
    conn = broker.connect()
    conn.start()
    return conn


def test_temporary_queue_round_trip(conn, session, drain):
    temp = conn.create_temporary_queue()
    session.create_producer(temp).send(session.create_text_message("hello"))
    got = drain(session.create_consumer(temp))
    assert [m.text for m in got] == ["hello"]
    assert got[0].jms_destination == temp


def test_other_connections_may_send_but_not_consume(conn, session, other, drain):
    temp = conn.create_temporary_queue()
    other_session = other.create_session()
    with pytest.raises(InvalidDestinationError):
        other_session.create_consumer(temp)
    other_session.create_producer(temp).send(other_session.create_text_message("from other"))
    assert [m.text for m in drain(session.create_consumer(temp))] == ["from other"]


def test_another_session_of_the_same_connection_may_consume(conn, session, drain):
    temp = conn.create_temporary_queue()
    session.create_producer(temp).send(session.create_text_message("x"))
    assert [m.text for m in drain(conn.create_session().create_consumer(temp))] == ["x"]


def test_temporary_topic_subscribers_only_on_the_creating_connection(conn, session, other, drain):
    temp = conn.create_temporary_topic()
    subscriber = session.create_consumer(temp)
    with pytest.raises(InvalidDestinationError):
        other.create_session().create_consumer(temp)
    other_session = other.create_session()
    other_session.create_producer(temp).send(other_session.create_text_message("news"))
    assert [m.text for m in drain(subscriber)] == ["news"]


def test_persistent_sends_arrive_non_persistent(conn, session, drain):
    for temp in (conn.create_temporary_queue(), conn.create_temporary_topic()):
        consumer = session.create_consumer(temp)
        message = session.create_text_message("x")
        session.create_producer(temp).send(message, delivery_mode=DeliveryMode.PERSISTENT)
        assert message.jms_delivery_mode == DeliveryMode.NON_PERSISTENT
        got = drain(consumer)
        assert [m.jms_delivery_mode for m in got] == [DeliveryMode.NON_PERSISTENT]


def test_delete_refused_while_a_consumer_is_open(conn, session):
    temp = conn.create_temporary_queue()
    consumer = session.create_consumer(temp)
    with pytest.raises(IllegalStateError):
        temp.delete()
    session.create_producer(temp).send(session.create_text_message("still there"))
    assert consumer.receive(timeout=2).text == "still there"
    consumer.close()
    temp.delete()


def test_delete_refused_for_a_temporary_topic_with_a_subscriber(conn, session):
    temp = conn.create_temporary_topic()
    subscriber = session.create_consumer(temp)
    with pytest.raises(IllegalStateError):
        temp.delete()
    subscriber.close()
    temp.delete()


def test_a_deleted_temporary_queue_is_gone(conn, session, other):
    temp = conn.create_temporary_queue()
    temp.delete()
    with pytest.raises(InvalidDestinationError):
        session.create_producer(temp).send(session.create_text_message("x"))
    with pytest.raises(InvalidDestinationError):
        other.create_session().create_producer(None).send(temp, session.create_text_message("x"))
    with pytest.raises(InvalidDestinationError):
        session.create_consumer(temp)
    with pytest.raises(JMSError):
        temp.delete()


def test_temporary_destinations_disappear_when_their_connection_closes(broker, other):
    owner = broker.connect()
    queue = owner.create_temporary_queue()
    topic = owner.create_temporary_topic()
    owner.create_session().create_producer(queue).send(owner.create_session().create_text_message("lost"))
    owner.close()
    session = other.create_session()
    for temp in (queue, topic):
        with pytest.raises(InvalidDestinationError):
            session.create_producer(temp).send(session.create_text_message("x"))
        with pytest.raises(InvalidDestinationError):
            session.create_consumer(temp)
    assert not any(s.name == str(queue) for s in broker.destinations())


def test_temporary_names_are_unique(broker, conn):
    other = broker.connect()
    temps = [conn.create_temporary_queue() for _ in range(3)] + [other.create_temporary_queue()]
    temps += [conn.create_temporary_topic(), other.create_temporary_topic()]
    assert len({str(t) for t in temps}) == len(temps)


def test_reply_to_a_temporary_queue(conn, session, other, drain):
    from broker_core import Queue

    reply_queue = conn.create_temporary_queue()
    request = session.create_text_message("ping")
    request.jms_reply_to = reply_queue
    session.create_producer(Queue("svc.temp")).send(request)
    responder = other.create_session()
    received = responder.create_consumer(Queue("svc.temp")).receive(timeout=2)
    assert received.jms_reply_to == reply_queue
    responder.create_producer(received.jms_reply_to).send(responder.create_text_message("pong"))
    assert [m.text for m in drain(session.create_consumer(reply_queue))] == ["pong"]


def test_closed_connection_cannot_create_temporaries(broker):
    conn = broker.connect()
    conn.close()
    with pytest.raises(IllegalStateError):
        conn.create_temporary_queue()
    with pytest.raises(IllegalStateError):
        conn.create_temporary_topic()
