"""Destinations: equality by type and name, hashing, names and parsing."""

from __future__ import annotations

import pytest

from broker_core import (
    InvalidDestinationError,
    JMSError,
    Queue,
    TemporaryQueue,
    TemporaryTopic,
    Topic,
    parse_destination,
)


def test_equal_by_type_and_name():
    assert Queue("a") == Queue("a")
    assert Topic("a") == Topic("a")
    assert Queue("a") != Queue("b")
    assert Queue("a") != Topic("a")
    assert Topic("a") != Queue("a")
    assert Queue("a") != "queue://a"
    assert Queue("a") != "a"


def test_hashable_and_usable_as_keys():
    assert hash(Queue("a")) == hash(Queue("a"))
    assert {Queue("a"), Queue("a"), Topic("a"), Queue("b")} == {Queue("a"), Topic("a"), Queue("b")}
    routes = {Queue("orders"): "q", Topic("orders"): "t"}
    assert routes[Queue("orders")] == "q"
    assert routes[Topic("orders")] == "t"


def test_name_and_text_form():
    assert Queue("orders.inbound").name == "orders.inbound"
    assert Topic("prices").name == "prices"
    assert str(Queue("orders.inbound")) == "queue://orders.inbound"
    assert str(Topic("prices")) == "topic://prices"
    assert not Queue("a").is_topic and Topic("a").is_topic
    assert not Queue("a").is_temporary and not Topic("a").is_temporary


@pytest.mark.parametrize("destination", [Queue("a.b-c"), Topic("x/y:z"), Queue("DLQ.orders")])
def test_parse_destination_roundtrips(destination):
    parsed = parse_destination(str(destination))
    assert parsed == destination
    assert type(parsed) is type(destination)


@pytest.mark.parametrize("text", ["a", "queue:/a", "bogus://a", "queue://", ""])
def test_parse_destination_refuses_malformed(text):
    with pytest.raises(InvalidDestinationError):
        parse_destination(text)


@pytest.mark.parametrize("name", ["", ".hidden", "-x", "a b", "a\nb", "x" * 250, None, 5])
def test_invalid_names_are_refused(name):
    with pytest.raises(JMSError) as info:
        Queue(name)
    assert isinstance(info.value, InvalidDestinationError)
    with pytest.raises(InvalidDestinationError):
        Topic(name)


def test_temporary_destinations_are_distinct_kinds(conn):
    tq = conn.create_temporary_queue()
    tt = conn.create_temporary_topic()
    assert isinstance(tq, TemporaryQueue) and isinstance(tq, Queue) and tq.is_temporary
    assert isinstance(tt, TemporaryTopic) and isinstance(tt, Topic) and tt.is_temporary and tt.is_topic
    assert str(tq).startswith("temp-queue://")
    assert str(tt).startswith("temp-topic://")
    assert tq != Queue(tq.name)
    assert parse_destination(str(tq)) == tq
    assert conn.create_temporary_queue() != tq


def test_received_destination_headers_compare_equal(session):
    queue = Queue("dest.header")
    message = session.create_message()
    message.jms_reply_to = Topic("replies")
    session.create_producer(queue).send(message)
    received = session.create_consumer(Queue("dest.header")).receive(timeout=2)
    assert received.jms_destination == queue
    assert received.jms_reply_to == Topic("replies")
    assert received.jms_reply_to != Queue("replies")
