"""Topics: a copy per active subscriber, non-durable subscribers miss what is
published while they are away, no_local, subscriber selectors."""

from __future__ import annotations

from broker_core import AckMode, Topic


def test_every_active_subscriber_gets_its_own_copy(broker, session, drain):
    topic = Topic("prices")
    conns = [broker.connect() for _ in range(2)]
    for c in conns:
        c.start()
    subscribers = [session.create_consumer(topic)] + [c.create_session().create_consumer(topic) for c in conns]
    subscribers.append(conns[0].create_session().create_consumer(topic))  # two on one connection
    producer = session.create_producer(topic)
    for i in range(5):
        producer.send(session.create_text_message(f"p{i}"))
    for subscriber in subscribers:
        assert [m.text for m in drain(subscriber)] == [f"p{i}" for i in range(5)]


def test_subscribers_get_copies_in_priority_order(session, drain):
    topic = Topic("prio.topic")
    subscriber = session.create_consumer(topic)
    producer = session.create_producer(topic)
    for priority, text in [(2, "low"), (8, "high"), (4, "mid")]:
        producer.send(session.create_text_message(text), priority=priority)
    assert [m.text for m in drain(subscriber)] == ["high", "mid", "low"]


def test_non_durable_subscribers_miss_what_is_published_while_away(session, send, drain):
    topic = Topic("news")
    send(topic, "before anyone listens")
    subscriber = session.create_consumer(topic)
    send(topic, "while subscribed")
    assert [m.text for m in drain(subscriber)] == ["while subscribed"]
    subscriber.close()
    send(topic, "while away")
    again = session.create_consumer(topic)
    send(topic, "back again")
    assert [m.text for m in drain(again)] == ["back again"]


def test_unacknowledged_subscription_copies_are_independent(conn, send, drain):
    topic = Topic("independent")
    client = conn.create_session(ack_mode=AckMode.CLIENT)
    auto = conn.create_session()
    held = client.create_consumer(topic)
    free = auto.create_consumer(topic)
    send(topic, "x")
    assert held.receive(timeout=2).text == "x"
    assert [m.text for m in drain(free)] == ["x"]
    client.recover()
    again = held.receive(timeout=2)
    assert again.text == "x" and again.jms_redelivered
    assert free.receive(timeout=0.2) is None


def test_no_local_skips_own_connections_messages_only(broker, drain):
    topic = Topic("chat")
    a = broker.connect()
    b = broker.connect()
    a.start()
    b.start()
    a_session = a.create_session()
    b_session = b.create_session()
    a_no_local = a_session.create_consumer(topic, no_local=True)
    a_plain = a.create_session().create_consumer(topic)
    b_no_local = b_session.create_consumer(topic, no_local=True)
    a_session.create_producer(topic).send(a_session.create_text_message("from a"))
    b_session.create_producer(topic).send(b_session.create_text_message("from b"))
    assert [m.text for m in drain(a_no_local)] == ["from b"]
    assert [m.text for m in drain(b_no_local)] == ["from a"]
    assert [m.text for m in drain(a_plain)] == ["from a", "from b"]
    assert a_no_local.no_local is True


def test_no_local_with_client_ids(broker, drain):
    topic = Topic("chat.ids")
    a = broker.connect(client_id="client-a")
    b = broker.connect(client_id="client-b")
    a.start()
    b.start()
    a_session = a.create_session()
    b_session = b.create_session()
    subscriber = a_session.create_consumer(topic, no_local=True)
    a_session.create_producer(topic).send(a_session.create_text_message("mine"))
    a.create_session().create_producer(topic).send(a_session.create_text_message("mine too (other session)"))
    b_session.create_producer(topic).send(b_session.create_text_message("theirs"))
    assert [m.text for m in drain(subscriber)] == ["theirs"]


def test_subscriber_selector_filters_its_copies(session, drain):
    topic = Topic("quotes")
    acme_only = session.create_consumer(topic, selector="partner = 'acme'")
    everyone = session.create_consumer(topic)
    producer = session.create_producer(topic)
    for partner in ["acme", "globex", "acme", "initech"]:
        message = session.create_text_message(partner)
        message.set_string_property("partner", partner)
        producer.send(message)
    assert [m.text for m in drain(acme_only)] == ["acme", "acme"]
    assert [m.text for m in drain(everyone)] == ["acme", "globex", "acme", "initech"]
    assert acme_only.message_selector == "partner = 'acme'"


def test_topics_and_queues_of_one_name_are_separate(session, send, drain):
    from broker_core import Queue

    subscriber = session.create_consumer(Topic("same"))
    send(Queue("same"), "to the queue")
    send(Topic("same"), "to the topic")
    assert [m.text for m in drain(subscriber)] == ["to the topic"]
    assert [m.text for m in drain(session.create_consumer(Queue("same")))] == ["to the queue"]


def test_closing_a_subscription_with_unacknowledged_copies_drops_them(conn, send, drain):
    topic = Topic("dropped")
    client = conn.create_session(ack_mode=AckMode.CLIENT)
    subscriber = client.create_consumer(topic)
    send(topic, "m")
    assert subscriber.receive(timeout=2).text == "m"
    subscriber.close()
    client.close()  # a non-durable subscription is gone: nothing to redeliver it to
    fresh = conn.create_session().create_consumer(topic)
    assert drain(fresh) == []
