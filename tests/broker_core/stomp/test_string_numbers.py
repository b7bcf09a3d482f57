"""Numeric selectors over STOMP, driven by stomp.py: STOMP sends every header as
a string, so ``amount > 100`` matches ``amount:150`` only when selectors read
such strings as numbers (``selector_string_numbers: convert``, the default,
as ActiveMQ does) and never under the JMS rule (``strict``)."""

from __future__ import annotations

import pytest

from broker_core import STRING_NUMBERS_PROPERTY, Broker, Int, Queue

from .test_interop import client, sync


def send_amounts(conn, destination: str, *amounts: str, **headers: str) -> None:
    for amount in amounts:
        conn.send(destination, f"amount {amount}", headers={"amount": amount, **headers})


def test_convert_is_the_default_and_a_stomp_selector_matches_numbers_sent_as_text(server):
    conn, listener = client(server.port)
    conn.subscribe("/queue/amounts", id="big", headers={"selector": "amount > 100"})
    sync(conn, listener)
    send_amounts(conn, "/queue/amounts", "50", "150", "abc", "100.5", "1e3")
    got = [listener.get().body for _ in range(3)]
    assert got == ["amount 150", "amount 100.5", "amount 1e3"]
    assert listener.none()
    conn.disconnect()


def test_the_mark_is_not_sent_back_out_and_cannot_be_forged(start_server):
    broker = Broker.open("memory://", selector_string_numbers="strict")
    try:
        server = start_server(broker, heartbeat=(0, 0))
        conn, listener = client(server.port)
        conn.subscribe("/queue/forged", id="s", headers={"selector": "amount > 100"})
        conn.subscribe("/queue/all", id="all")
        sync(conn, listener)
        send_amounts(conn, "/queue/forged", "150", **{STRING_NUMBERS_PROPERTY: "true"})
        send_amounts(conn, "/queue/all", "7")
        frame = listener.get()
        assert frame.body == "amount 7"
        assert STRING_NUMBERS_PROPERTY not in frame.headers
        assert listener.none()  # the forged header did not turn conversion on
        conn.disconnect()
    finally:
        broker.close()


def test_python_consumers_select_on_stomp_messages_too(server, broker):
    conn, listener = client(server.port)
    jms = broker.connect()
    jms.start()
    consumer = jms.create_session().create_consumer(Queue("mixed"), "amount BETWEEN 100 AND 200")
    send_amounts(conn, "/queue/mixed", "99", "150")
    message = consumer.receive(5)
    assert message.get_body() == b"amount 150"  # stomp.py sends content-length: a BytesMessage
    assert message.get_string_property("amount") == "150"  # the property itself stays a string
    assert message.get_boolean_property(STRING_NUMBERS_PROPERTY) is True
    assert consumer.receive(0.3) is None
    conn.disconnect()
    jms.close()


def test_messages_of_jms_clients_keep_the_jms_rule(server, broker):
    conn, listener = client(server.port)
    conn.subscribe("/queue/typed", id="s", headers={"selector": "amount > 100"})
    sync(conn, listener)
    with broker.connect() as jms:
        session = jms.create_session()
        producer = session.create_producer(Queue("typed"))
        text = session.create_text_message("string property")
        text.set_string_property("amount", "150")  # a JMS client said: a string
        producer.send(text)
        typed = session.create_text_message("int property")
        typed.set_object_property("amount", Int(150))
        producer.send(typed)
    frame = listener.get()
    assert frame.body == "int property"
    assert frame.headers["amount"] == "150"
    assert listener.none()
    conn.disconnect()


@pytest.mark.parametrize("where", ["listener", "broker"])
def test_strict_keeps_the_jms_rule(start_server, where):
    broker = Broker.open("memory://", **({"selector_string_numbers": "strict"} if where == "broker" else {}))
    try:
        options = {"selector_string_numbers": "strict"} if where == "listener" else {}
        server = start_server(broker, heartbeat=(0, 0), **options)
        assert server.server.selector_string_numbers == "strict"
        conn, listener = client(server.port)
        conn.subscribe("/queue/strict", id="s", headers={"selector": "amount > 100"})
        conn.subscribe("/queue/strict.text", id="t", headers={"selector": "amount = '150'"})
        sync(conn, listener)
        send_amounts(conn, "/queue/strict", "150", "1e3")
        send_amounts(conn, "/queue/strict.text", "150")
        assert listener.get().body == "amount 150"  # the string comparison, never the numeric one
        assert listener.none()
        conn.disconnect()
    finally:
        broker.close()


def test_a_listener_may_convert_on_a_strict_broker(start_server):
    broker = Broker.open("memory://", selector_string_numbers="strict")
    try:
        server = start_server(broker, heartbeat=(0, 0), selector_string_numbers="convert")
        conn, listener = client(server.port)
        conn.subscribe("/queue/override", id="s", headers={"selector": "amount > 100"})
        sync(conn, listener)
        send_amounts(conn, "/queue/override", "150")
        assert listener.get().body == "amount 150"
        conn.disconnect()
    finally:
        broker.close()


def test_the_mark_is_stored_with_persistent_messages(start_server, sqlite_url):
    """A selective consumer of the SQL store reads what it matches from the
    database: the mark must come back with the message."""
    broker = Broker.open(sqlite_url, sweep_interval=0)
    try:
        server = start_server(broker, heartbeat=(0, 0))
        conn, listener = client(server.port)
        send_amounts(conn, "/queue/stored", "50", "250", persistent="true")
        sync(conn, listener)
        conn.subscribe("/queue/stored", id="s", headers={"selector": "amount > 100"})
        assert listener.get().body == "amount 250"
        assert listener.none()
        conn.disconnect()
    finally:
        broker.close()


def test_an_unknown_mode_is_refused(broker, stomp_user):
    from broker_core import InvalidArgumentError
    from broker_core.stomp import StompServer

    with pytest.raises(ValueError, match="selector_string_numbers"):
        StompServer(broker, selector_string_numbers="loose", users=[stomp_user()])
    with pytest.raises(InvalidArgumentError, match="selector_string_numbers"):
        Broker.open("memory://", selector_string_numbers="loose")
