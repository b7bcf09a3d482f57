"""Messages: headers, typed properties (JMS 1.1 conversion table), the body
types, read-only received messages, and isolation of what was sent."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree

from broker_core import (
    Byte,
    BytesMessage,
    DeliveryMode,
    Float,
    Int,
    InvalidPropertyError,
    JMSError,
    MapMessage,
    Message,
    MessageEOFError,
    MessageFormatError,
    MessageNotReadableError,
    MessageNotWriteableError,
    ObjectMessage,
    Queue,
    Short,
    StreamMessage,
    TextMessage,
    XMLMessage,
)

FIXTURE_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def roundtrip(session, message, destination=Queue("roundtrip"), **options):
    """Send ``message`` and receive it back (the queue must be empty)."""
    producer = session.create_producer(destination)
    consumer = session.create_consumer(destination)
    try:
        producer.send(message, **options)
        received = consumer.receive(timeout=2)
        assert received is not None, "the sent message did not arrive"
        return received
    finally:
        consumer.close()
        producer.close()


# ---------------------------------------------------------------- headers


def test_send_sets_headers_and_receiver_sees_them(session):
    queue = Queue("orders.inbound")
    reply_queue = Queue("orders.replies")
    message = session.create_xml_message("<Order/>")
    message.jms_correlation_id = "PO-1001"
    message.jms_reply_to = reply_queue
    message.jms_type = "order"
    before = int(time.time() * 1000)
    received = roundtrip(
        session, message, queue, delivery_mode=DeliveryMode.PERSISTENT, priority=7, time_to_live=60_000
    )
    after = int(time.time() * 1000)

    assert message.jms_message_id.startswith("ID:")
    assert message.jms_destination == queue
    assert message.jms_priority == 7
    assert message.jms_delivery_mode == DeliveryMode.PERSISTENT
    assert before - 5 <= message.jms_timestamp <= after + 5
    assert message.jms_expiration == message.jms_timestamp + 60_000

    assert isinstance(received, XMLMessage)
    assert received.jms_message_id == message.jms_message_id
    assert received.jms_destination == queue
    assert received.jms_delivery_mode == DeliveryMode.PERSISTENT
    assert received.jms_priority == 7
    assert received.jms_timestamp == message.jms_timestamp
    assert received.jms_expiration == message.jms_expiration
    assert received.jms_correlation_id == "PO-1001"
    assert received.jms_reply_to == reply_queue
    assert received.jms_type == "order"
    assert received.jms_redelivered is False
    assert received.get_int_property("JMSXDeliveryCount") == 1


def test_default_headers(session):
    received = roundtrip(session, session.create_message())
    assert received.jms_priority == 4
    assert received.jms_delivery_mode == DeliveryMode.PERSISTENT
    assert received.jms_expiration == 0
    assert received.jms_correlation_id is None
    assert received.jms_reply_to is None
    assert received.jms_type is None


def test_non_persistent_delivery_mode_travels(session):
    received = roundtrip(session, session.create_text_message("x"), delivery_mode=DeliveryMode.NON_PERSISTENT)
    assert received.jms_delivery_mode == DeliveryMode.NON_PERSISTENT


def test_message_ids_are_unique(session):
    producer = session.create_producer(Queue("ids"))
    ids = []
    for _ in range(50):
        message = session.create_message()
        producer.send(message)
        ids.append(message.jms_message_id)
    assert len(set(ids)) == 50
    assert all(i.startswith("ID:") for i in ids)


def test_resending_the_same_object_sends_two_messages(session, drain):
    producer = session.create_producer(Queue("twice"))
    message = session.create_text_message("a")
    producer.send(message)
    first_id = message.jms_message_id
    message.text = "b"
    producer.send(message)
    assert message.jms_message_id != first_id
    received = drain(session.create_consumer(Queue("twice")))
    assert [(m.jms_message_id, m.text) for m in received] == [(first_id, "a"), (message.jms_message_id, "b")]


def test_a_received_message_can_be_forwarded(session, drain):
    session.create_producer(Queue("in")).send(session.create_text_message("fwd"))
    received = session.create_consumer(Queue("in")).receive(timeout=2)
    session.create_producer(Queue("out")).send(received)
    forwarded = drain(session.create_consumer(Queue("out")))
    assert [m.text for m in forwarded] == ["fwd"]


def test_user_is_stamped_as_jmsxuserid_and_forwarding_still_works(broker):
    conn = broker.connect(user="alice")
    conn.start()
    session = conn.create_session()
    session.create_producer(Queue("in")).send(session.create_text_message("x"))
    received = session.create_consumer(Queue("in")).receive(timeout=2)
    assert received.get_string_property("JMSXUserID") == "alice"
    # forwarding a (read-only) received message must not fail on the stamp
    session.create_producer(Queue("out")).send(received)
    forwarded = session.create_consumer(Queue("out")).receive(timeout=2)
    assert forwarded.text == "x"
    assert forwarded.get_string_property("JMSXUserID") == "alice"


# ---------------------------------------------------------------- property conversion table

SETTERS = {
    "boolean": ("set_boolean_property", True),
    "byte": ("set_byte_property", 7),
    "short": ("set_short_property", 300),
    "int": ("set_int_property", 70_000),
    "long": ("set_long_property", 2**40),
    "float": ("set_float_property", 1.5),
    "double": ("set_double_property", 2.25),
    "string": ("set_string_property", "123"),
}
X = MessageFormatError  # not readable as that type
# JMS 1.1 section 3.5.4: rows are the type set, columns the getter.
TABLE = {
    "boolean": {"boolean": True, "byte": X, "short": X, "int": X, "long": X, "float": X, "double": X, "string": "true"},
    "byte": {"boolean": X, "byte": 7, "short": 7, "int": 7, "long": 7, "float": X, "double": X, "string": "7"},
    "short": {"boolean": X, "byte": X, "short": 300, "int": 300, "long": 300, "float": X, "double": X, "string": "300"},
    "int": {
        "boolean": X,
        "byte": X,
        "short": X,
        "int": 70_000,
        "long": 70_000,
        "float": X,
        "double": X,
        "string": "70000",
    },
    "long": {
        "boolean": X,
        "byte": X,
        "short": X,
        "int": X,
        "long": 2**40,
        "float": X,
        "double": X,
        "string": str(2**40),
    },
    "float": {"boolean": X, "byte": X, "short": X, "int": X, "long": X, "float": 1.5, "double": 1.5, "string": "1.5"},
    "double": {"boolean": X, "byte": X, "short": X, "int": X, "long": X, "float": X, "double": 2.25, "string": "2.25"},
    "string": {
        "boolean": False,
        "byte": 123,
        "short": 123,
        "int": 123,
        "long": 123,
        "float": 123.0,
        "double": 123.0,
        "string": "123",
    },
}
CASES = [(row, col, expected) for row, cols in TABLE.items() for col, expected in cols.items()]


@pytest.mark.parametrize("set_as,get_as,expected", CASES, ids=[f"{r}-as-{c}" for r, c, _ in CASES])
@pytest.mark.parametrize("received", [False, True], ids=["local", "received"])
def test_property_conversion_table(session, set_as, get_as, expected, received):
    message = session.create_message()
    setter, value = SETTERS[set_as]
    getattr(message, setter)("p", value)
    if received:
        message = roundtrip(session, message)
    getter = getattr(message, f"get_{get_as}_property")
    if expected is X:
        with pytest.raises(MessageFormatError):
            getter("p")
    else:
        got = getter("p")
        if get_as == "boolean":
            assert got is expected
        else:
            assert got == expected
            assert isinstance(got, {"string": str, "float": float, "double": float}.get(get_as, int))
            assert not isinstance(got, bool)


def test_string_conversions_follow_java_parsing(session):
    message = session.create_message()
    message.set_string_property("t", "true")
    message.set_string_property("T", "TRUE")
    message.set_string_property("word", "abc")
    message.set_string_property("big", "300")
    message.set_string_property("dec", "1.5")
    assert message.get_boolean_property("t") is True
    assert message.get_boolean_property("T") is True
    assert message.get_boolean_property("word") is False
    assert message.get_double_property("dec") == 1.5
    assert message.get_float_property("dec") == 1.5
    for getter in (
        "get_byte_property",
        "get_short_property",
        "get_int_property",
        "get_long_property",
        "get_float_property",
        "get_double_property",
    ):
        with pytest.raises(JMSError):
            getattr(message, getter)("word")
    with pytest.raises(JMSError):
        message.get_byte_property("big")  # 300 is not a byte
    assert message.get_short_property("big") == 300
    with pytest.raises(JMSError):
        message.get_int_property("dec")


def test_absent_properties(session):
    message = session.create_message()
    for getter in (
        "get_byte_property",
        "get_short_property",
        "get_int_property",
        "get_long_property",
        "get_float_property",
        "get_double_property",
    ):
        with pytest.raises(MessageFormatError):
            getattr(message, getter)("missing")
    assert message.get_boolean_property("missing") is False
    assert message.get_string_property("missing") is None
    assert message.get_object_property("missing") is None
    assert message.property_exists("missing") is False


def test_property_names_exists_and_clear(session):
    message = session.create_message()
    message.set_string_property("partner", "acme")
    message.set_double_property("amount", 125.5)
    message.set_boolean_property("urgent", False)
    assert sorted(message.property_names()) == ["amount", "partner", "urgent"]
    assert message.property_exists("urgent") and message.property_exists("amount")
    message.clear_properties()
    assert message.property_names() == []
    assert not message.property_exists("partner")
    assert message.get_string_property("partner") is None


def test_received_property_names_include_delivery_count(session):
    message = session.create_message()
    message.set_string_property("partner", "acme")
    message.set_int_property("lines", 3)
    received = roundtrip(session, message)
    names = set(received.property_names())
    assert {"partner", "lines"} <= names
    assert "JMSXDeliveryCount" in names
    assert received.property_exists("JMSXDeliveryCount")


def test_setting_a_property_again_replaces_value_and_type(session):
    message = session.create_message()
    message.set_int_property("p", 5)
    message.set_string_property("p", "five")
    assert message.get_string_property("p") == "five"
    with pytest.raises(JMSError):
        message.get_int_property("p")
    assert message.property_names() == ["p"]


@pytest.mark.parametrize(
    "name,rule",
    [
        ("", "empty"),
        ("1abc", "identifier"),
        ("a-b", "identifier"),
        ("a b", "identifier"),
        ("NULL", "keyword"),
        ("and", "keyword"),
        ("Between", "keyword"),
        ("JMSFoo", "reserved"),
        ("JMSXDeliveryCount", "reserved"),
    ],
)
@pytest.mark.parametrize(
    "setter,value",
    [
        ("set_string_property", "v"),
        ("set_int_property", 1),
        ("set_boolean_property", True),
        ("set_object_property", 1.0),
    ],
)
def test_invalid_property_names_are_refused_naming_the_rule(session, name, rule, setter, value):
    message = session.create_message()
    with pytest.raises(JMSError) as info:
        getattr(message, setter)(name, value)
    assert isinstance(info.value, InvalidPropertyError)
    assert rule in str(info.value).lower()
    assert message.property_names() == []


@pytest.mark.parametrize("name", ["a", "_x", "$y", "partner_2", "Amount", "JMSXGroupID", "JMS_vendor", "Null_ish"])
def test_valid_property_names_are_accepted(session, name):
    message = session.create_message()
    message.set_string_property(name, "v")
    assert message.get_string_property(name) == "v"


@pytest.mark.parametrize(
    "setter,value",
    [
        ("set_byte_property", 200),
        ("set_byte_property", -129),
        ("set_short_property", 40_000),
        ("set_int_property", 2**31),
        ("set_int_property", -(2**31) - 1),
        ("set_long_property", 2**63),
    ],
)
def test_out_of_range_values_are_refused(session, setter, value):
    message = session.create_message()
    with pytest.raises(MessageFormatError):
        getattr(message, setter)("p", value)
    assert not message.property_exists("p")


@pytest.mark.parametrize(
    "setter,value",
    [
        ("set_int_property", "5"),
        ("set_int_property", 1.5),
        ("set_boolean_property", 1),
        ("set_string_property", 5),
        ("set_double_property", "1.0"),
        ("set_object_property", [1, 2]),
        ("set_object_property", {"a": 1}),
        ("set_object_property", object()),
    ],
)
def test_values_of_the_wrong_type_are_refused(session, setter, value):
    message = session.create_message()
    with pytest.raises(MessageFormatError):
        getattr(message, setter)("p", value)


def test_range_edges_are_accepted(session):
    message = session.create_message()
    message.set_byte_property("b", -128)
    message.set_byte_property("b2", 127)
    message.set_short_property("s", -(2**15))
    message.set_int_property("i", 2**31 - 1)
    message.set_long_property("l", -(2**63))
    received = roundtrip(session, message)
    assert received.get_byte_property("b") == -128
    assert received.get_byte_property("b2") == 127
    assert received.get_short_property("s") == -(2**15)
    assert received.get_int_property("i") == 2**31 - 1
    assert received.get_long_property("l") == -(2**63)


# Every JMS property type with the setter that makes it; values round-trip with their types.
PROPERTY_VALUES = st.one_of(
    st.booleans().map(lambda v: ("set_boolean_property", bool, v)),
    st.integers(-(2**7), 2**7 - 1).map(lambda v: ("set_byte_property", Byte, v)),
    st.integers(-(2**15), 2**15 - 1).map(lambda v: ("set_short_property", Short, v)),
    st.integers(-(2**31), 2**31 - 1).map(lambda v: ("set_int_property", Int, v)),
    st.integers(-(2**63), 2**63 - 1).map(lambda v: ("set_long_property", int, v)),
    st.floats(width=32, allow_nan=False).map(lambda v: ("set_float_property", Float, v)),
    st.floats(allow_nan=False).map(lambda v: ("set_double_property", float, v)),
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=40).map(
        lambda v: ("set_string_property", str, v)
    ),
)
PROPERTY_NAMES = st.from_regex(r"[A-Za-z_$][A-Za-z0-9_$]{0,20}", fullmatch=True).filter(
    lambda n: (
        n.upper() not in {"NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE"}
        and not n.startswith("JMS")
    )
)


@FIXTURE_SETTINGS
@given(props=st.dictionaries(PROPERTY_NAMES, PROPERTY_VALUES, max_size=8))
def test_properties_of_every_type_roundtrip_with_their_types(session, props):
    message = session.create_message()
    for name, (setter, _, value) in props.items():
        getattr(message, setter)(name, value)
    received = roundtrip(session, message)
    assert set(props) <= set(received.property_names())
    for name, (_, kind, value) in props.items():
        got = received.get_object_property(name)
        assert type(got) is kind, f"{name}: sent as {kind.__name__}, received {type(got).__name__}"
        assert got == value
        assert received.get_string_property(name) == message.get_string_property(name)


def test_special_float_properties_roundtrip(session):
    message = session.create_message()
    message.set_double_property("inf", math.inf)
    message.set_double_property("ninf", -math.inf)
    message.set_double_property("nan", math.nan)
    message.set_float_property("fnan", math.nan)
    message.set_double_property("negzero", -0.0)
    received = roundtrip(session, message)
    assert received.get_double_property("inf") == math.inf
    assert received.get_double_property("ninf") == -math.inf
    assert math.isnan(received.get_double_property("nan"))
    assert math.isnan(received.get_float_property("fnan"))
    assert math.copysign(1.0, received.get_double_property("negzero")) == -1.0


# ---------------------------------------------------------------- read-only received messages


def test_received_message_properties_are_read_only_until_cleared(session):
    message = session.create_text_message("body")
    message.set_string_property("partner", "acme")
    received = roundtrip(session, message)
    for setter, value in [
        ("set_string_property", "x"),
        ("set_int_property", 1),
        ("set_boolean_property", True),
        ("set_object_property", 1),
        ("set_double_property", 1.0),
    ]:
        with pytest.raises(MessageNotWriteableError):
            getattr(received, setter)("partner", value)
    assert received.get_string_property("partner") == "acme"
    received.clear_properties()
    assert not received.property_exists("partner")
    received.set_string_property("partner", "globex")
    assert received.get_string_property("partner") == "globex"
    # clearing properties does not make the body writable
    with pytest.raises(MessageNotWriteableError):
        received.text = "changed"


def _body_changers():
    return {
        "text": (lambda s: s.create_text_message("t"), lambda m: setattr(m, "text", "new")),
        "xml": (lambda s: s.create_xml_message("<a/>"), lambda m: setattr(m, "text", "<b/>")),
        "map": (lambda s: s.create_map_message({"a": 1}), lambda m: m.set_int("b", 2)),
        "bytes": (lambda s: s.create_bytes_message(b"ab"), lambda m: m.write_int(1)),
        "stream": (lambda s: s.create_stream_message([1]), lambda m: m.write_string("x")),
        "object": (lambda s: s.create_object_message({"a": 1}), lambda m: setattr(m, "object", [1])),
    }


@pytest.mark.parametrize("kind", list(_body_changers()))
def test_received_message_body_is_read_only_until_cleared(session, kind):
    make, change = _body_changers()[kind]
    received = roundtrip(session, make(session))
    with pytest.raises(MessageNotWriteableError):
        change(received)
    received.clear_body()
    change(received)  # writable again


def test_clear_body_empties_every_body_type(session):
    text = roundtrip(session, session.create_text_message("t"))
    text.clear_body()
    assert text.text is None
    mapped = roundtrip(session, session.create_map_message({"a": 1}))
    mapped.clear_body()
    assert mapped.map_names() == []
    data = roundtrip(session, session.create_bytes_message(b"abc"))
    data.clear_body()
    data.reset()
    assert data.body_length == 0
    stream = roundtrip(session, session.create_stream_message([1, "a"]))
    stream.clear_body()
    stream.reset()
    with pytest.raises(MessageEOFError):
        stream.read_object()
    obj = roundtrip(session, session.create_object_message([1]))
    obj.clear_body()
    assert obj.object is None


# ---------------------------------------------------------------- isolation of what was sent


def test_changing_a_message_after_send_does_not_change_what_was_sent(session, drain):
    producer = session.create_producer(Queue("iso"))
    text = session.create_text_message("original")
    text.set_string_property("p", "original")
    mapped = session.create_map_message({"k": "original"})
    data = session.create_bytes_message()
    data.write_utf("original")
    stream = session.create_stream_message(["original"])
    value = {"k": ["original"]}
    obj = session.create_object_message(value)
    for message in (text, mapped, data, stream, obj):
        producer.send(message)
    text.text = "changed"
    text.set_string_property("p", "changed")
    text.set_string_property("extra", "changed")
    mapped.set_string("k", "changed")
    mapped.set_string("extra", "changed")
    data.write_utf("changed")
    stream.write_string("changed")
    value["k"].append("changed")
    obj.object = "changed"

    got = drain(session.create_consumer(Queue("iso")))
    assert len(got) == 5
    assert got[0].text == "original"
    assert got[0].get_string_property("p") == "original"
    assert not got[0].property_exists("extra")
    assert got[1].map_names() == ["k"] and got[1].get_string("k") == "original"
    assert got[2].read_utf() == "original"
    with pytest.raises(MessageEOFError):
        got[2].read_byte()
    assert got[3].read_string() == "original"
    with pytest.raises(MessageEOFError):
        got[3].read_object()
    assert got[4].object == {"k": ["original"]}


def test_changing_headers_after_send_does_not_change_what_was_sent(session):
    message = session.create_text_message("x")
    message.jms_correlation_id = "PO-1"
    message.jms_type = "order"
    message.jms_reply_to = Queue("replies")
    producer = session.create_producer(Queue("iso.headers"))
    producer.send(message, priority=3)
    message.jms_correlation_id = "PO-2"
    message.jms_type = "invoice"
    message.jms_reply_to = Queue("elsewhere")
    received = session.create_consumer(Queue("iso.headers")).receive(timeout=2)
    assert (received.jms_correlation_id, received.jms_type, received.jms_reply_to, received.jms_priority) == (
        "PO-1",
        "order",
        Queue("replies"),
        3,
    )


def test_topic_copies_are_independent(session):
    from broker_core import Topic

    topic = Topic("iso.topic")
    subscribers = [session.create_consumer(topic) for _ in range(2)]
    session.create_producer(topic).send(session.create_map_message({"k": 1}))
    first, second = (s.receive(timeout=2) for s in subscribers)
    first.clear_body()
    first.set_long("k", 2)
    assert first.get_long("k") == 2
    assert second.get_long("k") == 1


# ---------------------------------------------------------------- initial bodies


def test_every_create_message_takes_an_optional_initial_body(session):
    assert session.create_text_message().text is None
    assert session.create_text_message("hello").text == "hello"
    assert session.create_xml_message("<a x='1'/>").document().get("x") == "1"
    assert session.create_map_message({"a": 1, "b": "two"}).get_string("b") == "two"
    assert session.create_map_message().map_names() == []
    data = session.create_bytes_message(b"\x00\x01")
    data.reset()
    assert data.read_short() == 1
    stream = session.create_stream_message([True, "s", 2])
    stream.reset()
    assert [stream.read_boolean(), stream.read_string(), stream.read_long()] == [True, "s", 2]
    assert session.create_object_message({"a": [1]}).object == {"a": [1]}
    assert session.create_object_message().object is None
    assert isinstance(session.create_message(), Message)


def test_initial_bodies_travel(session, drain):
    producer = session.create_producer(Queue("bodies"))
    for message in (
        session.create_text_message("hello"),
        session.create_xml_message("<Order id='7'/>"),
        session.create_map_message({"a": 1}),
        session.create_bytes_message(b"raw"),
        session.create_stream_message(["s", 1]),
        session.create_object_message([1, "two"]),
    ):
        producer.send(message)
    got = drain(session.create_consumer(Queue("bodies")))
    assert [type(m) for m in got] == [TextMessage, XMLMessage, MapMessage, BytesMessage, StreamMessage, ObjectMessage]
    assert got[0].text == "hello"
    assert got[1].document().get("id") == "7"
    assert got[2].get_long("a") == 1
    assert got[3].read_bytes() == b"raw"
    assert [got[4].read_string(), got[4].read_long()] == ["s", 1]
    assert got[5].object == [1, "two"]


# ---------------------------------------------------------------- XML


def test_xml_document_is_the_parsed_root(session):
    received = roundtrip(
        session, session.create_xml_message("<o:Order xmlns:o='urn:o'><o:Line qty='2'>widget</o:Line></o:Order>")
    )
    root = received.document()
    assert root.tag == "{urn:o}Order"
    assert root.find("{urn:o}Line").get("qty") == "2"
    assert received.text.startswith("<o:Order")


def test_xml_internal_entities_are_not_expanded(session):
    body = "<!DOCTYPE r [<!ENTITY e 'EXPANDED'>]><r>&e;</r>"
    for message in (session.create_xml_message(body), roundtrip(session, session.create_xml_message(body))):
        root = message.document()
        assert "EXPANDED" not in "".join(root.itertext())
        assert b"EXPANDED" not in etree.tostring(root)


def test_xml_external_entities_are_not_loaded(session, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    body = f"<!DOCTYPE r [<!ENTITY e SYSTEM '{secret.as_uri()}'>]><r>&e;</r>"
    root = session.create_xml_message(body).document()
    assert "TOP-SECRET" not in "".join(root.itertext())
    assert b"TOP-SECRET" not in etree.tostring(root)


def test_malformed_xml_raises_message_format_error(session):
    with pytest.raises(MessageFormatError):
        session.create_xml_message("<a><b></a>").document()
    with pytest.raises(MessageFormatError):
        session.create_xml_message().document()


def test_an_xml_message_made_from_its_bytes_reads_as_its_text(session):
    """The bytes are the text's encoding, given so that the store need not encode it again (see
    tests/broker_core/store/test_compression.py); whoever reads the message sees the text, on every backend."""
    text = "<Order xmlns='urn:o'><Note>façade — ünïcode 😀</Note></Order>"
    message = XMLMessage(text, utf8=text.encode("utf-8"))
    assert message.text == text and message.document()[0].text == "façade — ünïcode 😀"
    received = roundtrip(session, message)
    assert isinstance(received, XMLMessage) and received.text == text
    assert received.document()[0].text == "façade — ünïcode 😀"
    message.text = "<Other/>"  # the bytes given before no longer say anything
    assert message.document().tag == "Other" and roundtrip(session, message).text == "<Other/>"


def test_xml_bytes_without_their_text_are_refused():
    with pytest.raises(MessageFormatError):
        XMLMessage(utf8=b"<a/>")
    with pytest.raises(MessageFormatError):
        XMLMessage("<a/>", utf8="<a/>")  # type: ignore[arg-type]


def test_an_envelope_with_a_new_body_drops_the_old_encoding():
    from broker_core._envelope import Envelope

    env = Envelope(
        "ID:1", Queue("q"), DeliveryMode.PERSISTENT, 4, 0, 1, None, None, None, {}, "xml", "<a/>", None, b"<a/>"
    )
    assert env.replace(priority=9).encoded == b"<a/>"
    assert env.replace(body="<b/>").encoded is None
    assert env.replace(body="<b/>").xml_root().tag == "b"


def test_xml_document_follows_text_changes(session):
    message = session.create_xml_message("<a/>")
    assert message.document().tag == "a"
    message.text = "<b/>"
    assert message.document().tag == "b"


def test_text_must_be_a_string(session):
    with pytest.raises(MessageFormatError):
        session.create_text_message().text = b"bytes"


# ---------------------------------------------------------------- map messages


def test_map_message_typed_pairs_roundtrip(session):
    message = session.create_map_message()
    message.set_boolean("flag", True)
    message.set_byte("b", -5)
    message.set_short("s", 1000)
    message.set_char("c", "Z")
    message.set_int("i", 123_456)
    message.set_long("l", 2**50)
    message.set_float("f", 0.5)
    message.set_double("d", 3.25)
    message.set_string("str", "text")
    message.set_bytes("raw", b"\x00\xff")
    message.set_string("none", None)
    received = roundtrip(session, message)
    assert set(received.map_names()) == {"flag", "b", "s", "c", "i", "l", "f", "d", "str", "raw", "none"}
    assert received.item_exists("raw") and not received.item_exists("nope")
    assert received.get_boolean("flag") is True
    assert received.get_byte("b") == -5
    assert received.get_short("s") == 1000
    assert received.get_char("c") == "Z"
    assert received.get_int("i") == 123_456
    assert received.get_long("l") == 2**50
    assert received.get_float("f") == 0.5
    assert received.get_double("d") == 3.25
    assert received.get_string("str") == "text"
    assert received.get_bytes("raw") == b"\x00\xff"
    assert received.get_string("none") is None
    # widening conversions
    assert received.get_long("b") == -5 and received.get_int("s") == 1000 and received.get_double("f") == 0.5
    assert received.get_string("i") == "123456" and received.get_string("c") == "Z"
    assert received.get_string("flag") == "true"


def test_map_message_conversion_refusals(session):
    message = session.create_map_message()
    message.set_int("i", 70_000)
    message.set_string("word", "abc")
    message.set_string("num", "42")
    message.set_bytes("raw", b"x")
    message.set_char("c", "x")
    message.set_double("d", 1.5)
    with pytest.raises(MessageFormatError):
        message.get_short("i")
    with pytest.raises(MessageFormatError):
        message.get_boolean("i")
    with pytest.raises(MessageFormatError):
        message.get_float("d")
    with pytest.raises(MessageFormatError):
        message.get_string("raw")
    with pytest.raises(MessageFormatError):
        message.get_int("c")
    with pytest.raises(MessageFormatError):
        message.get_char("word")
    with pytest.raises(MessageFormatError):
        message.get_bytes("word")
    with pytest.raises(JMSError):
        message.get_int("word")
    with pytest.raises(MessageFormatError):
        message.get_int("missing")
    assert message.get_int("num") == 42
    assert message.get_boolean("missing") is False
    assert message.get_string("missing") is None
    with pytest.raises(MessageFormatError):
        message.set_byte("b", 128)
    with pytest.raises(MessageFormatError):
        message.set_object("o", object())


def test_map_set_object_keeps_the_narrow_types(session):
    message = session.create_map_message(
        {"b": Byte(1), "s": Short(2), "i": Int(3), "l": 4, "f": Float(0.5), "d": 0.25, "t": True, "x": "s", "raw": b"r"}
    )
    received = roundtrip(session, message)
    kinds = {name: type(received.get_object(name)) for name in received.map_names()}
    assert kinds == {
        "b": Byte,
        "s": Short,
        "i": Int,
        "l": int,
        "f": Float,
        "d": float,
        "t": bool,
        "x": str,
        "raw": bytes,
    }


# ---------------------------------------------------------------- bytes messages


def test_bytes_message_is_big_endian_like_data_output_stream(session):
    message = session.create_bytes_message()
    message.write_boolean(True)
    message.write_byte(-2)
    message.write_short(0x0102)
    message.write_char("A")
    message.write_int(0x01020304)
    message.write_long(1)
    message.write_float(1.0)
    message.write_double(-2.0)
    message.write_utf("hé")
    message.write_bytes(b"xyz", 1, 1)
    expected = (
        b"\x01"
        b"\xfe"
        b"\x01\x02"
        b"\x00A"
        b"\x01\x02\x03\x04"
        b"\x00\x00\x00\x00\x00\x00\x00\x01"
        b"\x3f\x80\x00\x00"
        b"\xc0\x00\x00\x00\x00\x00\x00\x00"
        b"\x00\x03h\xc3\xa9"
        b"y"
    )
    assert message.get_body() == expected
    received = roundtrip(session, message)
    assert received.body_length == len(expected)
    assert received.get_body() == expected
    assert received.read_boolean() is True
    assert received.read_byte() == -2
    assert received.read_short() == 0x0102
    assert received.read_char() == "A"
    assert received.read_int() == 0x01020304
    assert received.read_long() == 1
    assert received.read_float() == 1.0
    assert received.read_double() == -2.0
    assert received.read_utf() == "hé"
    assert received.read_bytes() == b"y"
    with pytest.raises(MessageEOFError):
        received.read_byte()
    assert received.read_bytes() == b""


def test_bytes_message_unsigned_reads(session):
    message = session.create_bytes_message(b"\xff\xff\xff")
    message.reset()
    assert message.read_unsigned_byte() == 255
    assert message.read_unsigned_short() == 0xFFFF


def test_bytes_message_modes(session):
    message = session.create_bytes_message()
    message.write_int(7)
    with pytest.raises(MessageNotReadableError):
        message.read_int()
    with pytest.raises(MessageNotReadableError):
        _ = message.body_length
    message.reset()
    assert message.body_length == 4
    assert message.read_int() == 7
    with pytest.raises(MessageEOFError):
        message.read_byte()
    message.reset()
    assert message.read_short() == 0  # reset rewinds
    with pytest.raises(MessageEOFError):
        message.read_int()  # only 2 bytes are left
    with pytest.raises(MessageNotWriteableError):
        message.write_int(1)
    message.clear_body()
    message.write_byte(1)
    message.reset()
    assert message.body_length == 1


def test_bytes_message_refuses_out_of_range_writes(session):
    message = session.create_bytes_message()
    with pytest.raises(MessageFormatError):
        message.write_byte(128)
    with pytest.raises(MessageFormatError):
        message.write_short(2**15)
    with pytest.raises(MessageFormatError):
        message.write_int(2**31)
    with pytest.raises(MessageFormatError):
        message.write_object(object())
    message.reset()
    assert message.body_length == 0


BYTES_OPS = st.one_of(
    st.booleans().map(lambda v: ("boolean", v)),
    st.integers(-(2**7), 2**7 - 1).map(lambda v: ("byte", v)),
    st.integers(-(2**15), 2**15 - 1).map(lambda v: ("short", v)),
    st.characters(max_codepoint=0xFFFF, exclude_categories=("Cs",)).map(lambda v: ("char", v)),
    st.integers(-(2**31), 2**31 - 1).map(lambda v: ("int", v)),
    st.integers(-(2**63), 2**63 - 1).map(lambda v: ("long", v)),
    st.floats(width=32).map(lambda v: ("float", v)),
    st.floats().map(lambda v: ("double", v)),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=30).map(lambda v: ("utf", v)),
)


def _same(got, value) -> bool:
    """``got`` reads back as ``value``: same kind of value (bool is not a
    number; narrow int/float subclasses count as their base) and equal, NaN
    and the sign of zero included."""
    if isinstance(value, float):
        return isinstance(got, float) and (
            (math.isnan(value) and math.isnan(got))
            or (got == value and math.copysign(1, got) == math.copysign(1, value))
        )
    if isinstance(value, bool):
        return got is value
    if isinstance(value, int):
        return isinstance(got, int) and not isinstance(got, bool) and got == value
    return isinstance(got, type(value)) and got == value


@FIXTURE_SETTINGS
@given(ops=st.lists(BYTES_OPS, max_size=20))
def test_bytes_message_write_then_read_roundtrips(session, ops):
    message = session.create_bytes_message()
    for kind, value in ops:
        getattr(message, f"write_{kind}")(value)
    received = roundtrip(session, message)
    for kind, value in ops:
        got = getattr(received, f"read_{kind}")()
        assert _same(got, value), (kind, value, got)
    with pytest.raises(MessageEOFError):
        received.read_byte()


# ---------------------------------------------------------------- stream messages


def test_stream_message_conversion_table(session):
    message = session.create_stream_message()
    message.write_boolean(True)
    message.write_byte(5)
    message.write_short(300)
    message.write_char("q")
    message.write_int(70_000)
    message.write_long(2**40)
    message.write_float(1.5)
    message.write_double(2.5)
    message.write_string("42")
    message.write_bytes(b"\x01")
    message.write_string(None)
    received = roundtrip(session, message)

    # boolean: readable as boolean and String only; a failed read does not move on
    with pytest.raises(MessageFormatError):
        received.read_int()
    assert received.read_string() == "true"
    # byte: byte, short, int, long, String
    with pytest.raises(MessageFormatError):
        received.read_float()
    assert received.read_short() == 5
    # short: not as byte
    with pytest.raises(MessageFormatError):
        received.read_byte()
    assert received.read_int() == 300
    # char: char and String only
    with pytest.raises(MessageFormatError):
        received.read_int()
    assert received.read_char() == "q"
    # int: not as short
    with pytest.raises(MessageFormatError):
        received.read_short()
    assert received.read_long() == 70_000
    # long: long and String
    with pytest.raises(MessageFormatError):
        received.read_int()
    assert received.read_string() == str(2**40)
    # float: float, double, String
    with pytest.raises(MessageFormatError):
        received.read_long()
    assert received.read_double() == 1.5
    # double: not as float
    with pytest.raises(MessageFormatError):
        received.read_float()
    assert received.read_double() == 2.5
    # String "42": parses to numbers
    assert received.read_long() == 42
    # byte[]: only as bytes
    with pytest.raises(MessageFormatError):
        received.read_string()
    assert received.read_bytes() == b"\x01"
    # null: String reads None, numbers refuse
    with pytest.raises(MessageFormatError):
        received.read_int()
    assert received.read_string() is None
    with pytest.raises(MessageEOFError):
        received.read_object()


def test_stream_message_modes(session):
    message = session.create_stream_message()
    message.write_int(1)
    with pytest.raises(MessageNotReadableError):
        message.read_int()
    message.reset()
    assert message.read_int() == 1
    with pytest.raises(MessageEOFError):
        message.read_int()
    with pytest.raises(MessageNotWriteableError):
        message.write_int(2)
    message.reset()
    assert message.read_object() == 1
    message.clear_body()
    message.write_string("again")
    message.reset()
    assert message.read_string() == "again"


STREAM_OPS = st.one_of(
    st.booleans().map(lambda v: ("boolean", v)),
    st.integers(-(2**7), 2**7 - 1).map(lambda v: ("byte", v)),
    st.integers(-(2**15), 2**15 - 1).map(lambda v: ("short", v)),
    st.characters(exclude_categories=("Cs",)).map(lambda v: ("char", v)),
    st.integers(-(2**31), 2**31 - 1).map(lambda v: ("int", v)),
    st.integers(-(2**63), 2**63 - 1).map(lambda v: ("long", v)),
    st.floats(width=32).map(lambda v: ("float", v)),
    st.floats().map(lambda v: ("double", v)),
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=30).map(
        lambda v: ("string", v)
    ),
    st.binary(max_size=30).map(lambda v: ("bytes", v)),
)


@FIXTURE_SETTINGS
@given(ops=st.lists(STREAM_OPS, max_size=20))
def test_stream_message_write_then_read_roundtrips(session, ops):
    message = session.create_stream_message()
    for kind, value in ops:
        getattr(message, f"write_{kind}")(value)
    received = roundtrip(session, message)
    for kind, value in ops:
        got = getattr(received, f"read_{kind}")()
        assert _same(got, value), (kind, value, got)
        if kind in ("byte", "short", "int", "long"):
            assert not isinstance(got, bool)
    with pytest.raises(MessageEOFError):
        received.read_object()


# ---------------------------------------------------------------- object messages


def _identical(a, b) -> bool:
    """Equal, with the same types all the way down (bool is not int)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_identical(x, y) for x, y in zip(a, b, strict=False))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_identical(a[k], b[k]) for k in a)
    if isinstance(a, decimal.Decimal):
        return str(a) == str(b)
    return a == b


PLAIN_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(st.characters(exclude_categories=("Cs",))),
    st.binary(),
    st.decimals(allow_nan=False),
    st.dates(),
    st.datetimes(),
)


def _plain_containers(inner):
    """Lists, tuples and str-keyed dicts of ``inner`` values."""
    keys = st.text(st.characters(exclude_categories=("Cs",)), max_size=8)
    return (
        st.lists(inner, max_size=4) | st.lists(inner, max_size=4).map(tuple) | st.dictionaries(keys, inner, max_size=4)
    )


PLAIN_VALUES = st.recursive(PLAIN_SCALARS, _plain_containers, max_leaves=15)


@FIXTURE_SETTINGS
@given(value=PLAIN_VALUES)
def test_object_message_roundtrips_plain_values(session, value):
    received = roundtrip(session, session.create_object_message(value))
    assert _identical(received.object, value), (value, received.object)


def test_object_message_roundtrips_named_plain_types(session):
    value = {
        "amount": decimal.Decimal("125.50"),
        "raw": b"\x00\xff",
        "when": dt.datetime(2024, 5, 1, 12, 30, 15, 123456),
        "aware": dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        "day": dt.date(2024, 5, 1),
        "lines": [1, 2.5, "three", None, True],
        "pair": (1, "a"),
        "tags": {"x", "y"},
        "$tricky": {"$b": "not base64 but a key"},
        "inf": float("inf"),
    }
    received = roundtrip(session, session.create_object_message(value)).object
    assert received == value
    assert type(received["amount"]) is decimal.Decimal and str(received["amount"]) == "125.50"
    assert received["aware"].utcoffset() == dt.timedelta(hours=2)
    assert type(received["day"]) is dt.date
    assert type(received["pair"]) is tuple


def test_object_message_gives_a_new_value_each_read(session):
    received = roundtrip(session, session.create_object_message({"lines": [1]}))
    first = received.object
    first["lines"].append(2)
    assert received.object == {"lines": [1]}


class _Custom:
    reduced = False

    def __reduce__(self):
        _Custom.reduced = True
        return (_Custom, ())


@pytest.mark.parametrize(
    "value", [_Custom(), [1, _Custom()], {"a": _Custom()}, {1: "non-str key"}, object(), dt.timedelta(1), complex(1, 2)]
)
def test_object_message_refuses_other_classes_without_pickling(session, value):
    _Custom.reduced = False
    with pytest.raises(MessageFormatError):
        session.create_object_message(value)
    message = session.create_object_message()
    with pytest.raises(MessageFormatError):
        message.object = value
    assert message.object is None
    assert _Custom.reduced is False, "the value was pickled"
