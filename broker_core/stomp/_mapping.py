"""STOMP <-> JMS: destinations, headers, properties and bodies.

The mapping follows ActiveMQ's, which STOMP users know:

* destinations ``/queue/NAME``, ``/topic/NAME``, ``/temp-queue/NAME``,
  ``/temp-topic/NAME`` (``/remote-temp-queue/`` and ``/remote-temp-topic/``
  are accepted as synonyms for another connection's temporary destination);
* SEND headers ``persistent`` (``true``: PERSISTENT; default NON_PERSISTENT),
  ``priority`` (0-9), ``expires`` (epoch ms, 0 never), ``correlation-id``,
  ``reply-to``, ``type``; every other header becomes a string property;
* a body with ``content-length`` is a BytesMessage, without one a TextMessage
  (``amq-msg-type: text|bytes`` overrides, as in ActiveMQ, because many clients
  always add ``content-length``);
* the listener marks each message it receives with the boolean property
  ``JMS_StringNumbers`` (true) unless its ``selector_string_numbers`` is
  ``strict``: selectors then read its string properties as numbers where
  they want one (``amount > 100``), as ActiveMQ does for STOMP; a client
  cannot set that property itself, and it is not sent back out;
* MESSAGE frames carry ``message-id``, ``destination``, ``subscription``,
  ``ack`` (1.2), ``redelivered``, ``persistent``, ``priority``, ``expires``,
  ``timestamp``, ``correlation-id``, ``reply-to``, ``type`` and one header per
  property.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from .._constants import DeliveryMode
from .._destinations import Destination, TemporaryQueue, TemporaryTopic
from .._errors import InvalidArgumentError, InvalidDestinationError, InvalidPropertyError, MessageFormatError
from .._message import BytesMessage, Message, TextMessage
from .._selector import STRING_NUMBERS_PROPERTY
from ._frames import escape

__all__ = ["split_destination", "message_from_send", "encode_message", "SEND_HEADERS"]

_PREFIXES = (
    ("/queue/", "queue"),
    ("/topic/", "topic"),
    ("/temp-queue/", "temp-queue"),
    ("/temp-topic/", "temp-topic"),
    ("/remote-temp-queue/", "remote-temp-queue"),
    ("/remote-temp-topic/", "remote-temp-topic"),
)

#: SEND headers that are not copied into properties.
SEND_HEADERS = frozenset(
    {
        "destination",
        "content-length",
        "transaction",
        "receipt",
        "persistent",
        "priority",
        "expires",
        "correlation-id",
        "reply-to",
        "type",
        "message-id",
        "timestamp",
        "redelivered",
        "subscription",
        "ack",
        "amq-msg-type",
        "JMSDeliveryMode",
        "JMSPriority",
        "JMSExpiration",
        "JMSCorrelationID",
        "JMSReplyTo",
        "JMSType",
        "JMSMessageID",
        "JMSTimestamp",
        "JMSRedelivered",
        "JMSDestination",
        STRING_NUMBERS_PROPERTY,
    }
)


def split_destination(text: str) -> tuple[str, str]:
    """``"/queue/a.b"`` -> ``("queue", "a.b")``; InvalidDestinationError otherwise."""
    for prefix, kind in _PREFIXES:
        if text.startswith(prefix):
            name = text[len(prefix) :]
            if not name:
                break
            return kind, name
    raise InvalidDestinationError(
        f"invalid destination {text!r}: use /queue/NAME, /topic/NAME, /temp-queue/NAME or /temp-topic/NAME"
    )


def _bool(value: str) -> bool:
    return value.strip().lower() == "true"


def message_from_send(
    headers: dict[str, str], body: bytes, resolve: Callable[[str], Destination], string_numbers: bool = False
) -> tuple[Message, int, int, int]:
    """The JMS message a SEND frame describes, with its delivery mode,
    priority and time to live (ms) for ``producer.send``. ``resolve`` turns a
    STOMP destination (``reply-to``) into a broker destination;
    ``string_numbers`` marks the message for selectors that read its string
    properties as numbers."""
    kind = headers.get("amq-msg-type")
    if kind is None:
        kind = "bytes" if "content-length" in headers else "text"
    if kind == "bytes":
        message: Message = BytesMessage(body)
    elif kind == "text":
        try:
            message = TextMessage(body.decode("utf-8"))
        except UnicodeDecodeError:
            raise MessageFormatError(
                "the body is not UTF-8 text: send binary bodies with a content-length header (a BytesMessage)"
            ) from None
    else:
        raise InvalidArgumentError(f"amq-msg-type must be 'text' or 'bytes', got {kind!r}")
    mode = DeliveryMode.PERSISTENT if _bool(headers.get("persistent", "false")) else DeliveryMode.NON_PERSISTENT
    priority = 4
    value = headers.get("priority")
    if value is not None:
        try:
            priority = int(value)
        except ValueError:
            priority = -1
        if not 0 <= priority <= 9:
            raise InvalidArgumentError(f"priority must be an integer from 0 to 9, got {value!r}")
    ttl = 0
    value = headers.get("expires")
    if value is not None:
        try:
            expires = int(value)
        except ValueError:
            raise InvalidArgumentError(f"expires must be epoch milliseconds (0: never), got {value!r}") from None
        if expires > 0:
            ttl = max(1, expires - int(time.time() * 1000))
    value = headers.get("correlation-id")
    if value is not None:
        message.jms_correlation_id = value
    value = headers.get("reply-to")
    if value:
        message.jms_reply_to = resolve(value)
    value = headers.get("type")
    if value is not None:
        message.jms_type = value
    props = message._props
    for name, value in headers.items():
        if name in SEND_HEADERS:
            continue
        try:
            message.set_string_property(name, value)
        except InvalidPropertyError:
            if name.startswith("JMS"):
                continue  # reserved for the broker: never taken from a client
            props[name] = value  # not a Java identifier (content-type, x-foo): kept, not selectable
    if string_numbers:
        props[STRING_NUMBERS_PROPERTY] = True
    return message, mode, priority, ttl


def _property_text(value: Any) -> str | None:
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    return None  # bytes and other values have no header form


def encode_message(
    env: Any,
    subscription: str,
    ack: str | None,
    redelivered: bool,
    version: str,
    destination_text: Callable[[Destination], str],
) -> bytes:
    """The MESSAGE frame for one delivery of envelope ``env``."""
    esc = version != "1.0"
    lines = [
        "MESSAGE",
        "message-id:" + (escape(env.message_id, version) if esc else env.message_id),
        "destination:" + escape(destination_text(env.destination), version),
        "subscription:" + escape(subscription, version),
    ]
    if ack is not None:
        lines.append("ack:" + ack)
    lines.append("redelivered:true" if redelivered else "redelivered:false")
    lines.append("persistent:true" if env.delivery_mode == 2 else "persistent:false")
    lines.append(f"priority:{env.priority}")
    lines.append(f"expires:{env.expiration}")
    lines.append(f"timestamp:{env.timestamp}")
    if env.correlation_id is not None:
        lines.append("correlation-id:" + escape(env.correlation_id, version))
    if env.reply_to is not None:
        lines.append("reply-to:" + escape(destination_text(env.reply_to), version))
    if env.type is not None:
        lines.append("type:" + escape(env.type, version))
    kind = env.kind
    body = env.body
    if kind == "text" or kind == "xml":
        data = body.encode("utf-8") if body is not None else b""
        if b"\0" in data:
            lines.append(f"content-length:{len(data)}")
            lines.append("amq-msg-type:text")
    elif kind == "bytes" or kind == "object":
        data = body or b""
        lines.append(f"content-length:{len(data)}")
    elif kind == "map" or kind == "stream":
        data = json.dumps(body if kind == "map" else list(body or ()), default=_json_default).encode("utf-8")
        lines.append("transformation:jms-" + kind + "-json")
        lines.append(f"content-length:{len(data)}")
    else:
        data = b""
    props = env.properties
    if props:
        taken = _RESERVED_OUT
        for name, value in props.items():
            if name in taken:
                continue
            text = _property_text(value)
            if text is not None:
                lines.append(escape(name, version) + ":" + escape(text, version))
    lines.append("\n")
    return "\n".join(lines).encode("utf-8") + data + b"\0"


_RESERVED_OUT = frozenset(
    {
        "message-id",
        "destination",
        "subscription",
        "ack",
        "redelivered",
        "persistent",
        "priority",
        "expires",
        "timestamp",
        "correlation-id",
        "reply-to",
        "type",
        "content-length",
        "transformation",
        "amq-msg-type",
        STRING_NUMBERS_PROPERTY,
    }
)


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return list(value)
    return str(value)


def is_temporary(destination: Destination) -> bool:
    return isinstance(destination, (TemporaryQueue, TemporaryTopic))
