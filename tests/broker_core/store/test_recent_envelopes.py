"""A claim of a message this process stored lately, for a destination it has
a consumer of, reuses the envelope it stored instead of reading the row back.
What the consumer gets must be the same either way, the shortcut must really
skip the read, and the envelopes kept must stay bounded, be dropped once
acknowledged, and not be kept at all for destinations no consumer of this
process reads."""

from __future__ import annotations

from broker_core import AckMode, Broker, Queue, Topic
from broker_core._sql import _store


def _send_all(broker: Broker, queue: Queue, tag: str) -> None:
    with broker.connect() as conn:
        session = conn.create_session()
        producer = session.create_producer(queue)
        message = session.create_text_message(f"<doc tag='{tag}'>é ü 😀</doc>")
        message.jms_correlation_id = f"corr-{tag}"
        message.jms_type = "Order"
        message.set_string_property("partner", "acme")
        message.set_int_property("lines", 7)
        message.set_long_property("big", 2**40)
        message.set_double_property("amount", 125.5)
        message.set_boolean_property("urgent", True)
        message.set_byte_property("b", -3)
        producer.send(message, priority=7, time_to_live=600_000)
        producer.send(session.create_bytes_message(b"\x00\x01" + tag.encode()), priority=2)
        producer.send(session.create_map_message({"tag": tag, "n": 3, "f": 1.5}))


def _observed(message) -> tuple:
    body = message.text if hasattr(message, "text") else None
    if body is None:
        body = getattr(message, "body", None)
    props = {name: message.get_object_property(name) for name in message.property_names()}
    return (
        type(message).__name__,
        body,
        message.jms_correlation_id,
        message.jms_type,
        message.jms_priority,
        message.jms_expiration > 0,
        message.jms_redelivered,
        props,
    )


def test_claims_of_own_and_foreign_messages_look_the_same(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    queue = Queue("recent.same")
    reads = []
    real_by_ids = _store._Statements.by_ids

    def counting(self, conn, name, ids, *more, **kw):
        if name == "messages":
            reads.append(len(ids))
        return real_by_ids(self, conn, name, ids, *more, **kw)

    monkeypatch.setattr(_store._Statements, "by_ids", counting)
    with Broker.open(url, sweep_interval=0) as mine, Broker.open(url, sweep_interval=0) as other:
        with mine.connect() as conn:
            consumer = conn.create_session(ack_mode=AckMode.CLIENT).create_consumer(queue)
            _send_all(mine, queue, "x")  # stored by this process, which has a consumer of the queue: kept
            conn.start()
            own = [consumer.receive(timeout=5) for _ in range(3)]
            assert reads == []  # taken as stored: no row read back
            _send_all(other, queue, "x")  # another process's messages: read back from the database
            foreign = [consumer.receive(timeout=5) for _ in range(3)]
            assert sum(reads) == 3
            assert [_observed(m) for m in own] == [_observed(m) for m in foreign]
            assert [m.jms_priority for m in own] == [7, 4, 2]
            own[-1].acknowledge()
            foreign[-1].acknowledge()


def test_a_redelivered_message_keeps_its_content_and_says_so(tmp_path):
    queue = Queue("recent.redelivered")
    with Broker.open(f"sqlite:///{tmp_path / 'r.db'}", sweep_interval=0) as broker:
        _send_all(broker, queue, "r")
        with broker.connect() as conn:
            conn.start()
            session = conn.create_session(ack_mode=AckMode.CLIENT)
            consumer = session.create_consumer(queue)
            first = [consumer.receive(timeout=5) for _ in range(3)]
            session.recover()
            again = [consumer.receive(timeout=5) for _ in range(3)]
            assert [m.jms_message_id for m in again] == [m.jms_message_id for m in first]
            assert all(m.jms_redelivered and m.get_int_property("JMSXDeliveryCount") == 2 for m in again)
            assert [_observed(m)[:5] for m in again] == [_observed(m)[:5] for m in first]
            again[-1].acknowledge()


def test_the_envelopes_kept_are_bounded_and_dropped_once_acknowledged(tmp_path, monkeypatch):
    monkeypatch.setattr(_store.SQLStore, "_RECENT_COUNT", 10)
    queue = Queue("recent.bounded")
    with Broker.open(f"sqlite:///{tmp_path / 'r.db'}", sweep_interval=0) as broker:
        store = broker.store
        with broker.connect() as conn:
            consumer = conn.create_session(ack_mode=AckMode.CLIENT).create_consumer(queue)
            session = conn.create_session()
            producer = session.create_producer(queue)
            for i in range(50):
                producer.send(session.create_text_message(f"m{i}"))
            assert len(store._recent) == 10
            assert store._recent_bytes == sum(len(env.body) for env in store._recent.values())
            conn.start()
            got = [consumer.receive(timeout=5) for _ in range(50)]
            assert [m.text for m in got] == [f"m{i}" for i in range(50)]  # evicted ones read back, in order
            got[-1].acknowledge()
            assert consumer.receive_no_wait() is None
        assert len(store._recent) == 0 and store._recent_bytes == 0


def test_the_bytes_an_xml_message_came_with_count_in_the_bound(tmp_path):
    from broker_core import XMLMessage

    queue = Queue("recent.utf8")
    text = "<doc>é ü</doc>"
    with Broker.open(f"sqlite:///{tmp_path / 'r.db'}", sweep_interval=0) as broker:
        with broker.connect() as conn:
            session = conn.create_session()
            session.create_consumer(queue)
            session.create_producer(queue).send(XMLMessage(text, utf8=text.encode("utf-8")))
            assert broker.store._recent_bytes == len(text) + len(text.encode("utf-8"))


def test_a_document_an_xpath_selector_parsed_is_not_kept(tmp_path):
    """Its parsed tree would stay in memory with it, unaccounted for."""
    topic = Topic("recent.xpath")
    with Broker.open(f"sqlite:///{tmp_path / 'r.db'}", sweep_interval=0) as broker:
        with broker.connect(client_id="xp") as conn:
            session = conn.create_session(ack_mode=AckMode.CLIENT)
            subscriber = session.create_durable_subscriber(topic, "orders", selector="XPATH '/Order[@total > 100]'")
            plain = session.create_consumer(Queue("recent.plain"))
            producer = session.create_producer(topic)
            producer.send(session.create_xml_message("<Order total='250'/>"))
            session.create_producer(Queue("recent.plain")).send(session.create_xml_message("<Order total='5'/>"))
            assert [env.destination for env in broker.store._recent.values()] == [Queue("recent.plain")]
            conn.start()
            assert plain.receive(timeout=5) is not None
            message = subscriber.receive(timeout=5)
            assert message is not None and "250" in message.text
            message.acknowledge()


def test_nothing_is_kept_for_a_destination_no_consumer_of_this_process_reads(tmp_path):
    """A gateway's one-way queue drained by workers elsewhere would otherwise hold tens of megabytes of
    documents nobody here takes. The consumer that comes later gets them all the same, read back."""
    queue, watched = Queue("recent.unread"), Queue("recent.watched")
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with Broker.open(url, sweep_interval=0) as broker, Broker.open(url, sweep_interval=0) as other:
        store = broker.store
        with broker.connect() as conn, other.connect() as elsewhere:
            elsewhere.create_session().create_consumer(queue)  # a consumer, but in another process
            session = conn.create_session()
            session.create_consumer(watched)  # a consumer of another destination here
            producer = session.create_producer(queue)
            for i in range(20):
                producer.send(session.create_text_message(f"m{i}"))
            session.create_producer(Topic("recent.nobody")).send(session.create_text_message("lost to no one"))
            assert len(store._recent) == 0 and store._recent_bytes == 0
            session.create_producer(watched).send(session.create_text_message("w"))
            assert [env.destination for env in store._recent.values()] == [watched]
            conn.start()
            late = conn.create_session(ack_mode=AckMode.CLIENT).create_consumer(queue)
            got = [late.receive(timeout=5) for _ in range(20)]
            assert [m.text for m in got] == [f"m{i}" for i in range(20)]
            got[-1].acknowledge()
