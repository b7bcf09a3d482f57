"""Broker.message_status: where a sent message stands, as operators and the
gateway's ledger see it."""

from __future__ import annotations

import time

from broker_core import AckMode, Queue, Topic


def test_pending_in_flight_and_gone(broker, conn, send):
    queue = Queue("status.q")
    first, second = send(queue, "one", "two")
    ids = [first.jms_message_id, second.jms_message_id]
    assert broker.message_status(ids) == {ids[0]: "pending", ids[1]: "pending"}
    consumer = conn.create_session(ack_mode=AckMode.CLIENT).create_consumer(queue)
    received = consumer.receive(timeout=2)
    assert received is not None and received.text == "one"
    assert broker.message_status(ids)[ids[0]] == "in_flight"
    received.acknowledge()
    assert broker.message_status(ids)[ids[0]] == "gone"
    assert broker.message_status(["ID:never-sent"]) == {"ID:never-sent": "gone"}


def test_an_expired_message_reads_as_expired_not_gone(broker, conn, send):
    """A message whose time to live ran out was not delivered: saying "gone"
    (consumed) would let a ledger record it as delivered."""
    queue = Queue("status.exp")
    (dies,) = send(queue, "dies", time_to_live=100)
    (lives,) = send(queue, "lives")
    time.sleep(0.3)
    consumer = conn.create_session(ack_mode=AckMode.CLIENT).create_consumer(queue)
    received = consumer.receive(timeout=2)  # skips (and drops) the expired one
    assert received is not None and received.text == "lives"
    received.acknowledge()
    status = broker.message_status([dies.jms_message_id, lives.jms_message_id])
    assert status == {dies.jms_message_id: "expired", lives.jms_message_id: "gone"}


def test_a_message_expired_by_the_sweeper_reads_as_expired(broker, send):
    queue = Queue("status.sweep")
    (dies,) = send(queue, "dies", time_to_live=100)
    time.sleep(0.3)
    assert broker.sweep_expired() == 1
    assert broker.message_status([dies.jms_message_id]) == {dies.jms_message_id: "expired"}


def test_a_topic_message_is_pending_until_its_durable_subscriber_acknowledges_it(broker, session):
    topic = Topic("status.topic")
    durable_conn = broker.connect(client_id="status-client")
    durable_conn.start()
    keeper = durable_conn.create_session(ack_mode=AckMode.CLIENT).create_durable_subscriber(topic, "keeper")
    producer = session.create_producer(topic)
    message = session.create_text_message("fan-out")
    producer.send(message)
    assert broker.message_status([message.jms_message_id]) == {message.jms_message_id: "pending"}
    received = keeper.receive(timeout=2)
    assert received is not None and received.text == "fan-out"
    received.acknowledge()
    assert broker.message_status([message.jms_message_id]) == {message.jms_message_id: "gone"}
