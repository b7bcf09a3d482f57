"""JMS message selectors, compiled once and evaluated per message.

The broker compiles the selectors of consumers and browsers itself; this
module is for tools that check or time selectors outside a broker: compile
with :func:`compile_selector`, take a :func:`snapshot` of a message as it
would be sent, and call :meth:`Selector.matches` on it.
"""

from __future__ import annotations

from ._destinations import Destination, Queue
from ._envelope import Envelope
from ._message import Message
from ._selector import STRING_NUMBERS_PROPERTY, Selector, compile_selector, string_number

__all__ = ["STRING_NUMBERS_PROPERTY", "Envelope", "Selector", "compile_selector", "snapshot", "string_number"]


def snapshot(message: Message, destination: Destination | None = None) -> Envelope:
    """What a selector reads of *message* once sent to *destination* (its own
    destination by default, else a queue ``selectors``): its headers, properties
    and body, frozen as a send would freeze them."""
    where = destination or message.jms_destination or Queue("selectors")
    return message._to_envelope(
        message.jms_message_id or "ID:snapshot",
        where,
        message.jms_delivery_mode,
        message.jms_priority,
        message.jms_expiration,
        message.jms_timestamp,
        None,
    )
