"""What operators do to a broker: browse page by page, look at one message, delete, move, replay dead
letters by id or selector, purge; and the counters they read (oldest waiting message, redeliveries,
consumers of every process)."""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_core import AckMode, InvalidArgumentError, InvalidSelectorError, Queue

ORDERS = Queue("orders")
DLQ = Queue("DLQ.orders")
PARKED = Queue("parked")


def started(broker):
    conn = broker.connect()
    conn.start()
    return conn


def fill(session, queue, items):
    """Send ``(text, priority, region)`` items; returns their message ids in send order."""
    producer = session.create_producer(queue)
    ids = []
    for text, priority, region in items:
        message = session.create_text_message(text)
        message.set_string_property("region", region)
        producer.send(message, priority=priority)
        ids.append(message.jms_message_id)
    return ids


def walk(broker, queue, selector=None, limit=3, scan_limit=10_000):
    """Every message id the pages give, following the cursors, and the number of pages."""
    seen, cursor, pages = [], None, 0
    while True:
        page = broker.browse_page(queue, selector, cursor=cursor, limit=limit, scan_limit=scan_limit)
        pages += 1
        assert len(page.messages) <= limit
        seen += [m.message_id for m in page.messages]
        if page.cursor is None:
            return seen, pages
        cursor = page.cursor
        assert pages < 10_000


def consumption_order(broker, queue, selector=None):
    """What a consumer receives from *queue* (consuming it)."""
    conn = started(broker)
    consumer = conn.create_session().create_consumer(queue, selector)
    out = []
    while (message := consumer.receive_no_wait()) is not None:
        out.append(message.jms_message_id)
    conn.close()
    return out


ITEMS = st.lists(st.tuples(st.just("x"), st.integers(0, 9), st.sampled_from(["eu", "us"])), max_size=25)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=ITEMS, limit=st.integers(1, 7))
def test_pages_give_every_waiting_message_once_in_delivery_order(make_broker, items, limit):
    broker = make_broker()
    queue = Queue(f"q{time.monotonic_ns()}")
    conn = started(broker)
    fill(conn.create_session(), queue, items)
    conn.close()
    seen, _ = walk(broker, queue, limit=limit)
    assert broker.stats(queue).depth == len(items)  # browsing consumed nothing
    assert seen == consumption_order(broker, queue)


def test_a_selector_pages_through_matches_only_and_bounds_the_scan(broker):
    conn = started(broker)
    ids = fill(conn.create_session(), ORDERS, [(f"m{i}", 4, "eu" if i % 10 == 0 else "us") for i in range(60)])
    wanted = [ids[i] for i in range(0, 60, 10)]
    seen, pages = walk(broker, ORDERS, "region = 'eu'", limit=50, scan_limit=7)
    assert seen == wanted
    assert pages >= 60 // 7  # each page looked at 7 messages at most
    first = broker.browse_page(ORDERS, "region = 'eu'", limit=50, scan_limit=5)
    assert [m.message_id for m in first.messages] == [ids[0]] and first.cursor is not None


def test_a_cursor_stays_valid_while_the_queue_is_consumed(broker):
    conn = started(broker)
    ids = fill(conn.create_session(), ORDERS, [(f"m{i}", 4, "eu") for i in range(10)])
    page = broker.browse_page(ORDERS, limit=4)
    assert [m.message_id for m in page.messages] == ids[:4]
    session = conn.create_session()
    consumer = session.create_consumer(ORDERS, prefetch=1)
    for _ in range(6):  # the first six are consumed, among them two after the cursor
        assert consumer.receive(timeout=2) is not None
    consumer.close()
    rest, _ = walk(broker, ORDERS, limit=2)
    following = broker.browse_page(ORDERS, cursor=page.cursor, limit=10)
    assert [m.message_id for m in following.messages] == ids[6:] == rest


def test_browse_page_refuses_a_foreign_cursor_and_a_bad_selector(broker):
    with pytest.raises(InvalidArgumentError):
        broker.browse_page(ORDERS, cursor="not-a-cursor")
    with pytest.raises(InvalidArgumentError):
        broker.browse_page(ORDERS, limit=0)
    with pytest.raises(InvalidSelectorError):
        broker.browse_page(ORDERS, "region = ")


def test_browse_pages_carry_headers_and_size_not_bodies(broker):
    conn = started(broker)
    session = conn.create_session()
    text = "<Order>" + "é" * 3000 + "</Order>"  # long enough to be stored compressed
    message = session.create_text_message(text)
    message.jms_correlation_id = "PO-7"
    message.set_string_property("region", "eu")
    session.create_producer(ORDERS).send(message, priority=6)
    [item] = broker.browse_page(ORDERS).messages
    assert (item.message_id, item.correlation_id, item.priority, item.properties) == (
        message.jms_message_id,
        "PO-7",
        6,
        {"region": "eu"},
    )
    assert item.body is None and item.size == len(text.encode("utf-8")) and item.state == "pending"


def test_find_message_has_the_body_and_the_state(broker):
    conn = started(broker)
    [first, second] = fill(conn.create_session(), ORDERS, [("one", 4, "eu"), ("two", 4, "eu")])
    found = broker.find_message(ORDERS, second)
    assert (found.body, found.size, found.state, found.kind) == ("two", 3, "pending", "text")
    client = conn.create_session(ack_mode=AckMode.CLIENT)
    received = client.create_consumer(ORDERS).receive(timeout=2)
    assert received.jms_message_id == first
    assert broker.find_message(ORDERS, first).state == "in_flight"
    received.acknowledge()
    assert broker.find_message(ORDERS, first) is None
    assert broker.find_message(Queue("elsewhere"), second) is None


def test_remove_messages_by_id_and_by_selector_with_a_limit(broker):
    conn = started(broker)
    ids = fill(conn.create_session(), ORDERS, [(f"m{i}", 4, "eu" if i < 4 else "us") for i in range(8)])
    assert broker.remove_messages(ORDERS, message_ids=[ids[5], ids[7], "ID:unknown"]) == [ids[5], ids[7]]
    removed = broker.remove_messages(ORDERS, selector="region = 'eu'", limit=3)
    assert removed == ids[:3]
    assert consumption_order(broker, ORDERS) == [ids[3], ids[4], ids[6]]
    with pytest.raises(InvalidArgumentError):
        broker.remove_messages(ORDERS, message_ids=[])


def test_move_messages_keeps_them_as_they_were(broker):
    conn = started(broker)
    ids = fill(conn.create_session(), ORDERS, [("a", 7, "eu"), ("b", 4, "us"), ("c", 4, "eu")])
    assert broker.move_messages(ORDERS, PARKED, selector="region = 'eu'") == [ids[0], ids[2]]
    consumer = conn.create_session().create_consumer(PARKED)
    moved = [consumer.receive(timeout=2) for _ in range(2)]
    assert [(m.jms_message_id, m.text, m.jms_priority, m.get_string_property("region")) for m in moved] == [
        (ids[0], "a", 7, "eu"),
        (ids[2], "c", 4, "eu"),
    ]
    assert not moved[0].jms_redelivered
    assert consumption_order(broker, ORDERS) == [ids[1]]


def dead_letter(broker, conn, items):
    """Send *items* to ORDERS and fail each once (max_deliveries=1): they land in DLQ.orders."""
    ids = fill(conn.create_session(), ORDERS, items)
    tx = conn.create_session(transacted=True)
    consumer = tx.create_consumer(ORDERS)
    for _ in ids:
        assert consumer.receive(timeout=2) is not None
        tx.rollback()
    consumer.close()
    return ids


def test_replay_dead_letters_by_selector_and_by_id(make_broker):
    broker = make_broker(max_deliveries=1)
    conn = started(broker)
    ids = dead_letter(broker, conn, [(f"m{i}", 4, "eu" if i % 2 else "us") for i in range(5)])
    assert broker.stats(DLQ).depth == 5
    assert broker.replay_dead_letters(DLQ, selector="region = 'eu'", limit=1) == 1
    assert broker.replay_dead_letter_ids(DLQ, message_ids=[ids[4]]) == [ids[4]]
    assert broker.stats(DLQ).depth == 3
    back = {}
    consumer = conn.create_session().create_consumer(ORDERS)
    while (message := consumer.receive(timeout=0.5)) is not None:
        back[message.jms_message_id] = message
    assert set(back) == {ids[1], ids[4]}
    replayed = back[ids[1]]
    assert not replayed.jms_redelivered and replayed.get_string_property("region") == "eu"
    assert replayed.get_string_property("JMS_DLQ_OriginalDestination") is None  # the dead-letter marks are gone
    assert sorted(m.message_id for m in broker.browse_page(DLQ).messages) == sorted([ids[0], ids[2], ids[3]])


def test_purge_removes_waiting_messages_and_leaves_those_in_flight(broker):
    conn = started(broker)
    ids = fill(conn.create_session(), ORDERS, [(f"m{i}", 4, "eu") for i in range(12)])
    client = conn.create_session(ack_mode=AckMode.CLIENT)
    held = client.create_consumer(ORDERS, prefetch=1).receive(timeout=2)
    assert held.jms_message_id == ids[0]
    assert broker.purge(ORDERS) == 11
    stats = broker.stats(ORDERS)
    assert (stats.depth, stats.in_flight) == (0, 1)
    assert broker.browse_page(ORDERS).messages == []
    held.acknowledge()
    assert broker.purge(Queue("nothing-here")) == 0


def test_stats_say_when_the_oldest_message_came_and_count_redeliveries(make_broker):
    broker = make_broker(max_deliveries=5)
    conn = started(broker)
    before = int(time.time() * 1000)
    fill(conn.create_session(), ORDERS, [("a", 4, "eu"), ("b", 4, "eu")])
    stats = broker.stats(ORDERS)
    assert stats.oldest is not None and before - 5 <= stats.oldest <= int(time.time() * 1000) + 5
    tx = conn.create_session(transacted=True)
    assert tx.create_consumer(ORDERS).receive(timeout=2) is not None
    tx.rollback()
    assert broker.stats(ORDERS).redelivered == 1
    assert broker.stats(Queue("empty")).oldest is None


def test_an_action_by_selector_goes_page_by_page_through_the_whole_queue(broker):
    conn = started(broker)
    session = conn.create_session(transacted=True)  # one commit for the lot
    producer = session.create_producer(ORDERS)
    ids = []
    for i in range(450):
        message = session.create_text_message(f"m{i}")
        message.set_int_property("n", i)
        producer.send(message)
        ids.append(message.jms_message_id)
    session.commit()
    moved = broker.move_messages(ORDERS, PARKED, selector="n < 100 OR n >= 250")  # 300, past several pages
    assert moved == ids[:100] + ids[250:]
    assert broker.remove_messages(ORDERS, selector="n >= 0", limit=120) == ids[100:220]
    assert broker.stats(PARKED).depth == 300 and broker.stats(ORDERS).depth == 30
