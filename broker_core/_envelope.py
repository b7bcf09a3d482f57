"""The immutable record of a sent message, as stores keep it.

A producer's ``send`` snapshots the user's message into an :class:`Envelope`
so that later changes to the message object do not affect what was sent; a
consumer's ``receive`` wraps an envelope in a fresh read-only message. Topic
subscriptions share one envelope.

Property values carry their JMS type in their Python type: ``bool``, ``str``,
``int`` (long), ``float`` (double), and the narrow subclasses :class:`Byte`,
:class:`Short`, :class:`Int` (of ``int``) and :class:`Float` (of ``float``).
"""

from __future__ import annotations

from typing import Any

from lxml import etree

__all__ = ["Envelope", "Byte", "Short", "Int", "Float", "PERSISTENT", "NON_PERSISTENT", "hardened_xml_parser"]

NON_PERSISTENT = 1
PERSISTENT = 2


class Byte(int):
    """A JMS ``byte`` property value (-128..127)."""

    __slots__ = ()


class Short(int):
    """A JMS ``short`` property value (-32768..32767)."""

    __slots__ = ()


class Int(int):
    """A JMS ``int`` property value (32-bit)."""

    __slots__ = ()


class Float(float):
    """A JMS ``float`` property value (single precision)."""

    __slots__ = ()


def hardened_xml_parser() -> etree.XMLParser:
    """An lxml parser that refuses DTDs, entities and network access."""
    return etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        huge_tree=False,
        remove_blank_text=False,
    )


_PARSER = hardened_xml_parser()
_NOT_XML = object()


class Envelope:
    """One sent message: headers, properties and an immutable body.

    ``kind`` names the body type (``"message"``, ``"text"``, ``"xml"``,
    ``"map"``, ``"bytes"``, ``"stream"``, ``"object"``); ``body`` is ``None``,
    a ``str`` (text, xml), a ``dict`` never mutated after send (map),
    ``bytes`` (bytes, object) or a ``tuple`` of typed values (stream).
    ``origin`` is the id of the connection that sent it (for ``no_local``).
    ``encoded`` is the body's UTF-8 encoding when the sender had it at hand
    (an :class:`XMLMessage` made from the bytes received), else ``None``: the
    SQL store writes it instead of encoding the text again.
    """

    __slots__ = (
        "message_id",
        "destination",
        "delivery_mode",
        "priority",
        "expiration",
        "timestamp",
        "correlation_id",
        "reply_to",
        "type",
        "properties",
        "kind",
        "body",
        "origin",
        "encoded",
        "_xml",
        "__weakref__",  # so that a listener can count the memory its messages hold
    )

    def __init__(
        self,
        message_id: str,
        destination: Any,
        delivery_mode: int,
        priority: int,
        expiration: int,
        timestamp: int,
        correlation_id: str | None,
        reply_to: Any,
        type: str | None,
        properties: dict[str, Any],
        kind: str,
        body: Any,
        origin: str | None = None,
        encoded: bytes | None = None,
    ) -> None:
        self.message_id = message_id
        self.destination = destination
        self.delivery_mode = delivery_mode
        self.priority = priority
        self.expiration = expiration
        self.timestamp = timestamp
        self.correlation_id = correlation_id
        self.reply_to = reply_to
        self.type = type
        self.properties = properties
        self.kind = kind
        self.body = body
        self.origin = origin
        self.encoded = encoded
        self._xml = None

    def xml_root(self) -> Any:
        """The body parsed as XML (an lxml element), or ``None`` when the body is
        not text or not well-formed XML. Parsed once, with a hardened parser."""
        xml = self._xml
        if xml is None:
            xml = _NOT_XML
            if self.kind in ("xml", "text") and self.body:
                try:
                    encoded = self.encoded
                    xml = etree.fromstring(encoded if encoded is not None else self.body.encode("utf-8"), _PARSER)
                except (etree.XMLSyntaxError, ValueError):
                    xml = _NOT_XML
            self._xml = xml
        return None if xml is _NOT_XML else xml

    def expired(self, now_ms: int) -> bool:
        return 0 < self.expiration <= now_ms

    def replace(self, **changes: Any) -> Envelope:
        """A copy with some fields changed (used for dead letters and replays)."""
        fields = {name: getattr(self, name) for name in self.__slots__ if not name.startswith("_")}
        if "body" in changes:
            fields["encoded"] = None  # the old body's
        fields.update(changes)
        return Envelope(**fields)

    def __repr__(self) -> str:
        return f"<Envelope {self.message_id} {self.kind} to {self.destination!r} prio={self.priority}>"
