"""What the parts of the SQL store share: the columns and conditions of its
queries, the PostgreSQL wake-up channel and the per-box counters."""

from __future__ import annotations

import collections
import threading

import sqlalchemy as sa

from .._envelope import Envelope
from . import _codec
from ._schema import entries, messages

_CHANNEL = "b2b_available"
_MESSAGE_COLS = [messages.c[name] for name in _codec.MESSAGE_COLUMNS]
#: What a claim returns of each entry.
_CLAIMED = [
    entries.c.id,
    entries.c.box,
    entries.c.delivery_count,
    entries.c.seq,
    entries.c.priority,
    entries.c.expiration,
    entries.c.message,
]
#: A claimed entry (the columns of ``_CLAIMED``, in order).
_Claimed = collections.namedtuple("_Claimed", "id box delivery_count seq priority expiration message")
#: Entry columns copied when an entry is put back under a new id.
_COPY_COLS = [entries.c.box, entries.c.seq, entries.c.priority, entries.c.expiration, entries.c.message]
_JOINED = entries.join(messages, entries.c.message == messages.c.id)
#: The conditions of the partial indexes (migration 0004), spelled as literals
#: so that the planners can use them (a bound parameter implies nothing).
_WAITING = sa.text("b2b_entries.state = 0")
_IN_FLIGHT = sa.text("b2b_entries.state = 1")
_EXPIRING = sa.text("b2b_entries.expiration > 0")


def _body_size(env: Envelope) -> int:
    body = env.body
    size = len(body) if isinstance(body, (str, bytes)) else 256
    return size if env.encoded is None else size + len(env.encoded)  # the bytes it came with count too


class _Counters:
    """In-process counters per box: enqueued, dequeued, expired, dead-lettered, redelivered; and how much
    of them was added to the shared ``b2b_box_counters`` already (:meth:`unshared`, :meth:`shared`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_box: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0, 0])
        self._shared: dict[str, list[int]] = {}

    def add(self, box: str, index: int, n: int = 1) -> None:
        with self._lock:
            self._by_box[box][index] += n

    def get(self, box: str) -> list[int]:
        """What this process counted and has not added to the shared table yet."""
        with self._lock:
            counted = self._by_box.get(box, (0, 0, 0, 0, 0))
            shared = self._shared.get(box, (0, 0, 0, 0, 0))
            return [a - b for a, b in zip(counted, shared, strict=False)]

    def boxes(self) -> list[str]:
        with self._lock:
            return list(self._by_box)

    def unshared(self) -> dict[str, list[int]]:
        """``{box: [count, ...]}``: the counts of shared boxes not yet in the shared table."""
        with self._lock:
            out = {}
            for box, counted in self._by_box.items():
                if not _shared_box(box):
                    continue
                shared = self._shared.get(box, (0, 0, 0, 0, 0))
                delta = [a - b for a, b in zip(counted, shared, strict=False)]
                if any(delta):
                    out[box] = delta
            return out

    def shared(self, deltas: dict[str, list[int]]) -> None:
        """Note that *deltas* (from :meth:`unshared`) are in the shared table now."""
        with self._lock:
            for box, delta in deltas.items():
                shared = self._shared.setdefault(box, [0, 0, 0, 0, 0])
                for i, n in enumerate(delta):
                    shared[i] += n


def _shared_box(box: str) -> bool:
    """Whether a box's counters go to the shared table: not those of temporary destinations and
    non-durable subscriptions, which come and go with their connections (their counts stay in-process)."""
    return not box.startswith(("temp-", "subscriber://"))


ENQ, DEQ, EXP, DLQ, RED = range(5)
