"""Misuse fails clearly: one error hierarchy under JMSError, IllegalStateError
for closed objects, InvalidArgumentError for out-of-range arguments."""

from __future__ import annotations

import inspect

import pytest

import broker_core
from broker_core import (
    AckMode,
    Broker,
    IllegalStateError,
    InvalidArgumentError,
    InvalidDestinationError,
    JMSError,
    Queue,
    Topic,
)

QUEUE = Queue("errors")


def test_every_exported_error_derives_from_jms_error():
    errors = [
        obj
        for name in broker_core.__all__
        if inspect.isclass(obj := getattr(broker_core, name)) and issubclass(obj, BaseException)
    ]
    assert len(errors) >= 15
    for error in errors:
        assert issubclass(error, JMSError), error


def test_errors_also_derive_from_the_matching_builtins():
    assert issubclass(broker_core.IllegalStateError, RuntimeError)
    assert issubclass(broker_core.InvalidSelectorError, ValueError)
    assert issubclass(broker_core.InvalidArgumentError, ValueError)
    assert issubclass(broker_core.MessageFormatError, TypeError)
    assert issubclass(broker_core.RequestTimeoutError, TimeoutError)
    assert issubclass(broker_core.TransactionInProgressError, IllegalStateError)
    assert issubclass(broker_core.StoreUnavailableError, broker_core.StoreError)


@pytest.mark.parametrize("priority", [10, -1, 100, 1.5, "5", True])
def test_invalid_priority_is_refused(session, priority):
    producer = session.create_producer(QUEUE)
    with pytest.raises(InvalidArgumentError):
        producer.send(session.create_text_message("x"), priority=priority)
    producer.priority = priority
    with pytest.raises(InvalidArgumentError):
        producer.send(session.create_text_message("x"))
    assert session.create_consumer(QUEUE).receive_no_wait() is None


@pytest.mark.parametrize("priority", [0, 9])
def test_priority_bounds_are_accepted(session, priority):
    session.create_producer(QUEUE).send(session.create_text_message("x"), priority=priority)
    assert session.create_consumer(QUEUE).receive(timeout=2).jms_priority == priority


@pytest.mark.parametrize(
    "options", [{"delivery_mode": 3}, {"delivery_mode": 0}, {"time_to_live": -5}, {"time_to_live": 1.5}]
)
def test_invalid_send_options_are_refused(session, options):
    with pytest.raises(InvalidArgumentError):
        session.create_producer(QUEUE).send(session.create_text_message("x"), **options)


def test_send_needs_a_message(session):
    with pytest.raises(JMSError):
        session.create_producer(QUEUE).send("just a string")


@pytest.mark.parametrize("destination", [None, "queue://a", 42])
def test_consumers_need_a_destination(session, destination):
    with pytest.raises(InvalidDestinationError):
        session.create_consumer(destination)


def test_unknown_broker_url():
    with pytest.raises(InvalidArgumentError):
        Broker.open("bogus://somewhere")


def test_closed_broker_refuses_connections(make_broker):
    broker = make_broker()
    broker.close()
    assert broker.closed
    with pytest.raises(IllegalStateError):
        broker.connect()
    broker.close()  # idempotent


def test_closed_connection(broker):
    conn = broker.connect()
    session = conn.create_session()
    conn.close()
    conn.close()  # idempotent
    for call in (conn.start, conn.stop, conn.create_session, conn.create_temporary_queue, conn.create_temporary_topic):
        with pytest.raises(IllegalStateError):
            call()
    with pytest.raises(IllegalStateError):
        session.create_producer(QUEUE)


def test_closing_a_broker_closes_its_connections(make_broker):
    broker = make_broker()
    conn = broker.connect()
    broker.close()
    with pytest.raises(IllegalStateError):
        conn.create_session()


def test_closed_session(conn):
    session = conn.create_session()
    producer = session.create_producer(QUEUE)
    consumer = session.create_consumer(QUEUE)
    session.close()
    session.close()  # idempotent
    calls = [
        lambda: session.create_producer(QUEUE),
        lambda: session.create_consumer(QUEUE),
        lambda: session.create_browser(QUEUE),
        lambda: session.create_text_message("x"),
        lambda: session.create_message(),
        lambda: session.create_map_message(),
        lambda: session.create_bytes_message(),
        lambda: session.create_stream_message(),
        lambda: session.create_object_message(),
        lambda: session.create_xml_message(),
        lambda: session.recover(),
        lambda: session.acknowledge(),
        lambda: session.unsubscribe("x"),
        lambda: producer.send(broker_core.TextMessage("x")),
        lambda: consumer.receive(timeout=0.1),
        lambda: consumer.receive_no_wait(),
    ]
    for call in calls:
        with pytest.raises(IllegalStateError):
            call()


def test_closed_producer(session):
    producer = session.create_producer(QUEUE)
    producer.close()
    with pytest.raises(IllegalStateError):
        producer.send(session.create_text_message("x"))
    assert session.create_consumer(QUEUE).receive_no_wait() is None


def test_closed_consumer(session, send):
    consumer = session.create_consumer(QUEUE)
    consumer.close()
    consumer.close()  # idempotent
    send(QUEUE, "kept")
    for call in (
        lambda: consumer.receive(timeout=0.1),
        consumer.receive_no_wait,
        lambda: consumer.set_message_listener(lambda m: None),
    ):
        with pytest.raises(IllegalStateError):
            call()
    assert session.create_consumer(QUEUE).receive(timeout=2).text == "kept"


def test_closed_consumer_async(session):
    import asyncio

    consumer = session.create_consumer(QUEUE)
    consumer.close()
    with pytest.raises(IllegalStateError):
        asyncio.run(consumer.receive_async(timeout=0.1))


def test_closed_browser(session):
    browser = session.create_browser(QUEUE)
    browser.close()
    with pytest.raises(IllegalStateError):
        list(browser)


def test_context_managers_close(broker):
    with broker.connect() as conn:
        with conn.create_session() as session:
            with session.create_producer(QUEUE) as producer:
                pass
            with pytest.raises(IllegalStateError):
                producer.send(session.create_text_message("x"))
            with session.create_consumer(QUEUE) as consumer:
                pass
            with pytest.raises(IllegalStateError):
                consumer.receive_no_wait()
        with pytest.raises(IllegalStateError):
            session.create_producer(QUEUE)
    with pytest.raises(IllegalStateError):
        conn.create_session()


def test_client_id_cannot_change_once_set_or_used(broker):
    from broker_core import InvalidClientIDError

    conn = broker.connect(client_id="fixed")
    with pytest.raises(IllegalStateError):
        conn.client_id = "other"
    used = broker.connect()
    used.create_session()
    with pytest.raises(IllegalStateError):
        used.client_id = "late"
    fresh = broker.connect()
    fresh.client_id = "set-before-use"
    assert fresh.client_id == "set-before-use"
    with pytest.raises(InvalidClientIDError):
        broker.connect().client_id = "fixed"


def test_errors_carry_a_readable_message(session):
    with pytest.raises(InvalidArgumentError) as info:
        session.create_producer(QUEUE).send(session.create_text_message("x"), priority=10)
    assert "priority" in str(info.value)
    with pytest.raises(InvalidDestinationError) as info2:
        Topic("")
    assert str(info2.value)


def test_durable_on_a_session_without_client_id_names_the_fix(conn):
    with pytest.raises(JMSError) as info:
        conn.create_session(ack_mode=AckMode.AUTO).create_durable_subscriber(Topic("t"), "s")
    assert "client" in str(info.value).lower()
