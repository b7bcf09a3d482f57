"""What the STOMP listener lets clients hold, and the memory its messages take.

Every limit has a safe default and its own ERROR frame (``message`` header
below), after which the connection closes. :class:`MemoryBudget` counts the
messages the listener put in memory (non-persistent ones, and every one on
the memory store) until the broker lets go of them, and the bodies staged in
open transactions; a SEND that finds it full waits for room (producer flow
control: the client is slowed, its socket not read) and is refused after
``send_wait`` seconds. The process is never the one that gives.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

__all__ = ["StompLimits", "MemoryBudget", "MESSAGE_OVERHEAD"]

#: bytes counted for one message besides its body and headers (envelope, entries, dicts)
MESSAGE_OVERHEAD = 512


@dataclasses.dataclass(frozen=True)
class StompLimits:
    """Per listener, per user and per connection bounds (see the docs' table)."""

    #: open connections, all users together (one more is refused before anything is read)
    connections: int = 1000
    #: open connections of one login
    connections_per_user: int = 100
    #: bytes of a frame (command, headers and body) before CONNECT succeeds
    connect_frame_bytes: int = 8192
    #: seconds from the TCP accept to CONNECTED (authentication included)
    connect_timeout: float = 10.0
    #: SUBSCRIBEs open on one connection
    subscriptions: int = 200
    #: transactions open on one connection
    transactions: int = 16
    #: temporary queues and topics one connection creates
    temporary_destinations: int = 100
    #: SENDs and ACK/NACKs held in one open transaction
    transaction_messages: int = 10000
    #: bytes of messages held in memory (non-persistent messages, open transactions)
    memory_bytes: int = 64 * 1024 * 1024
    #: seconds a SEND waits for memory before it is refused
    send_wait: float = 10.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"STOMP limit {field.name} must be a positive number, got {value!r}")
        if self.connect_frame_bytes < 256:
            raise ValueError("STOMP limit connect_frame_bytes must be at least 256 (a CONNECT frame must fit)")


class _Held(weakref.ref):
    """A reference to a message's envelope that remembers the bytes it counts."""

    __slots__ = ("size",)


class MemoryBudget:
    """Bytes held by the listener's messages. The broker lets go of an
    envelope in whichever thread acknowledges or expires it: the callback
    only appends to a list (atomic), and the event loop's thread, the only
    one that adds, folds the releases in when it reads :attr:`held`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._added = 0
        self._released: list[int] = []
        self._refs: set[_Held] = set()
        self._gone = self._make_gone()

    def _make_gone(self) -> Any:
        released = self._released.append
        refs = self._refs.discard

        def gone(ref: _Held) -> None:
            released(ref.size)
            refs(ref)

        return gone

    @property
    def held(self) -> int:
        released = self._released
        while released:
            self._added -= released.pop()
        return self._added

    def snapshot(self) -> int:
        """:attr:`held` as another thread may read it (without folding anything in)."""
        return self._added - sum(self._released[:])

    @property
    def full(self) -> bool:
        return self.held >= self.limit

    def add(self, size: int) -> None:
        self._added += size

    def remove(self, size: int) -> None:
        self._released.append(size)

    def track(self, envelope: Any, size: int) -> None:
        """Count *size* bytes until *envelope* is gone (consumed, expired, purged)."""
        ref = _Held(envelope, self._gone)
        ref.size = size
        self._refs.add(ref)
        self._added += size
