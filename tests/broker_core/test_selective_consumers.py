"""Selective consumers: selectors through the broker (properties and
headers), priority with selectors, invalid selectors, and no starvation of a
selective consumer behind a large backlog it does not match."""

from __future__ import annotations

import threading
import time

import pytest

from broker_core import (
    AckMode,
    DeliveryMode,
    InvalidSelectorError,
    JMSError,
    Queue,
    Topic,
)


def send_with(session, destination, specs, **options):
    """Send one text message per ``(text, properties)``; str/float/int/bool
    properties get the matching setter."""
    producer = session.create_producer(destination)
    for spec in specs:
        text, props = spec[0], spec[1]
        extra = spec[2] if len(spec) > 2 else {}
        message = session.create_text_message(text)
        for name, value in props.items():
            if isinstance(value, bool):
                message.set_boolean_property(name, value)
            elif isinstance(value, str):
                message.set_string_property(name, value)
            elif isinstance(value, float):
                message.set_double_property(name, value)
            else:
                message.set_long_property(name, value)
        for header, value in extra.get("headers", {}).items():
            setattr(message, header, value)
        producer.send(message, **{**options, **extra.get("send", {})})


def test_selector_on_properties(session, drain):
    queue = Queue("orders.inbound")
    send_with(
        session,
        queue,
        [
            ("acme-big", {"partner": "acme", "amount": 125.5}),
            ("acme-small", {"partner": "acme", "amount": 50.0}),
            ("globex-big", {"partner": "globex", "amount": 500.0}),
            ("acme-no-amount", {"partner": "acme"}),
            ("acme-big-2", {"partner": "acme", "amount": 101}),
        ],
    )
    consumer = session.create_consumer(queue, selector="partner = 'acme' AND amount > 100")
    assert consumer.message_selector == "partner = 'acme' AND amount > 100"
    assert [m.text for m in drain(consumer)] == ["acme-big", "acme-big-2"]
    rest = drain(session.create_consumer(queue))
    assert [m.text for m in rest] == ["acme-small", "globex-big", "acme-no-amount"]


def test_non_matching_messages_stay_in_order_for_others(session, drain):
    queue = Queue("mixed")
    send_with(session, queue, [(f"m{i}", {"partner": "acme" if i % 3 == 0 else "other"}) for i in range(12)])
    selective = session.create_consumer(queue, selector="partner = 'acme'")
    plain = session.create_consumer(queue)
    got_selective = drain(selective)
    got_plain = drain(plain)
    assert [m.text for m in got_selective] == ["m0", "m3", "m6", "m9"]
    assert [m.text for m in got_plain] == [f"m{i}" for i in range(12) if i % 3]


def test_selective_and_plain_consumers_never_share_a_message(broker, session, run_threads):
    queue = Queue("shared.work")
    send_with(session, queue, [(str(i), {"partner": "acme" if i % 2 else "globex"}) for i in range(100)])
    conns = [broker.connect() for _ in range(3)]
    for c in conns:
        c.start()
    selectors = ["partner = 'acme'", "partner = 'globex'", None]

    def work(i):
        consumer = conns[i].create_session().create_consumer(queue, selector=selectors[i])
        got = []
        while (m := consumer.receive(timeout=0.3)) is not None:
            got.append((m.text, m.get_string_property("partner")))
        return got

    results = run_threads(work, 3)
    everything = [text for got in results for text, _ in got]
    assert sorted(everything, key=int) == [str(i) for i in range(100)]
    assert all(p == "acme" for _, p in results[0])
    assert all(p == "globex" for _, p in results[1])


def test_priority_order_among_matching_messages(session, drain):
    queue = Queue("prio.selective")
    specs = []
    for i, (priority, partner) in enumerate(
        [(1, "acme"), (9, "globex"), (5, "acme"), (9, "acme"), (5, "acme"), (0, "acme"), (7, "globex")]
    ):
        specs.append((f"{partner}-{priority}-{i}", {"partner": partner}, {"send": {"priority": priority}}))
    send_with(session, queue, specs)
    got = drain(session.create_consumer(queue, selector="partner = 'acme'"))
    assert [m.text for m in got] == ["acme-9-3", "acme-5-2", "acme-5-4", "acme-1-0", "acme-0-5"]
    assert [m.text for m in drain(session.create_consumer(queue))] == ["globex-9-1", "globex-7-6"]


def test_selector_on_jms_priority(session, drain):
    queue = Queue("hdr.priority")
    send_with(session, queue, [(f"p{p}", {}, {"send": {"priority": p}}) for p in (2, 6, 4, 9)])
    got = drain(session.create_consumer(queue, selector="JMSPriority > 5"))
    assert [m.text for m in got] == ["p9", "p6"]


def test_selector_on_jms_type_and_correlation_id(session, drain):
    queue = Queue("hdr.type")
    send_with(
        session,
        queue,
        [
            ("order-1", {}, {"headers": {"jms_type": "order", "jms_correlation_id": "PO-1"}}),
            ("invoice-1", {}, {"headers": {"jms_type": "invoice", "jms_correlation_id": "PO-1"}}),
            ("order-2", {}, {"headers": {"jms_type": "order", "jms_correlation_id": "PO-2"}}),
            ("untyped", {}),
        ],
    )
    by_type = drain(session.create_consumer(queue, selector="JMSType = 'order'"))
    assert [m.text for m in by_type] == ["order-1", "order-2"]
    by_correlation = drain(session.create_consumer(queue, selector="JMSCorrelationID = 'PO-1'"))
    assert [m.text for m in by_correlation] == ["invoice-1"]
    assert [m.text for m in drain(session.create_consumer(queue))] == ["untyped"]


def test_selector_on_jms_delivery_mode(session, drain):
    queue = Queue("hdr.mode")
    send_with(
        session,
        queue,
        [
            ("persistent", {}),
            ("transient", {}, {"send": {"delivery_mode": DeliveryMode.NON_PERSISTENT}}),
        ],
    )
    got = drain(session.create_consumer(queue, selector="JMSDeliveryMode = 'NON_PERSISTENT'"))
    assert [m.text for m in got] == ["transient"]


def test_headers_and_properties_combined(session, drain):
    queue = Queue("hdr.combined")
    send_with(
        session,
        queue,
        [
            ("yes", {"partner": "acme"}, {"headers": {"jms_type": "order"}, "send": {"priority": 8}}),
            ("low", {"partner": "acme"}, {"headers": {"jms_type": "order"}, "send": {"priority": 2}}),
            ("other", {"partner": "globex"}, {"headers": {"jms_type": "order"}, "send": {"priority": 8}}),
        ],
    )
    got = drain(session.create_consumer(queue, selector="partner = 'acme' AND JMSType = 'order' AND JMSPriority >= 5"))
    assert [m.text for m in got] == ["yes"]


def test_empty_selector_means_every_message(session, send, drain):
    queue = Queue("empty.selector")
    send(queue, "a", "b")
    assert [m.text for m in drain(session.create_consumer(queue, selector=""))] == ["a", "b"]


def test_a_waiting_selective_consumer_ignores_non_matching_arrivals(broker, session, drain):
    queue = Queue("wait.selective")
    consumer = session.create_consumer(queue, selector="partner = 'acme'")
    other = broker.connect().create_session()
    got = []
    t = threading.Thread(target=lambda: got.append(consumer.receive(timeout=10)))
    t.start()
    time.sleep(0.1)
    send_with(other, queue, [("no", {"partner": "globex"})])
    time.sleep(0.1)
    assert got == []
    send_with(other, queue, [("yes", {"partner": "acme"})])
    t.join(10)
    assert not t.is_alive()
    assert got[0] is not None and got[0].text == "yes"
    assert [m.text for m in drain(session.create_consumer(queue))] == ["no"]


def test_recovered_messages_come_back_to_a_selective_consumer(conn, session, drain):
    queue = Queue("recover.selective")
    send_with(session, queue, [("a", {"partner": "acme"}), ("g", {"partner": "globex"}), ("b", {"partner": "acme"})])
    client = conn.create_session(ack_mode=AckMode.CLIENT)
    consumer = client.create_consumer(queue, selector="partner = 'acme'")
    assert [m.text for m in drain(consumer)] == ["a", "b"]
    client.recover()
    again = drain(consumer)
    assert [m.text for m in again] == ["a", "b"]
    assert all(m.jms_redelivered for m in again)
    again[-1].acknowledge()
    assert [m.text for m in drain(session.create_consumer(queue))] == ["g"]


@pytest.mark.parametrize(
    "selector", ["partner = ", "partner = 'acme' AND", "((a = 1)", "a === 1", "= 5", "'unterminated"]
)
def test_invalid_selector_raises_at_create_consumer(session, selector):
    with pytest.raises(JMSError) as info:
        session.create_consumer(Queue("bad.selector"), selector=selector)
    assert isinstance(info.value, InvalidSelectorError)
    assert isinstance(info.value, ValueError)


def test_invalid_selector_raises_for_topics_browsers_and_durables(broker, session):
    with pytest.raises(InvalidSelectorError):
        session.create_consumer(Topic("t"), selector="a = ")
    with pytest.raises(InvalidSelectorError):
        session.create_browser(Queue("q"), selector="a = ")
    durable = broker.connect(client_id="sel-client").create_session()
    with pytest.raises(InvalidSelectorError):
        durable.create_durable_subscriber(Topic("t"), "sub", selector="a = ")


def test_an_invalid_selector_leaves_the_session_usable(session, send, drain):
    queue = Queue("after.invalid")
    with pytest.raises(InvalidSelectorError):
        session.create_consumer(queue, selector="((")
    send(queue, "still works")
    assert [m.text for m in drain(session.create_consumer(queue))] == ["still works"]


def test_selective_consumer_does_not_starve(broker):
    """20,000 queued persistent messages, 10% of them for acme: a selective
    consumer gets every acme message, in order, well within 30 s, and the
    18,000 others stay queued."""
    queue = Queue("backlog")
    conn = broker.connect()
    loader = conn.create_session(transacted=True)
    producer = loader.create_producer(queue)
    total, batch = 20_000, 1_000
    for i in range(total):
        message = loader.create_text_message(str(i))
        message.set_string_property("partner", "acme" if i % 10 == 7 else f"other{i % 10}")
        message.set_int_property("seq", i)
        producer.send(message)  # default: PERSISTENT
        if (i + 1) % batch == 0:
            loader.commit()
    assert broker.stats(queue).depth == total

    conn.start()
    consumer = conn.create_session().create_consumer(queue, selector="partner = 'acme'")
    expected = [i for i in range(total) if i % 10 == 7]
    got = []
    start = time.monotonic()
    while len(got) < len(expected) and time.monotonic() - start < 30:
        message = consumer.receive(timeout=2)
        if message is None:
            break
        got.append(message.get_int_property("seq"))
    elapsed = time.monotonic() - start
    assert got == expected, f"received {len(got)} of {len(expected)} matching messages (in order?)"
    assert elapsed < 30
    assert consumer.receive_no_wait() is None
    # AUTO_ACKNOWLEDGE acknowledges without waiting for the store: the last ones commit a moment later
    deadline = time.monotonic() + 5
    while broker.stats(queue).depth != total - len(expected) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert broker.stats(queue).depth == total - len(expected)
    first_other = conn.create_session().create_consumer(queue).receive(timeout=2)
    assert first_other.get_int_property("seq") == 0


def test_a_waiting_selective_consumer_gets_only_its_matches_of_a_batch(broker, conn, drain):
    queue = Queue("selective.waiting")
    waiting = conn.create_session().create_consumer(queue, selector="kind = 'order'")
    got = []

    def receive_three():
        for _ in range(3):
            got.append(waiting.receive(timeout=10))

    thread = threading.Thread(target=receive_three)
    thread.start()
    time.sleep(0.2)  # blocked on an empty queue
    sender = broker.connect().create_session(transacted=True)
    producer = sender.create_producer(queue)
    for i, kind in enumerate(["order", "invoice", "order", "invoice", "order"]):
        message = sender.create_text_message(f"{kind}-{i}")
        message.set_string_property("kind", kind)
        producer.send(message)
    sender.commit()  # one commit while the consumer waits
    thread.join(10)
    assert [m.text for m in got if m is not None] == ["order-0", "order-2", "order-4"]
    other = broker.connect()
    other.start()
    rest = drain(other.create_session().create_consumer(queue), timeout=0.5)
    assert [m.text for m in rest] == ["invoice-1", "invoice-3"]
    assert not any(m.jms_redelivered for m in rest)


def test_selective_consumers_with_prefetch_one_compete_without_losing_a_match(session, drain):
    """Two selective consumers (prefetch 1) and a plain one take turns on one queue: whatever one of
    them took, the others skip, and every message reaches exactly one of them, the matching ones in
    order for each selective consumer."""
    queue = Queue("selective.compete")
    send_with(session, queue, [(f"m{i}", {"kind": "a" if i % 4 else "b"}) for i in range(24)])
    first = session.create_consumer(queue, "kind = 'a'", prefetch=1)
    second = session.create_consumer(queue, "kind = 'a'", prefetch=1)
    plain = session.create_consumer(queue, prefetch=1)
    got: dict[str, list[int]] = {"first": [], "second": [], "plain": []}
    for turn in range(40):
        for name, consumer in (("first", first), ("second", second), ("plain", plain)):
            if name == "plain" and turn % 3:  # the plain consumer takes less often
                continue
            message = consumer.receive_no_wait()
            if message is not None:
                got[name].append(int(message.text[1:]))
    everything = sorted(got["first"] + got["second"] + got["plain"])
    assert everything == list(range(24)), got
    for name in ("first", "second"):
        assert got[name] == sorted(got[name]) and all(i % 4 for i in got[name]), got


def test_an_expired_candidate_does_not_hide_the_matches_behind_it(session, drain):
    """A selective consumer (prefetch 1) whose next match expired after it saw it, before it claimed
    it, gets the matches behind it, not nothing."""
    queue = Queue("selective.expired")
    producer = session.create_producer(queue)
    for i, (priority, ttl) in enumerate([(9, 0), (4, 200), (4, 0), (4, 0), (4, 0), (4, 0)]):
        message = session.create_text_message(f"m{i}")
        message.set_string_property("kind", "a")
        producer.send(message, priority=priority, time_to_live=ttl)
    consumer = session.create_consumer(queue, "kind = 'a'", prefetch=1)
    assert consumer.receive_no_wait().text == "m0"  # it has seen m1 .. m5 now
    time.sleep(0.4)  # m1 has expired, unclaimed
    assert [m.text for m in drain(consumer)] == ["m2", "m3", "m4", "m5"]
