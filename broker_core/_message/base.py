"""The base :class:`Message`: headers, typed properties, acknowledgement, and
the envelope it is sent as."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._constants import DEFAULT_PRIORITY, DeliveryMode
from .._destinations import Destination
from .._envelope import Byte, Envelope, Float, Int, Short
from .._errors import MessageFormatError, MessageNotWriteableError
from .properties import (
    PropertyValue,
    check_bool,
    check_float,
    check_int,
    check_object,
    check_property_name,
    check_str,
    to_bool,
    to_double,
    to_float,
    to_integer,
    to_string,
)

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
        self._writable_props()[check_property_name(name)] = check_bool(value, f"property {name!r}")

    def set_byte_property(self, name: str, value: int) -> None:
        self._writable_props()[check_property_name(name)] = check_int(Byte, value, f"property {name!r}")

    def set_short_property(self, name: str, value: int) -> None:
        self._writable_props()[check_property_name(name)] = check_int(Short, value, f"property {name!r}")

    def set_int_property(self, name: str, value: int) -> None:
        self._writable_props()[check_property_name(name)] = check_int(Int, value, f"property {name!r}")

    def set_long_property(self, name: str, value: int) -> None:
        self._writable_props()[check_property_name(name)] = check_int(int, value, f"property {name!r}")

    def set_float_property(self, name: str, value: float) -> None:
        self._writable_props()[check_property_name(name)] = check_float(Float, value, f"property {name!r}")

    def set_double_property(self, name: str, value: float) -> None:
        self._writable_props()[check_property_name(name)] = check_float(float, value, f"property {name!r}")

    def set_string_property(self, name: str, value: str) -> None:
        props = self._writable_props()
        if value.__class__ is not str:
            value = check_str(value, f"property {name!r}")
        props[check_property_name(name)] = value

    def set_object_property(self, name: str, value: PropertyValue) -> None:
        """Set a property from a ``bool``, ``int`` (stored as long), ``float``
        (double), ``str``, or one of the narrow types ``Byte``, ``Short``,
        ``Int``, ``Float``."""
        what = f"property {name!r}"
        self._writable_props()[check_property_name(name)] = check_object(value, what, allow_bytes=False)

    def get_boolean_property(self, name: str) -> bool:
        value = self._get(name)
        return False if value is None else to_bool(value, f"property {name!r}")

    def _get_number(self, name: str, convert: Callable[..., Any], *args: Any) -> Any:
        value = self._get(name)
        if value is None:
            raise MessageFormatError(f"property {name!r} is not set, so it has no numeric value")
        return convert(*args, value, f"property {name!r}")

    def get_byte_property(self, name: str) -> int:
        return self._get_number(name, to_integer, Byte)

    def get_short_property(self, name: str) -> int:
        return self._get_number(name, to_integer, Short)

    def get_int_property(self, name: str) -> int:
        return self._get_number(name, to_integer, Int)

    def get_long_property(self, name: str) -> int:
        return self._get_number(name, to_integer, int)

    def get_float_property(self, name: str) -> float:
        return self._get_number(name, to_float)

    def get_double_property(self, name: str) -> float:
        return self._get_number(name, to_double)

    def get_string_property(self, name: str) -> str | None:
        return to_string(self._get(name), f"property {name!r}")

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

    def _to_envelope(
        self,
        message_id: str,
        destination: Destination,
        delivery_mode: int,
        priority: int,
        expiration: int,
        timestamp: int,
        origin: str | None,
    ) -> Envelope:
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
