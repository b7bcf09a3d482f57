"""What an operator browsing a queue gets: a page of messages and the cursor of
the next page."""

from __future__ import annotations

import dataclasses
from typing import Any

from ._errors import InvalidArgumentError
from ._store import StoredMessage

__all__ = ["BrowsePage", "BrowsedMessage"]


@dataclasses.dataclass(frozen=True)
class BrowsedMessage:
    """A message in a queue or subscription, as an operator sees it (:meth:`Broker.browse_page`,
    :meth:`Broker.find_message`). ``kind``: ``text``, ``xml``, ``bytes``, ``map``, ``stream`` or
    ``object``; ``body`` is ``None`` in browse pages (:meth:`Broker.find_message` has it); ``size``: the
    body's bytes as sent; ``state``: ``"pending"`` or ``"in_flight"``; ``cursor``: where a page that
    ends with it continues."""

    box: str
    message_id: str
    destination: str
    priority: int
    timestamp: int
    expiration: int
    delivery_mode: int
    correlation_id: str | None
    reply_to: str | None
    type: str | None
    properties: dict[str, Any]
    kind: str
    body: Any
    size: int
    state: str
    delivery_count: int
    cursor: str

    @classmethod
    def _of(cls, stored: StoredMessage, body: bool = True) -> BrowsedMessage:
        env = stored.envelope
        return cls(
            stored.box,
            env.message_id,
            str(env.destination),
            env.priority,
            env.timestamp,
            env.expiration,
            env.delivery_mode,
            env.correlation_id,
            None if env.reply_to is None else str(env.reply_to),
            env.type,
            dict(env.properties),
            env.kind,
            env.body if body else None,
            stored.size,
            stored.state,
            stored.delivery_count,
            _cursor(stored.position),
        )


@dataclasses.dataclass(frozen=True)
class BrowsePage:
    """One page of :meth:`Broker.browse_page`: the ``messages``, and the ``cursor`` to pass for the next
    page (``None``: nothing more). A page may hold fewer messages than asked, even none, and still have a
    cursor: it stopped after looking at its ``scan_limit`` of messages that did not match."""

    messages: list[BrowsedMessage]
    cursor: str | None


def _cursor(position: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in position)


def _position(cursor: str | None) -> tuple[int, ...] | None:
    if cursor is None or cursor == "":
        return None
    try:
        parts = tuple(int(part) for part in cursor.split("."))
    except ValueError:
        parts = ()
    if not parts or len(parts) > 6 or len(cursor) > 200:
        raise InvalidArgumentError(f"cursor {cursor[:40]!r} is not one a browse page gave; start again without it")
    return parts
