"""Durable subscriptions: identified by client id + name, they keep messages
while their subscriber is away, until acknowledged or expired."""

from __future__ import annotations

import time

import pytest

from broker_core import (
    AckMode,
    IllegalStateError,
    InvalidClientIDError,
    InvalidDestinationError,
    InvalidSelectorError,
    JMSError,
    Queue,
    Topic,
)

TOPIC = Topic("orders.events")


def client(broker, client_id="erp-1"):
    conn = broker.connect(client_id=client_id)
    conn.start()
    return conn


def publish(broker, topic, *texts, **options):
    session = broker.connect().create_session()
    producer = session.create_producer(topic)
    for text in texts:
        producer.send(session.create_text_message(text), **options)
    session.connection.close()


def test_durable_subscription_keeps_messages_while_disconnected(broker, drain):
    conn = client(broker)
    conn.create_session().create_durable_subscriber(TOPIC, "audit").close()
    conn.close()
    publish(broker, TOPIC, "m1", "m2", "m3")
    conn = client(broker)
    subscriber = conn.create_session().create_durable_subscriber(TOPIC, "audit")
    assert [m.text for m in drain(subscriber)] == ["m1", "m2", "m3"]


def test_acknowledged_messages_do_not_come_back(broker, drain):
    conn = client(broker)
    session = conn.create_session(ack_mode=AckMode.CLIENT)
    subscriber = session.create_durable_subscriber(TOPIC, "audit")
    publish(broker, TOPIC, "a", "b")
    got = drain(subscriber)
    assert [m.text for m in got] == ["a", "b"]
    got[-1].acknowledge()
    conn.close()
    conn = client(broker)
    assert drain(conn.create_session().create_durable_subscriber(TOPIC, "audit")) == []


def test_unacknowledged_messages_are_redelivered_to_the_next_subscriber(broker, drain):
    conn = client(broker)
    session = conn.create_session(ack_mode=AckMode.CLIENT)
    subscriber = session.create_durable_subscriber(TOPIC, "audit")
    publish(broker, TOPIC, "a", "b")
    assert [m.text for m in drain(subscriber)] == ["a", "b"]
    conn.close()
    conn = client(broker)
    again = drain(conn.create_session().create_durable_subscriber(TOPIC, "audit"))
    assert [m.text for m in again] == ["a", "b"]
    assert all(m.jms_redelivered for m in again)
    assert [m.get_int_property("JMSXDeliveryCount") for m in again] == [2, 2]


def test_messages_expire_in_a_durable_subscription(broker, drain):
    conn = client(broker)
    conn.create_session().create_durable_subscriber(TOPIC, "audit").close()
    publish(broker, TOPIC, "short-lived", time_to_live=150)
    publish(broker, TOPIC, "long-lived", time_to_live=60_000)
    time.sleep(0.4)
    got = drain(conn.create_session().create_durable_subscriber(TOPIC, "audit"))
    assert [m.text for m in got] == ["long-lived"]


def test_durable_subscriptions_need_a_client_id(conn):
    with pytest.raises(JMSError) as info:
        conn.create_session().create_durable_subscriber(TOPIC, "audit")
    assert isinstance(info.value, InvalidClientIDError)
    with pytest.raises(InvalidClientIDError):
        conn.create_session().unsubscribe("audit")


def test_client_ids_are_unique_among_open_connections(broker):
    first = broker.connect(client_id="erp-1")
    with pytest.raises(InvalidClientIDError):
        broker.connect(client_id="erp-1")
    other = broker.connect(client_id="erp-2")
    assert other.client_id == "erp-2"
    first.close()
    again = broker.connect(client_id="erp-1")
    assert again.client_id == "erp-1"


@pytest.mark.parametrize("bad", ["", "   "])
def test_client_id_must_not_be_blank(broker, bad):
    with pytest.raises(InvalidClientIDError):
        broker.connect(client_id=bad)


def test_only_one_active_subscriber_per_durable_subscription(broker, drain):
    conn = client(broker)
    first = conn.create_session().create_durable_subscriber(TOPIC, "audit")
    with pytest.raises(IllegalStateError):
        conn.create_session().create_durable_subscriber(TOPIC, "audit")
    publish(broker, TOPIC, "x")
    first.close()
    second = conn.create_session().create_durable_subscriber(TOPIC, "audit")
    assert [m.text for m in drain(second)] == ["x"]


def test_unsubscribe_removes_the_subscription_and_its_messages(broker, drain):
    conn = client(broker)
    session = conn.create_session()
    session.create_durable_subscriber(TOPIC, "audit").close()
    publish(broker, TOPIC, "kept until unsubscribe")
    session.unsubscribe("audit")
    publish(broker, TOPIC, "nobody subscribed")
    subscriber = session.create_durable_subscriber(TOPIC, "audit")
    publish(broker, TOPIC, "new")
    assert [m.text for m in drain(subscriber)] == ["new"]


def test_unsubscribe_refuses_active_and_unknown(broker):
    conn = client(broker)
    session = conn.create_session()
    subscriber = session.create_durable_subscriber(TOPIC, "audit")
    with pytest.raises(IllegalStateError):
        session.unsubscribe("audit")
    with pytest.raises(InvalidDestinationError):
        session.unsubscribe("never-created")
    subscriber.close()
    session.unsubscribe("audit")
    with pytest.raises(InvalidDestinationError):
        session.unsubscribe("audit")


def test_recreating_with_another_selector_replaces_the_subscription(broker, drain):
    conn = client(broker)
    session = conn.create_session()
    session.create_durable_subscriber(TOPIC, "audit", selector="partner = 'acme'").close()
    session2 = broker.connect().create_session()
    producer = session2.create_producer(TOPIC)
    for partner in ("acme", "globex"):
        message = session2.create_text_message(f"old {partner}")
        message.set_string_property("partner", partner)
        producer.send(message)
    replaced = session.create_durable_subscriber(TOPIC, "audit", selector="partner = 'globex'")
    for partner in ("acme", "globex"):
        message = session2.create_text_message(f"new {partner}")
        message.set_string_property("partner", partner)
        producer.send(message)
    assert [m.text for m in drain(replaced)] == ["new globex"]


def test_recreating_with_the_same_selector_keeps_the_messages(broker, drain):
    conn = client(broker)
    session = conn.create_session()
    session.create_durable_subscriber(TOPIC, "audit", selector="partner = 'acme'").close()
    session2 = broker.connect().create_session()
    message = session2.create_text_message("kept")
    message.set_string_property("partner", "acme")
    session2.create_producer(TOPIC).send(message)
    again = session.create_durable_subscriber(TOPIC, "audit", selector="partner = 'acme'")
    assert [m.text for m in drain(again)] == ["kept"]


def test_an_invalid_selector_leaves_the_existing_subscription_alone(broker, drain):
    conn = client(broker)
    session = conn.create_session()
    session.create_durable_subscriber(TOPIC, "audit").close()
    publish(broker, TOPIC, "kept")
    with pytest.raises(InvalidSelectorError):
        session.create_durable_subscriber(TOPIC, "audit", selector="partner = ")
    again = session.create_durable_subscriber(TOPIC, "audit")
    assert [m.text for m in drain(again)] == ["kept"]


def test_recreating_on_another_topic_replaces_the_subscription(broker, drain):
    conn = client(broker)
    session = conn.create_session()
    session.create_durable_subscriber(TOPIC, "audit").close()
    publish(broker, TOPIC, "old topic, old subscription")
    moved = session.create_durable_subscriber(Topic("other.events"), "audit")
    publish(broker, TOPIC, "old topic, new subscription")
    publish(broker, Topic("other.events"), "new topic")
    assert [m.text for m in drain(moved)] == ["new topic"]


def test_subscriptions_are_per_client_id_and_name(broker, drain):
    one = client(broker, "erp-1")
    two = client(broker, "erp-2")
    a1 = one.create_session().create_durable_subscriber(TOPIC, "a")
    b1 = one.create_session().create_durable_subscriber(TOPIC, "b")
    a2 = two.create_session().create_durable_subscriber(TOPIC, "a")  # same name, another client: allowed
    publish(broker, TOPIC, "x")
    for subscriber in (a1, b1, a2):
        assert [m.text for m in drain(subscriber)] == ["x"]


def test_durable_no_local(broker, drain):
    conn = client(broker)
    session = conn.create_session()
    subscriber = session.create_durable_subscriber(TOPIC, "audit", no_local=True)
    session.create_producer(TOPIC).send(session.create_text_message("own"))
    publish(broker, TOPIC, "foreign")
    assert [m.text for m in drain(subscriber)] == ["foreign"]


def test_durable_subscription_refuses_queues_and_temporary_topics(broker):
    conn = client(broker)
    session = conn.create_session()
    with pytest.raises(InvalidDestinationError):
        session.create_durable_subscriber(Queue("q"), "audit")
    with pytest.raises(InvalidDestinationError):
        session.create_durable_subscriber(conn.create_temporary_topic(), "audit")


def test_durable_subscription_shows_in_stats_with_its_backlog(broker):
    conn = client(broker)
    conn.create_session().create_durable_subscriber(TOPIC, "audit").close()
    publish(broker, TOPIC, "a", "b")
    subs = [s for s in broker.destinations() if s.topic == str(TOPIC)]
    assert len(subs) == 1
    assert subs[0].depth == 2
    assert subs[0].consumers == 0
    assert "erp-1" in subs[0].name and "audit" in subs[0].name
