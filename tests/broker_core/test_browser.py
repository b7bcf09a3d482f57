"""Queue browsers: waiting messages in delivery order, without consuming them."""

from __future__ import annotations

import pytest

from broker_core import AckMode, IllegalStateError, InvalidDestinationError, MessageNotWriteableError, Queue, Topic

QUEUE = Queue("browse")


def fill(session, specs):
    producer = session.create_producer(QUEUE)
    for text, priority, partner in specs:
        message = session.create_text_message(text)
        message.set_string_property("partner", partner)
        producer.send(message, priority=priority)


SPECS = [("a", 4, "acme"), ("b", 9, "globex"), ("c", 4, "globex"), ("d", 1, "acme"), ("e", 9, "acme")]
DELIVERY_ORDER = ["b", "e", "a", "c", "d"]


def test_browser_shows_messages_in_delivery_order_without_consuming(session, drain):
    fill(session, SPECS)
    browser = session.create_browser(QUEUE)
    assert browser.queue == QUEUE
    assert [m.text for m in browser] == DELIVERY_ORDER
    assert [m.text for m in browser] == DELIVERY_ORDER  # again: nothing was consumed
    assert [m.text for m in drain(session.create_consumer(QUEUE))] == DELIVERY_ORDER
    assert list(browser) == []


def test_browser_honours_its_selector(session):
    fill(session, SPECS)
    browser = session.create_browser(QUEUE, selector="partner = 'acme'")
    assert browser.message_selector == "partner = 'acme'"
    assert [m.text for m in browser] == ["e", "a", "d"]


def test_each_iteration_takes_a_fresh_look(session, send):
    browser = session.create_browser(QUEUE)
    assert list(browser) == []
    send(QUEUE, "first")
    assert [m.text for m in browser] == ["first"]
    session.create_consumer(QUEUE).receive(timeout=2)
    send(QUEUE, "second")
    assert [m.text for m in browser] == ["second"]


def test_browser_does_not_show_consumed_messages(conn, session, send):
    send(QUEUE, "a", "b")
    client = conn.create_session(ack_mode=AckMode.CLIENT)
    client.create_consumer(QUEUE).receive(timeout=2).acknowledge()
    assert [m.text for m in session.create_browser(QUEUE)] == ["b"]


def test_browsed_messages_carry_headers_and_are_read_only(session):
    message = session.create_text_message("x")
    message.jms_correlation_id = "PO-7"
    message.set_string_property("partner", "acme")
    session.create_producer(QUEUE).send(message, priority=7)
    (browsed,) = list(session.create_browser(QUEUE))
    assert browsed.jms_message_id == message.jms_message_id
    assert browsed.jms_priority == 7
    assert browsed.jms_correlation_id == "PO-7"
    assert browsed.get_string_property("partner") == "acme"
    with pytest.raises(MessageNotWriteableError):
        browsed.set_string_property("partner", "other")
    with pytest.raises(MessageNotWriteableError):
        browsed.text = "y"


def test_browsing_an_unknown_queue_shows_nothing(session):
    assert list(session.create_browser(Queue("never.used"))) == []


def test_only_queues_can_be_browsed(session):
    with pytest.raises(InvalidDestinationError):
        session.create_browser(Topic("t"))


def test_closed_browser_refuses_iteration(session, send):
    send(QUEUE, "a")
    browser = session.create_browser(QUEUE)
    browser.close()
    browser.close()  # idempotent
    with pytest.raises(IllegalStateError):
        list(browser)


def test_browser_closes_with_its_session(conn, send):
    send(QUEUE, "a")
    session = conn.create_session()
    browser = session.create_browser(QUEUE)
    session.close()
    with pytest.raises(IllegalStateError):
        list(browser)
    with pytest.raises(IllegalStateError):
        session.create_browser(QUEUE)


def test_broker_browse_with_selector_and_limit(broker, session):
    fill(session, SPECS)
    assert [m.text for m in broker.browse(QUEUE)] == DELIVERY_ORDER
    assert [m.text for m in broker.browse(QUEUE, selector="partner = 'globex'")] == ["b", "c"]
    assert [m.text for m in broker.browse(QUEUE, limit=2)] == ["b", "e"]
    assert [m.text for m in broker.browse("queue://browse", limit=1)] == ["b"]
