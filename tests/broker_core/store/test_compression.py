"""Large bodies are stored LZ4-compressed (``compress_over``, see
``broker_core._sql._codec``). Whatever the store does with the bytes, every
message must read back exactly as sent, by another process (which reads the
row, not the envelope this one kept), by browsers and by selectors that look
into the body; rows stored either way must read side by side; small and
incompressible bodies are stored as they are."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker_core import AckMode, Broker, InvalidArgumentError, Queue
from broker_core._sql import _codec
from broker_core.sql import make_engine

# a large XML document: repetitive, as business documents are (~20 KB)
LINE = "<line no='{n}'><item>Widget {n}</item><qty unit='EA'>{n}</qty><note>façade — ünïcode 😀</note></line>"
BIG_XML = "<order xmlns='urn:o'>" + "".join(LINE.format(n=n) for n in range(150)) + "</order>"
BIG_TEXT = "the quick brown fox jumps over the lazy dog; " * 500
BIG_BYTES = bytes(range(256)) * 64
BIG_MAP = {f"key{n}": f"value number {n} of the map" for n in range(300)}
BIG_STREAM = [f"item {n}" for n in range(400)] + [7, 2.5, True, b"\x00\x01" * 500]
BIG_OBJECT = {"lines": [{"n": n, "item": f"Widget {n}"} for n in range(300)]}


@pytest.fixture(params=["sqlite", "postgres"])
def sql_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'compress.db'}"
    return request.getfixturevalue("postgres_schema")


def _send_every_kind(broker: Broker, queue: Queue) -> None:
    with broker.connect() as conn:
        session = conn.create_session()
        producer = session.create_producer(queue)
        producer.send(session.create_xml_message(BIG_XML))
        producer.send(session.create_text_message(BIG_TEXT))
        producer.send(session.create_bytes_message(BIG_BYTES))
        producer.send(session.create_map_message(BIG_MAP))
        stream = session.create_stream_message()
        for value in BIG_STREAM:
            stream.write_object(value)
        producer.send(stream)
        producer.send(session.create_object_message(BIG_OBJECT))


def _body(message) -> object:
    kind = type(message).__name__
    if kind in ("XMLMessage", "TextMessage"):
        return message.text
    if kind == "BytesMessage":
        return message.read_bytes()
    if kind == "MapMessage":
        return {name: message.get_object(name) for name in message.map_names()}
    if kind == "StreamMessage":
        return [message.read_object() for _ in BIG_STREAM]
    return message.object


EXPECTED = [
    ("XMLMessage", BIG_XML),
    ("TextMessage", BIG_TEXT),
    ("BytesMessage", BIG_BYTES),
    ("MapMessage", BIG_MAP),
    ("StreamMessage", BIG_STREAM),
    ("ObjectMessage", BIG_OBJECT),
]


def _stored(url: str) -> list[tuple[str, int]]:
    """(kind column, stored body length) of every message row, in order."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return [
                (kind, len(body))
                for kind, body in conn.exec_driver_sql("SELECT kind, body FROM b2b_messages ORDER BY id")
            ]
    finally:
        engine.dispose()


def _receive_all(broker: Broker, queue: Queue, count: int) -> list:
    with broker.connect() as conn:
        conn.start()
        consumer = conn.create_session(ack_mode=AckMode.AUTO).create_consumer(queue)
        got = [consumer.receive(timeout=10) for _ in range(count)]
        assert consumer.receive_no_wait() is None
    return got


def test_large_bodies_of_every_kind_are_stored_compressed_and_read_back_exactly(sql_url):
    queue = Queue("compress.kinds")
    with Broker.open(sql_url, sweep_interval=0) as sender, Broker.open(sql_url, sweep_interval=0) as other:
        _send_every_kind(sender, queue)
        stored = _stored(sql_url)
        assert [kind for kind, _ in stored] == [k + "+lz4" for k in ("xml", "text", "bytes", "map", "stream", "object")]
        assert stored[0][1] < len(BIG_XML.encode()) // 3  # XML shrinks 3-4 times
        assert stored[1][1] < len(BIG_TEXT) // 10
        with other.connect() as conn:  # a browser of another process reads the rows
            browsed = list(conn.create_session().create_browser(queue))
        assert [(type(m).__name__, _body(m)) for m in browsed] == EXPECTED
        got = _receive_all(other, queue, len(EXPECTED))
        assert [(type(m).__name__, _body(m)) for m in got] == EXPECTED


def test_small_and_incompressible_bodies_are_stored_as_they_are(sql_url):
    queue = Queue("compress.raw")
    noise = os.urandom(50_000)
    with Broker.open(sql_url, sweep_interval=0) as sender, Broker.open(sql_url, sweep_interval=0) as other:
        with sender.connect() as conn:
            session = conn.create_session()
            producer = session.create_producer(queue)
            producer.send(session.create_text_message("x" * (_codec.COMPRESS_OVER - 1)))  # under the threshold
            producer.send(session.create_bytes_message(noise))  # random: compression would not pay
        assert _stored(sql_url) == [("text", _codec.COMPRESS_OVER - 1), ("bytes", len(noise))]
        first, second = _receive_all(other, queue, 2)
        assert first.text == "x" * (_codec.COMPRESS_OVER - 1)
        assert second.read_bytes() == noise


def test_compression_off_and_on_rows_read_side_by_side(sql_url):
    """compress_over=0 stores everything raw (as brokers before compression did); a broker that compresses
    reads those rows and its own alike."""
    queue = Queue("compress.mixed")
    with Broker.open(sql_url, sweep_interval=0, compress_over=0) as raw:
        with raw.connect() as conn:
            session = conn.create_session()
            session.create_producer(queue).send(session.create_xml_message(BIG_XML))
    with Broker.open(sql_url, sweep_interval=0) as compressing, Broker.open(sql_url, sweep_interval=0) as other:
        with compressing.connect() as conn:
            session = conn.create_session()
            session.create_producer(queue).send(session.create_xml_message(BIG_XML.replace("Widget", "Gadget")))
        assert [kind for kind, _ in _stored(sql_url)] == ["xml", "xml+lz4"]
        got = _receive_all(other, queue, 2)
        assert [m.text for m in got] == [BIG_XML, BIG_XML.replace("Widget", "Gadget")]


def test_selectors_see_into_compressed_bodies(sql_url):
    """An XPath selector evaluated on rows another process stored (the consumer reads them from the
    database) sees the decompressed document."""
    queue = Queue("compress.selector")
    with Broker.open(sql_url, sweep_interval=0) as sender, Broker.open(sql_url, sweep_interval=0) as other:
        with sender.connect() as conn:
            session = conn.create_session()
            producer = session.create_producer(queue)
            producer.send(session.create_xml_message(BIG_XML))
            producer.send(session.create_xml_message(BIG_XML.replace("Widget 7<", "Sprocket 7<")))
        with other.connect() as conn:
            conn.start()
            consumer = conn.create_session().create_consumer(
                queue, 'XPATH \'//*[local-name()="item" and . = "Sprocket 7"]\''
            )
            got = consumer.receive(timeout=10)
            assert got is not None and "Sprocket 7<" in got.text
            assert consumer.receive(timeout=0.3) is None


@pytest.mark.parametrize("bad", [-1, 1.5, "2k", None])
def test_compress_over_must_be_a_whole_number_of_bytes(tmp_path, bad):
    with pytest.raises(InvalidArgumentError, match="compress_over"):
        Broker.open(f"sqlite:///{tmp_path / 'bad.db'}", compress_over=bad)


KINDS_AND_BODIES = st.one_of(
    st.tuples(st.sampled_from(["text", "xml"]), st.text(max_size=5000)),
    st.tuples(st.sampled_from(["bytes", "object"]), st.binary(max_size=5000)),
    st.tuples(st.just("bytes"), st.text(alphabet="ab<>", max_size=6000).map(str.encode)),  # compressible
)


@settings(max_examples=300, deadline=None)
@given(KINDS_AND_BODIES, st.integers(min_value=0, max_value=3000))
def test_any_body_reads_back_from_its_stored_columns(kind_body, compress_over):
    kind, body = kind_body
    stored_kind, data = _codec.stored_body(kind, body, compress_over)
    assert stored_kind in (kind, kind + _codec.COMPRESSED)
    if stored_kind != kind:  # compressed only when asked for and when it saves an eighth
        raw = _codec.encode_body(kind, body)
        assert compress_over and len(raw) >= compress_over and len(data) <= len(raw) * 7 // 8 + 1
    assert _codec.read_body(stored_kind, data) == (kind, body)


def test_an_xml_message_made_from_its_bytes_is_stored_as_those_bytes(sql_url, monkeypatch):
    """``XMLMessage(text, utf8=...)`` (the gateway's documents as received): the store writes the bytes it
    was given rather than encoding the text again, and every reader gets the text all the same, a selector
    looking into the body too."""
    from broker_core import XMLMessage

    encodings = []
    real_encode = _codec.encode_body
    monkeypatch.setattr(_codec, "encode_body", lambda kind, body: encodings.append(kind) or real_encode(kind, body))
    queue = Queue("compress.utf8")
    data = BIG_XML.encode("utf-8")
    with Broker.open(sql_url, sweep_interval=0) as sender, Broker.open(sql_url, sweep_interval=0) as other:
        with sender.connect() as conn:
            session = conn.create_session()
            producer = session.create_producer(queue)
            producer.send(XMLMessage(BIG_XML, utf8=data))
            changed = XMLMessage("<stale/>", utf8=b"<stale/>")
            changed.text = BIG_XML.replace("Widget", "Gadget")  # the bytes given before are dropped
            producer.send(changed)
        assert encodings == ["xml"]  # the second message's only
        engine = make_engine(sql_url)
        try:
            with engine.connect() as c:
                rows = [
                    _codec.read_body(kind, body)
                    for kind, body in c.exec_driver_sql("SELECT kind, body FROM b2b_messages ORDER BY id")
                ]
        finally:
            engine.dispose()
        assert rows == [("xml", BIG_XML), ("xml", BIG_XML.replace("Widget", "Gadget"))]
        with other.connect() as conn:
            conn.start()
            picky = conn.create_session().create_consumer(
                queue, 'XPATH \'//*[local-name()="item" and . = "Gadget 3"]\''
            )
            assert picky.receive(timeout=10).text == BIG_XML.replace("Widget", "Gadget")
        assert [m.text for m in _receive_all(other, queue, 1)] == [BIG_XML]
