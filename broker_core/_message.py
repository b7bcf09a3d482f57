"""Messages: headers, typed properties and the six JMS body types.

Headers are attributes (``jms_message_id``, ``jms_priority``, ...). Properties
are typed and follow the JMS conversion table (JMS 1.1, 3.5.4): a value set as
``int`` reads back as ``long`` or ``str`` but not as ``short``. A received
message is read-only until ``clear_properties()`` / ``clear_body()``.
"""

from __future__ import annotations

import base64
import datetime as _dt
import decimal
import json
import math
import struct
from typing import Any, Callable, Iterable

from lxml import etree

from ._constants import DEFAULT_PRIORITY, DeliveryMode
from ._destinations import Destination
from ._envelope import Byte, Envelope, Float, Int, Short, hardened_xml_parser
from ._errors import (
    InvalidPropertyError,
    MessageEOFError,
    MessageFormatError,
    MessageNotReadableError,
    MessageNotWriteableError,
)

__all__ = [
    "Message",
    "TextMessage",
    "XMLMessage",
    "MapMessage",
    "BytesMessage",
    "StreamMessage",
    "ObjectMessage",
    "Char",
    "check_property_name",
]


class Char(str):
    """A JMS ``char`` value: a one-character string (map and stream bodies)."""

    __slots__ = ()


#: A property's value (``Byte``, ``Short``, ``Int`` and ``Float`` are ``int`` and ``float``).
PropertyValue = bool | int | float | str
#: A value of a map or stream body: a property's, or bytes (``Char`` is a ``str``).
BodyValue = bool | int | float | str | bytes


# ---------------------------------------------------------------- names

_SELECTOR_KEYWORDS = frozenset({"NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE"})
#: JMSX properties a client may set; the others are set by the broker.
_CLIENT_JMSX = frozenset({"JMSXGroupID", "JMSXGroupSeq", "JMSXUserID", "JMSXAppID"})
_valid_names: set[str] = set()


def check_property_name(name: Any) -> str:
    """Return ``name`` if it is a valid property name, else raise
    :class:`InvalidPropertyError` saying which rule it breaks."""
    if name in _valid_names:
        return name
    if not isinstance(name, str) or not name:
        raise InvalidPropertyError(f"property name must be a non-empty string, got {name!r}")
    if not name.replace("$", "_").isidentifier():
        raise InvalidPropertyError(
            f"property name {name!r} is not a Java identifier (start with a letter, '_' or '$'; "
            "then letters, digits, '_' or '$')"
        )
    if name.upper() in _SELECTOR_KEYWORDS:
        raise InvalidPropertyError(f"property name {name!r} is a selector keyword and cannot name a property")
    if name.startswith("JMSX"):
        if name not in _CLIENT_JMSX:
            raise InvalidPropertyError(
                f"property name {name!r} is reserved: only {sorted(_CLIENT_JMSX)} of the JMSX properties may be set"
            )
    elif name.startswith("JMS") and not name.startswith("JMS_"):
        raise InvalidPropertyError(f"property name {name!r} is reserved: names starting with 'JMS' belong to JMS")
    if len(_valid_names) < 10_000:
        _valid_names.add(name)
    return name


# ---------------------------------------------------------------- conversion table

_INT_RANGES = {Byte: (-(2**7), 2**7 - 1), Short: (-(2**15), 2**15 - 1), Int: (-(2**31), 2**31 - 1), int: (-(2**63), 2**63 - 1)}
_TYPE_NAMES = {bool: "boolean", Byte: "byte", Short: "short", Int: "int", int: "long", Float: "float", float: "double",
               str: "String", Char: "char", bytes: "byte[]"}


def _type_name(value: Any) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def _ranged(kind: type, value: Any, what: str) -> int:
    low, high = _INT_RANGES[kind]
    if not low <= value <= high:
        raise MessageFormatError(f"{what}: {value} is out of range for a {_TYPE_NAMES[kind]} ({low}..{high})")
    return value if kind is int else kind(value)


def _parse_int(kind: type, text: str, what: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise MessageFormatError(f"{what}: the string {text!r} is not a {_TYPE_NAMES[kind]}") from None
    return _ranged(kind, value, what)


# The JMS 1.1 table: which stored types each getter accepts (strings parse).
_INT_ACCEPTS = {Byte: (Byte,), Short: (Byte, Short), Int: (Byte, Short, Int), int: (Byte, Short, Int, int)}


def _to_bool(value: Any, what: str) -> bool:
    if type(value) is bool:
        return value
    if type(value) is str:
        return value.lower() == "true"
    raise MessageFormatError(f"{what}: a {_type_name(value)} cannot be read as a boolean")


def _to_integer(kind: type, value: Any, what: str) -> int:
    t = type(value)
    if t in _INT_ACCEPTS[kind]:
        return int(value) if kind is int else kind(value)
    if t is str:
        return _parse_int(kind, value, what)
    raise MessageFormatError(f"{what}: a {_type_name(value)} cannot be read as a {_TYPE_NAMES[kind]}")


def _to_float(value: Any, what: str) -> float:
    t = type(value)
    if t is Float:
        return value
    if t is str:
        try:
            return Float(float(value))
        except ValueError:
            raise MessageFormatError(f"{what}: the string {value!r} is not a float") from None
    raise MessageFormatError(f"{what}: a {_type_name(value)} cannot be read as a float")


def _to_double(value: Any, what: str) -> float:
    t = type(value)
    if t is float or t is Float:
        return float(value)
    if t is str:
        try:
            return float(value)
        except ValueError:
            raise MessageFormatError(f"{what}: the string {value!r} is not a double") from None
    raise MessageFormatError(f"{what}: a {_type_name(value)} cannot be read as a double")


def _to_string(value: Any, what: str) -> str | None:
    if value is None or type(value) is str:
        return value
    if type(value) is bool:
        return "true" if value else "false"
    if type(value) is bytes:
        raise MessageFormatError(f"{what}: a byte[] cannot be read as a String")
    return str(value)


def _to_char(value: Any, what: str) -> str:
    if type(value) is Char:
        return value
    raise MessageFormatError(f"{what}: a {_type_name(value)} cannot be read as a char")


def _to_bytes(value: Any, what: str) -> bytes | None:
    if value is None or type(value) is bytes:
        return value
    raise MessageFormatError(f"{what}: a {_type_name(value)} cannot be read as byte[]")


def _check_bool(value: Any, what: str) -> bool:
    if type(value) is not bool:
        raise MessageFormatError(f"{what}: expected a bool, got {_type_name(value)}")
    return value


def _check_int(kind: type, value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise MessageFormatError(f"{what}: expected an int for a {_TYPE_NAMES[kind]}, got {_type_name(value)}")
    return _ranged(kind, value, what)


def _check_float(kind: type, value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MessageFormatError(f"{what}: expected a float for a {_TYPE_NAMES[kind]}, got {_type_name(value)}")
    return Float(value) if kind is Float else float(value)


def _check_str(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise MessageFormatError(f"{what}: expected a str, got {_type_name(value)}")
    return str(value)


def _check_object(value: Any, what: str, *, allow_bytes: bool) -> Any:
    """Validate a value given to ``set_object_*``: the JMS primitive wrappers."""
    t = type(value)
    if t in (bool, str, Byte, Short, Int, Float, float, Char) or (allow_bytes and t is bytes):
        return value
    if t is int:
        return _ranged(int, value, what)
    if isinstance(value, bool):
        return bool(value)
    raise InvalidPropertyError(
        f"{what}: {type(value).__name__} is not a JMS {'map or stream' if allow_bytes else 'property'} type "
        "(bool, int, float, str" + (", bytes" if allow_bytes else "") + ")"
    )


# ---------------------------------------------------------------- the base message

_DELIVERY_MODES = (DeliveryMode.NON_PERSISTENT, DeliveryMode.PERSISTENT)


class Message:
    """A message with headers and properties and no body.

    Header attributes: ``jms_message_id`` (``"ID:..."``, set by send),
    ``jms_destination``, ``jms_delivery_mode``, ``jms_expiration`` (epoch ms, 0
    for never), ``jms_priority`` (0-9), ``jms_timestamp`` (epoch ms),
    ``jms_correlation_id``, ``jms_reply_to``, ``jms_type``, ``jms_redelivered``.
    """

    __slots__ = (
        "jms_message_id",
        "jms_destination",
        "jms_delivery_mode",
        "jms_expiration",
        "jms_priority",
        "jms_timestamp",
        "jms_correlation_id",
        "jms_reply_to",
        "jms_type",
        "jms_redelivered",
        "_props",
        "_props_ro",
        "_body_ro",
        "_delivery_count",
        "_ack",
    )
    kind = "message"

    def __init__(self) -> None:
        self.jms_message_id: str | None = None
        self.jms_destination: Destination | None = None
        self.jms_delivery_mode: int = DeliveryMode.PERSISTENT
        self.jms_expiration: int = 0
        self.jms_priority: int = DEFAULT_PRIORITY
        self.jms_timestamp: int = 0
        self.jms_correlation_id: str | None = None
        self.jms_reply_to: Destination | None = None
        self.jms_type: str | None = None
        self.jms_redelivered: bool = False
        self._props: dict[str, Any] = {}
        self._props_ro = False
        self._body_ro = False
        self._delivery_count = 0
        self._ack: Callable[[], None] | None = None

    # -- acknowledgement

    def acknowledge(self) -> None:
        """Acknowledge this message: in a ``CLIENT`` session, every message the
        session has consumed so far; in an ``INDIVIDUAL`` session, this one. A
        no-op in other modes and on messages that were not received."""
        if self._ack is not None:
            self._ack()

    # -- properties

    def _writable_props(self) -> dict[str, Any]:
        if self._props_ro:
            raise MessageNotWriteableError(
                "the properties of a received message are read-only; call clear_properties() first"
            )
        return self._props

    def _get(self, name: str) -> Any:
        if name == "JMSXDeliveryCount":
            return Int(self._delivery_count) if self._delivery_count else None
        return self._props.get(name)

    def property_exists(self, name: str) -> bool:
        return self._get(name) is not None

    def property_names(self) -> list[str]:
        names = list(self._props)
        if self._delivery_count:
            names.append("JMSXDeliveryCount")
        return names

    def clear_properties(self) -> None:
        """Remove every property and make the properties writable again."""
        self._props = {}
        self._props_ro = False

    def set_boolean_property(self, name: str, value: bool) -> None:
        self._writable_props()[check_property_name(name)] = _check_bool(value, f"property {name!r}")

    def set_byte_property(self, name: str, value: int) -> None:
        self._writable_props()[check_property_name(name)] = _check_int(Byte, value, f"property {name!r}")

    def set_short_property(self, name: str, value: int) -> None:
        self._writable_props()[check_property_name(name)] = _check_int(Short, value, f"property {name!r}")

    def set_int_property(self, name: str, value: int) -> None:
        self._writable_props()[check_property_name(name)] = _check_int(Int, value, f"property {name!r}")

    def set_long_property(self, name: str, value: int) -> None:
        self._writable_props()[check_property_name(name)] = _check_int(int, value, f"property {name!r}")

    def set_float_property(self, name: str, value: float) -> None:
        self._writable_props()[check_property_name(name)] = _check_float(Float, value, f"property {name!r}")

    def set_double_property(self, name: str, value: float) -> None:
        self._writable_props()[check_property_name(name)] = _check_float(float, value, f"property {name!r}")

    def set_string_property(self, name: str, value: str) -> None:
        props = self._writable_props()
        if value.__class__ is not str:
            value = _check_str(value, f"property {name!r}")
        props[check_property_name(name)] = value

    def set_object_property(self, name: str, value: PropertyValue) -> None:
        """Set a property from a ``bool``, ``int`` (stored as long), ``float``
        (double), ``str``, or one of the narrow types ``Byte``, ``Short``,
        ``Int``, ``Float``."""
        what = f"property {name!r}"
        self._writable_props()[check_property_name(name)] = _check_object(value, what, allow_bytes=False)

    def get_boolean_property(self, name: str) -> bool:
        value = self._get(name)
        return False if value is None else _to_bool(value, f"property {name!r}")

    def _get_number(self, name: str, convert: Callable[..., Any], *args: Any) -> Any:
        value = self._get(name)
        if value is None:
            raise MessageFormatError(f"property {name!r} is not set, so it has no numeric value")
        return convert(*args, value, f"property {name!r}")

    def get_byte_property(self, name: str) -> int:
        return self._get_number(name, _to_integer, Byte)

    def get_short_property(self, name: str) -> int:
        return self._get_number(name, _to_integer, Short)

    def get_int_property(self, name: str) -> int:
        return self._get_number(name, _to_integer, Int)

    def get_long_property(self, name: str) -> int:
        return self._get_number(name, _to_integer, int)

    def get_float_property(self, name: str) -> float:
        return self._get_number(name, _to_float)

    def get_double_property(self, name: str) -> float:
        return self._get_number(name, _to_double)

    def get_string_property(self, name: str) -> str | None:
        return _to_string(self._get(name), f"property {name!r}")

    def get_object_property(self, name: str) -> PropertyValue | None:
        return self._get(name)

    # -- body

    def clear_body(self) -> None:
        """Empty the body and make it writable again."""
        self._body_ro = False
        self._clear_body()

    def _clear_body(self) -> None:
        pass

    def _check_body_writable(self) -> None:
        if self._body_ro:
            raise MessageNotWriteableError("the body of a received message is read-only; call clear_body() first")

    def _body_snapshot(self) -> Any:
        return None

    def _body_encoded(self) -> bytes | None:
        """The body's UTF-8 encoding when known without encoding it (see Envelope.encoded)."""
        return None

    def _set_body_from(self, body: Any) -> None:
        pass

    # -- envelopes

    def _to_envelope(self, message_id: str, destination: Destination, delivery_mode: int, priority: int,
                     expiration: int, timestamp: int, origin: str | None) -> Envelope:
        """Snapshot for sending; the message object stays the sender's."""
        return Envelope(
            message_id,
            destination,
            delivery_mode,
            priority,
            expiration,
            timestamp,
            self.jms_correlation_id,
            self.jms_reply_to,
            self.jms_type,
            dict(self._props) if self._props else {},
            self.kind,
            self._body_snapshot(),
            origin,
            self._body_encoded(),
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.jms_message_id} to {self.jms_destination}>"


def message_from_envelope(env: Envelope, delivery_count: int = 1,
                          ack: Callable[[], None] | None = None) -> Message:
    """A fresh, read-only message for one delivery of ``env``."""
    cls = _KINDS[env.kind]
    msg = cls.__new__(cls)
    msg.jms_message_id = env.message_id
    msg.jms_destination = env.destination
    msg.jms_delivery_mode = env.delivery_mode
    msg.jms_expiration = env.expiration
    msg.jms_priority = env.priority
    msg.jms_timestamp = env.timestamp
    msg.jms_correlation_id = env.correlation_id
    msg.jms_reply_to = env.reply_to
    msg.jms_type = env.type
    msg.jms_redelivered = delivery_count > 1
    msg._props = env.properties
    msg._props_ro = True
    msg._body_ro = True
    msg._delivery_count = delivery_count
    msg._ack = ack
    msg._set_body_from(env.body)
    return msg


# ---------------------------------------------------------------- text and XML


class TextMessage(Message):
    """A message whose body is a string, read and written as ``text``."""

    __slots__ = ("_text",)
    kind = "text"

    def __init__(self, text: str | None = None) -> None:
        super().__init__()
        self._text = None
        if text is not None:
            self.text = text

    @property
    def text(self) -> str | None:
        return self._text

    @text.setter
    def text(self, value: str | None) -> None:
        self._check_body_writable()
        if value is not None and not isinstance(value, str):
            raise MessageFormatError(f"text must be a str or None, got {type(value).__name__}")
        self._text = value

    def _clear_body(self) -> None:
        self._text = None

    def _body_snapshot(self) -> Any:
        return self._text

    def _set_body_from(self, body: Any) -> None:
        self._text = body


_XML_PARSER = hardened_xml_parser()


class XMLMessage(TextMessage):
    """A text message whose text is an XML document.

    ``document()`` parses it on first use with a hardened parser (no DTD, no
    entity expansion, no network) and returns the root element.

    *utf8*, when the caller has it at hand (the document as received), is the
    text's UTF-8 encoding, exactly ``text.encode("utf-8")``: a persistent send
    stores those bytes instead of encoding the text again (for a large
    document with non-ASCII letters, not free). Setting ``text`` later drops them.
    """

    __slots__ = ("_doc", "_utf8")
    kind = "xml"

    def __init__(self, text: str | None = None, *, utf8: bytes | None = None) -> None:
        self._doc = None
        self._utf8 = None
        super().__init__(text)
        if utf8 is not None:
            if text is None or not isinstance(utf8, bytes):
                raise MessageFormatError("utf8 must be the bytes of the text given with it")
            self._utf8 = utf8

    @TextMessage.text.setter  # type: ignore[attr-defined]
    def text(self, value: str | None) -> None:
        TextMessage.text.fset(self, value)  # type: ignore[attr-defined]
        self._doc = None
        self._utf8 = None

    def _body_encoded(self) -> bytes | None:
        return self._utf8

    def _set_body_from(self, body: Any) -> None:
        self._text = body
        self._doc = None
        self._utf8 = None

    def _clear_body(self) -> None:
        self._text = None
        self._doc = None
        self._utf8 = None

    def document(self) -> etree._Element:
        """The root element of the XML body; :class:`MessageFormatError` if the
        text is not well-formed XML."""
        if self._doc is None:
            if self._text is None:
                raise MessageFormatError("the message has no XML body")
            try:
                data = self._utf8 if self._utf8 is not None else self._text.encode("utf-8")
                self._doc = etree.fromstring(data, _XML_PARSER)
            except (etree.XMLSyntaxError, ValueError) as exc:
                raise MessageFormatError(f"the body is not well-formed XML: {str(exc)[:300]}") from None
        return self._doc


# ---------------------------------------------------------------- map


class MapMessage(Message):
    """A message whose body is a set of name-value pairs with JMS types.

    Typed pairs ``set_int(name, v)`` / ``get_int(name)`` and so on follow the
    JMS conversion table; ``map_names()`` and ``item_exists(name)`` inspect it.
    """

    __slots__ = ("_map",)
    kind = "map"

    def __init__(self, values: dict[str, Any] | None = None) -> None:
        super().__init__()
        self._map: dict[str, Any] = {}
        if values:
            for name, value in values.items():
                self.set_object(name, value)

    def _clear_body(self) -> None:
        self._map = {}

    def _body_snapshot(self) -> Any:
        return dict(self._map)

    def _set_body_from(self, body: Any) -> None:
        self._map = body

    def _put(self, name: str, value: Any) -> None:
        self._check_body_writable()
        if not isinstance(name, str) or not name:
            raise InvalidPropertyError(f"map entry name must be a non-empty string, got {name!r}")
        self._map[name] = value

    def map_names(self) -> list[str]:
        return list(self._map)

    def item_exists(self, name: str) -> bool:
        return name in self._map

    def set_boolean(self, name: str, value: bool) -> None:
        self._put(name, _check_bool(value, f"map entry {name!r}"))

    def set_byte(self, name: str, value: int) -> None:
        self._put(name, _check_int(Byte, value, f"map entry {name!r}"))

    def set_short(self, name: str, value: int) -> None:
        self._put(name, _check_int(Short, value, f"map entry {name!r}"))

    def set_char(self, name: str, value: str) -> None:
        if not isinstance(value, str) or len(value) != 1:
            raise MessageFormatError(f"map entry {name!r}: a char is a one-character string")
        self._put(name, Char(value))

    def set_int(self, name: str, value: int) -> None:
        self._put(name, _check_int(Int, value, f"map entry {name!r}"))

    def set_long(self, name: str, value: int) -> None:
        self._put(name, _check_int(int, value, f"map entry {name!r}"))

    def set_float(self, name: str, value: float) -> None:
        self._put(name, _check_float(Float, value, f"map entry {name!r}"))

    def set_double(self, name: str, value: float) -> None:
        self._put(name, _check_float(float, value, f"map entry {name!r}"))

    def set_string(self, name: str, value: str | None) -> None:
        self._put(name, None if value is None else _check_str(value, f"map entry {name!r}"))

    def set_bytes(self, name: str, value: bytes | bytearray | None) -> None:
        if value is not None and not isinstance(value, (bytes, bytearray, memoryview)):
            raise MessageFormatError(f"map entry {name!r}: expected bytes, got {type(value).__name__}")
        self._put(name, None if value is None else bytes(value))

    def set_object(self, name: str, value: BodyValue | bytearray | memoryview | None) -> None:
        if isinstance(value, (bytearray, memoryview)):
            value = bytes(value)
        self._put(name, None if value is None else _check_object(value, f"map entry {name!r}", allow_bytes=True))

    def _read(self, name: str) -> Any:
        return self._map.get(name)

    def get_boolean(self, name: str) -> bool:
        value = self._read(name)
        return False if value is None else _to_bool(value, f"map entry {name!r}")

    def _number(self, name: str, convert: Callable[..., Any], *args: Any) -> Any:
        value = self._read(name)
        if value is None:
            raise MessageFormatError(f"map entry {name!r} is not set, so it has no numeric value")
        return convert(*args, value, f"map entry {name!r}")

    def get_byte(self, name: str) -> int:
        return self._number(name, _to_integer, Byte)

    def get_short(self, name: str) -> int:
        return self._number(name, _to_integer, Short)

    def get_int(self, name: str) -> int:
        return self._number(name, _to_integer, Int)

    def get_long(self, name: str) -> int:
        return self._number(name, _to_integer, int)

    def get_float(self, name: str) -> float:
        return self._number(name, _to_float)

    def get_double(self, name: str) -> float:
        return self._number(name, _to_double)

    def get_char(self, name: str) -> str:
        return self._number(name, _to_char)

    def get_string(self, name: str) -> str | None:
        return _to_string(self._read(name), f"map entry {name!r}")

    def get_bytes(self, name: str) -> bytes | None:
        return _to_bytes(self._read(name), f"map entry {name!r}")

    def get_object(self, name: str) -> BodyValue | None:
        return self._read(name)


# ---------------------------------------------------------------- bytes

_S_BYTE, _S_UBYTE, _S_SHORT, _S_USHORT = struct.Struct(">b"), struct.Struct(">B"), struct.Struct(">h"), struct.Struct(">H")
_S_INT, _S_LONG, _S_FLOAT, _S_DOUBLE = struct.Struct(">i"), struct.Struct(">q"), struct.Struct(">f"), struct.Struct(">d")


class BytesMessage(Message):
    """A message whose body is a stream of bytes, written and read with the
    JMS primitives (big-endian, as Java's ``DataOutputStream``).

    A new message is write-only; ``reset()`` (or receiving it) makes it
    read-only and positions reading at the start.
    """

    __slots__ = ("_buf", "_data", "_pos")
    kind = "bytes"

    def __init__(self, data: bytes | None = None) -> None:
        super().__init__()
        self._buf = bytearray(data or b"")
        self._data: bytes | None = None
        self._pos = 0

    def _clear_body(self) -> None:
        self._buf = bytearray()
        self._data = None
        self._pos = 0

    def _body_snapshot(self) -> Any:
        return self._data if self._data is not None else bytes(self._buf)

    def _set_body_from(self, body: Any) -> None:
        self._buf = bytearray()
        self._data = body or b""
        self._pos = 0

    def reset(self) -> None:
        """Make the body read-only and move to its start."""
        if self._data is None:
            self._data = bytes(self._buf)
            self._buf = bytearray()
        self._body_ro = True
        self._pos = 0

    @property
    def body_length(self) -> int:
        """Length of the body in bytes (read mode only)."""
        if self._data is None:
            raise MessageNotReadableError("body_length is only available in read mode; call reset() first")
        return len(self._data)

    def get_body(self) -> bytes:
        """The whole body, in either mode."""
        return self._data if self._data is not None else bytes(self._buf)

    # writing
    def _w(self, chunk: bytes) -> None:
        self._check_body_writable()
        if self._data is not None:
            raise MessageNotWriteableError("the body is in read mode; call clear_body() to write again")
        self._buf += chunk

    def write_boolean(self, value: bool) -> None:
        self._w(b"\x01" if _check_bool(value, "write_boolean") else b"\x00")

    def write_byte(self, value: int) -> None:
        self._w(_S_BYTE.pack(_check_int(Byte, value, "write_byte")))

    def write_short(self, value: int) -> None:
        self._w(_S_SHORT.pack(_check_int(Short, value, "write_short")))

    def write_char(self, value: str) -> None:
        if not isinstance(value, str) or len(value) != 1 or ord(value) > 0xFFFF:
            raise MessageFormatError("write_char takes one character from the Basic Multilingual Plane")
        self._w(_S_USHORT.pack(ord(value)))

    def write_int(self, value: int) -> None:
        self._w(_S_INT.pack(_check_int(Int, value, "write_int")))

    def write_long(self, value: int) -> None:
        self._w(_S_LONG.pack(_check_int(int, value, "write_long")))

    def write_float(self, value: float) -> None:
        self._w(_S_FLOAT.pack(_check_float(Float, value, "write_float")))

    def write_double(self, value: float) -> None:
        self._w(_S_DOUBLE.pack(_check_float(float, value, "write_double")))

    def write_utf(self, value: str) -> None:
        """Write a string as a 2-byte length and UTF-8 (Java's modified UTF-8
        differs only for NUL and astral characters)."""
        data = _check_str(value, "write_utf").encode("utf-8")
        if len(data) > 0xFFFF:
            raise MessageFormatError("write_utf: the encoded string is longer than 65535 bytes")
        self._w(_S_USHORT.pack(len(data)) + data)

    def write_bytes(self, value: bytes, offset: int = 0, length: int | None = None) -> None:
        view = bytes(value)
        end = len(view) if length is None else offset + length
        self._w(view[offset:end])

    def write_object(self, value: BodyValue | bytearray) -> None:
        """Write a bool, int (as long), float (as double), str (as UTF), bytes,
        or a narrow type (``Byte``, ``Short``, ``Int``, ``Float``, ``Char``)."""
        writer = {bool: self.write_boolean, Byte: self.write_byte, Short: self.write_short, Int: self.write_int,
                  int: self.write_long, Float: self.write_float, float: self.write_double, str: self.write_utf,
                  Char: self.write_char, bytes: self.write_bytes, bytearray: self.write_bytes}.get(type(value))
        if writer is None:
            raise MessageFormatError(f"write_object: {type(value).__name__} is not a JMS primitive type")
        writer(value)

    # reading
    def _r(self, size: int) -> bytes:
        data = self._data
        if data is None:
            raise MessageNotReadableError("the body is write-only; call reset() before reading")
        pos = self._pos
        if pos + size > len(data):
            raise MessageEOFError(f"read past the end of the body ({len(data) - pos} bytes left, {size} needed)")
        self._pos = pos + size
        return data[pos : pos + size]

    def read_boolean(self) -> bool:
        return self._r(1) != b"\x00"

    def read_byte(self) -> int:
        return _S_BYTE.unpack(self._r(1))[0]

    def read_unsigned_byte(self) -> int:
        return _S_UBYTE.unpack(self._r(1))[0]

    def read_short(self) -> int:
        return _S_SHORT.unpack(self._r(2))[0]

    def read_unsigned_short(self) -> int:
        return _S_USHORT.unpack(self._r(2))[0]

    def read_char(self) -> str:
        return chr(_S_USHORT.unpack(self._r(2))[0])

    def read_int(self) -> int:
        return _S_INT.unpack(self._r(4))[0]

    def read_long(self) -> int:
        return _S_LONG.unpack(self._r(8))[0]

    def read_float(self) -> float:
        return _S_FLOAT.unpack(self._r(4))[0]

    def read_double(self) -> float:
        return _S_DOUBLE.unpack(self._r(8))[0]

    def read_utf(self) -> str:
        start = self._pos
        length = _S_USHORT.unpack(self._r(2))[0]
        try:
            return self._r(length).decode("utf-8")
        except (MessageEOFError, UnicodeDecodeError) as exc:
            self._pos = start
            raise MessageFormatError(f"read_utf: no valid UTF string here ({exc})") from None

    def read_bytes(self, length: int | None = None) -> bytes:
        """Read up to ``length`` bytes (all that is left when omitted); at the
        end of the body returns ``b""``."""
        data = self._data
        if data is None:
            raise MessageNotReadableError("the body is write-only; call reset() before reading")
        end = len(data) if length is None else min(len(data), self._pos + length)
        chunk = data[self._pos : end]
        self._pos = end
        return chunk


# ---------------------------------------------------------------- stream


class StreamMessage(Message):
    """A message whose body is a sequence of typed values, read back in order
    with the JMS stream conversion table (``write_int`` reads back with
    ``read_long`` or ``read_string``, not ``read_short``)."""

    __slots__ = ("_items", "_pos")
    kind = "stream"

    def __init__(self, values: Iterable[Any] | None = None) -> None:
        super().__init__()
        self._items: list[Any] | tuple[Any, ...] = []
        self._pos = -1
        for value in values or ():
            self.write_object(value)

    def _clear_body(self) -> None:
        self._items = []
        self._pos = -1

    def _body_snapshot(self) -> Any:
        return tuple(self._items)

    def _set_body_from(self, body: Any) -> None:
        self._items = body
        self._pos = 0

    def reset(self) -> None:
        """Make the body read-only and move to its first value."""
        self._items = tuple(self._items)
        self._body_ro = True
        self._pos = 0

    def _append(self, value: Any) -> None:
        self._check_body_writable()
        if self._pos >= 0:
            raise MessageNotWriteableError("the body is in read mode; call clear_body() to write again")
        self._items.append(value)  # type: ignore[union-attr]

    def write_boolean(self, value: bool) -> None:
        self._append(_check_bool(value, "write_boolean"))

    def write_byte(self, value: int) -> None:
        self._append(_check_int(Byte, value, "write_byte"))

    def write_short(self, value: int) -> None:
        self._append(_check_int(Short, value, "write_short"))

    def write_char(self, value: str) -> None:
        if not isinstance(value, str) or len(value) != 1:
            raise MessageFormatError("write_char takes a one-character string")
        self._append(Char(value))

    def write_int(self, value: int) -> None:
        self._append(_check_int(Int, value, "write_int"))

    def write_long(self, value: int) -> None:
        self._append(_check_int(int, value, "write_long"))

    def write_float(self, value: float) -> None:
        self._append(_check_float(Float, value, "write_float"))

    def write_double(self, value: float) -> None:
        self._append(_check_float(float, value, "write_double"))

    def write_string(self, value: str | None) -> None:
        self._append(None if value is None else _check_str(value, "write_string"))

    def write_bytes(self, value: bytes) -> None:
        self._append(bytes(value))

    def write_object(self, value: BodyValue | bytearray | memoryview | None) -> None:
        if isinstance(value, (bytearray, memoryview)):
            value = bytes(value)
        self._append(None if value is None else _check_object(value, "write_object", allow_bytes=True))

    def _next(self, convert: Callable[..., Any], *args: Any) -> Any:
        if self._pos < 0:
            raise MessageNotReadableError("the body is write-only; call reset() before reading")
        if self._pos >= len(self._items):
            raise MessageEOFError("no more values in the stream")
        value = convert(*args, self._items[self._pos], f"stream value {self._pos}")
        self._pos += 1  # a failed conversion does not move past the value
        return value

    @staticmethod
    def _null_number(convert: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            if args[-2] is None:
                raise MessageFormatError(f"{args[-1]} is null and has no numeric value")
            return convert(*args)

        return run

    def read_boolean(self) -> bool:
        return self._next(lambda v, w: False if v is None else _to_bool(v, w))

    def read_byte(self) -> int:
        return self._next(self._null_number(_to_integer), Byte)

    def read_short(self) -> int:
        return self._next(self._null_number(_to_integer), Short)

    def read_char(self) -> str:
        return self._next(self._null_number(_to_char))

    def read_int(self) -> int:
        return self._next(self._null_number(_to_integer), Int)

    def read_long(self) -> int:
        return self._next(self._null_number(_to_integer), int)

    def read_float(self) -> float:
        return self._next(self._null_number(_to_float))

    def read_double(self) -> float:
        return self._next(self._null_number(_to_double))

    def read_string(self) -> str | None:
        return self._next(_to_string)

    def read_bytes(self) -> bytes | None:
        return self._next(_to_bytes)

    def read_object(self) -> BodyValue | None:
        result: BodyValue | None = self._next(lambda v, w: v)
        return result


# ---------------------------------------------------------------- object


class ObjectMessage(Message):
    """A message whose body is a Python value, read and written as ``object``.

    It never pickles. The value is serialised when set, as JSON with type tags,
    from an allow-list of plain types: ``None``, ``bool``, ``int``, ``float``
    (including nan and infinities), ``str``, ``bytes``, ``decimal.Decimal``,
    ``datetime.date``, ``datetime.datetime``, and ``list``, ``tuple``, ``dict``
    (string keys) and ``set``/``frozenset`` of these. Anything else raises
    :class:`MessageFormatError` at set time; reading builds a new value each time.
    """

    __slots__ = ("_data",)
    kind = "object"

    def __init__(self, obj: Any = None) -> None:
        super().__init__()
        self._data: bytes | None = None
        if obj is not None:
            self.object = obj

    @property
    def object(self) -> Any:
        return None if self._data is None else _decode_object(json.loads(self._data))

    @object.setter
    def object(self, value: Any) -> None:
        self._check_body_writable()
        self._data = None if value is None else json.dumps(_encode_object(value, 0), separators=(",", ":")).encode()

    def _clear_body(self) -> None:
        self._data = None

    def _body_snapshot(self) -> Any:
        return self._data

    def _set_body_from(self, body: Any) -> None:
        self._data = body


_MAX_OBJECT_DEPTH = 100


def _encode_object(value: Any, depth: int) -> Any:
    if depth > _MAX_OBJECT_DEPTH:
        raise MessageFormatError(f"object body nested deeper than {_MAX_OBJECT_DEPTH} levels")
    t = type(value)
    if value is None or t is bool or t is str:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$f": repr(float(value))}
    if t is bytes or t is bytearray:
        return {"$b": base64.b64encode(bytes(value)).decode()}
    if t is decimal.Decimal:
        return {"$d": str(value)}
    if t is _dt.datetime:
        return {"$dt": value.isoformat()}
    if t is _dt.date:
        return {"$date": value.isoformat()}
    if t is list:
        return [_encode_object(v, depth + 1) for v in value]
    if t is tuple:
        return {"$t": [_encode_object(v, depth + 1) for v in value]}
    if t is set or t is frozenset:
        return {"$s": [_encode_object(v, depth + 1) for v in value]}
    if t is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise MessageFormatError(f"object body: dict keys must be str, got {type(key).__name__}")
            out[key] = _encode_object(item, depth + 1)
        return {"$m": out} if any(k.startswith("$") for k in out) or len(out) == 1 else out
    raise MessageFormatError(
        f"object body: {t.__name__} is not allowed (allowed: None, bool, int, float, str, bytes, Decimal, date, "
        "datetime, list, tuple, dict with str keys, set)"
    )


def _decode_object(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode_object(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1:
            (tag, inner), = value.items()
            if tag == "$f":
                return float(inner)
            if tag == "$b":
                return base64.b64decode(inner)
            if tag == "$d":
                return decimal.Decimal(inner)
            if tag == "$dt":
                return _dt.datetime.fromisoformat(inner)
            if tag == "$date":
                return _dt.date.fromisoformat(inner)
            if tag == "$t":
                return tuple(_decode_object(v) for v in inner)
            if tag == "$s":
                return set(_decode_object(v) for v in inner)
            if tag == "$m":
                return {k: _decode_object(v) for k, v in inner.items()}
        return {k: _decode_object(v) for k, v in value.items()}
    return value


_KINDS: dict[str, type[Message]] = {
    cls.kind: cls for cls in (Message, TextMessage, XMLMessage, MapMessage, BytesMessage, StreamMessage, ObjectMessage)
}
