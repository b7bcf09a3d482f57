"""A received message from its stored envelope: the body kind picks the class."""

from __future__ import annotations

from collections.abc import Callable

from .._envelope import Envelope
from .base import Message
from .bytes_message import BytesMessage
from .map import MapMessage
from .object_message import ObjectMessage
from .stream import StreamMessage
from .text import TextMessage, XMLMessage

_KINDS: dict[str, type[Message]] = {
    cls.kind: cls for cls in (Message, TextMessage, XMLMessage, MapMessage, BytesMessage, StreamMessage, ObjectMessage)
}


def message_from_envelope(env: Envelope, delivery_count: int = 1, ack: Callable[[], None] | None = None) -> Message:
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
