"""Destinations: queues, topics and their temporary kinds.

Destinations compare equal by type and name (``Queue("a") == Queue("a")``,
``Queue("a") != Topic("a")``) and print as ``queue://a``, ``topic://a``,
``temp-queue://ID:...``, ``temp-topic://ID:...``.
"""

from __future__ import annotations

import re
from typing import Any

from ._errors import IllegalStateError, InvalidDestinationError

__all__ = ["Destination", "Queue", "Topic", "TemporaryQueue", "TemporaryTopic", "parse_destination"]

_NAME = re.compile(r"^[A-Za-z0-9_$][A-Za-z0-9_$.\-:/@#*>]{0,248}$")


class Destination:
    """Where messages are sent: a :class:`Queue` or a :class:`Topic`."""

    __slots__ = ("name", "_hash")
    scheme = ""
    is_temporary = False
    is_topic = False

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidDestinationError(
                f"invalid destination name {name!r}: use 1-249 characters from letters, digits and _$.-:/@#*>, "
                "not starting with punctuation"
            )
        self.name = name
        self._hash = hash((self.scheme, name))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Destination) and other.scheme == self.scheme and other.name == self.name

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.name}"


class Queue(Destination):
    """A point-to-point destination: each message goes to exactly one consumer."""

    __slots__ = ()
    scheme = "queue"


class Topic(Destination):
    """A publish-subscribe destination: each subscription gets its own copy."""

    __slots__ = ()
    scheme = "topic"
    is_topic = True


class _Temporary:
    """Mixin for destinations that live as long as the connection that made them."""

    __slots__ = ()
    is_temporary = True

    def delete(self) -> None:
        """Delete the destination. Only its creating connection may, and only
        while it has no consumers (else :class:`IllegalStateError`)."""
        owner = getattr(self, "_owner", None)
        if owner is None:
            raise IllegalStateError(f"{self} can only be deleted by the connection that created it")
        owner._delete_temporary(self)


class TemporaryQueue(_Temporary, Queue):
    """A queue private to the connection that created it (reply queues)."""

    __slots__ = ("_owner",)
    scheme = "temp-queue"

    def __init__(self, name: str, owner: Any = None) -> None:
        super().__init__(name)
        self._owner = owner


class TemporaryTopic(_Temporary, Topic):
    """A topic whose subscribers can only be on the connection that created it."""

    __slots__ = ("_owner",)
    scheme = "temp-topic"

    def __init__(self, name: str, owner: Any = None) -> None:
        super().__init__(name)
        self._owner = owner


_SCHEMES = {cls.scheme: cls for cls in (Queue, Topic, TemporaryQueue, TemporaryTopic)}


def parse_destination(text: str) -> Destination:
    """Parse ``queue://name`` (also ``topic://``, ``temp-queue://``, ``temp-topic://``)."""
    scheme, sep, name = text.partition("://")
    cls = _SCHEMES.get(scheme)
    if not sep or cls is None:
        raise InvalidDestinationError(
            f"invalid destination {text!r}: expected queue://NAME, topic://NAME, temp-queue://NAME or temp-topic://NAME"
        )
    return cls(name)
