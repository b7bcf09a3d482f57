"""Messages: headers, typed properties and the six JMS body types.

Headers are attributes (``jms_message_id``, ``jms_priority``, ...). Properties
are typed and follow the JMS conversion table (JMS 1.1, 3.5.4): a value set as
``int`` reads back as ``long`` or ``str`` but not as ``short``. A received
message is read-only until ``clear_properties()`` / ``clear_body()``.

The modules: :mod:`.properties` (property names and the conversion table),
:mod:`.base` (:class:`Message`: headers and properties), one module per body
type (:mod:`.text`, :mod:`.map`, :mod:`.bytes_message`, :mod:`.stream`,
:mod:`.object_message`), and :mod:`.envelope` (a received message from its
stored envelope).
"""

from .base import Message
from .bytes_message import BytesMessage
from .envelope import message_from_envelope
from .map import MapMessage
from .object_message import ObjectMessage
from .properties import BodyValue, Char, PropertyValue, check_property_name
from .stream import StreamMessage
from .text import TextMessage, XMLMessage

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
    "message_from_envelope",
    "BodyValue",
    "PropertyValue",
]
