"""A consumer's reader over the SQL store (both tiers of one box)."""

from __future__ import annotations

import asyncio
import collections
import heapq
import logging
import threading
from typing import TYPE_CHECKING, Any

from .._envelope import Envelope
from .._errors import StoreError
from .._store import Delivery, Reader
from . import _codec
from ._common import _body_size

if TYPE_CHECKING:
    from ._store import SQLStore

__all__ = ["_SQLReader"]

log = logging.getLogger(__name__)

#: How many candidates beyond its prefetch a selective consumer offers to one claim.
_CLAIM_WINDOW = 15
#: A consumer's claims grow (up to its prefetch) only while the bodies each one got came to less than half of
#: this: a large prefetch on large messages must not hold thousands of documents in memory at once.
CLAIM_BYTES = 8 << 20


class _SQLReader(Reader):
    """A consumer's cursor over both tiers of one box.

    Rows are claimed ``prefetch`` at a time (fewer while the box is quiet, or
    while a claim's bodies come near :data:`CLAIM_BYTES`) and handed out one
    by one. With a selector, new rows are scanned once each (by id, which
    grows in commit order), matching ones kept as candidates, so a selective
    consumer never rescans a backlog it does not match.
    """

    def __init__(self, store: SQLStore, box: str, selector: Any, memory: Reader, prefetch: int | None = None) -> None:
        self._store = store
        #: at most this many entries claimed for the consumer at once
        self.prefetch = max(1, prefetch if prefetch is not None else store.prefetch)
        self._box = box
        self._selector = selector
        self._memory = memory
        self._buffer: collections.deque[Delivery] = collections.deque()
        self._batch = 1
        self._empty_at: int | None = None  # box version when a claim last found nothing
        self._flip = False
        self._closed = False
        self._lock = threading.Lock()
        # selective state
        self._cursor = 0
        self._candidates: list[tuple[int, int, int, int]] = []  # (-priority, seq, id, ready_at)
        self._needs_body = selector is not None and "XPATH" in selector.text.upper()
        self._inbox_lock = threading.Lock()  # the writer's hand-over vs close; never held while waiting
        store._register_reader(self)

    def claim(self, now: int, auto_ack: bool) -> Delivery | None:
        self._flip = not self._flip
        if self._flip:
            return self._memory.claim(now, auto_ack) or self._claim_sql(now, auto_ack)
        return self._claim_sql(now, auto_ack) or self._memory.claim(now, auto_ack)

    def _claim_sql(self, now: int, auto_ack: bool) -> Delivery | None:
        store = self._store
        with self._lock:
            while True:
                if self._closed:  # a claim now would hold rows that close() can no longer give back
                    return None
                if not self._buffer:
                    # A consumer woken by a completion callback (a commit_async whose memory-tier sends
                    # wake it) runs in the writer's thread, where a claim's write would wait for itself:
                    # it takes from the memory tier only, and finds the rows at its next wake-up.
                    if threading.get_ident() == store._writer_thread or not self._fill(now):
                        return None
                delivery = self._hand_out(now, auto_ack)
                if delivery is not None:
                    return delivery

    async def claim_async(self, now: int, auto_ack: bool) -> Delivery | None:
        """:meth:`claim` on an event loop. A plain consumer's claim is a writer operation whose
        completion wakes the loop: no thread hand-over each way, as ``asyncio.to_thread`` would cost
        per message. A selective one scans with reads of its own, in a thread. Either way the rows
        claimed go to the buffer first, so that a task cancelled while it waits loses none of them."""
        self._flip = not self._flip
        if self._flip:
            return self._memory.claim(now, auto_ack) or await self._claim_sql_async(now, auto_ack)
        return await self._claim_sql_async(now, auto_ack) or self._memory.claim(now, auto_ack)

    async def _claim_sql_async(self, now: int, auto_ack: bool) -> Delivery | None:
        # The lock is never held across the await: close() from another thread must not wait for the loop.
        while True:
            with self._lock:
                if self._closed:
                    return None
                if self._buffer:
                    delivery = self._hand_out(now, auto_ack)
                    if delivery is not None:
                        return delivery
                    continue
                if self._selector is None and not self._worth_claiming(now):
                    return None
                version, batch = self._store._version(self._box), self._batch
            if self._selector is not None:
                if not await asyncio.to_thread(self._fill_selective_now, now):
                    return None
                continue
            # the rows land in the buffer (or go back, if closed meanwhile) even if this task is cancelled
            got, size = await self._store._claim_rows_async(self, batch, now)
            with self._lock:
                if not self._grown(got, version, batch, size):
                    return None

    def _fill_selective_now(self, now: int) -> bool:
        with self._lock:
            return not self._closed and self._fill_selective(now)

    def _hand_out(self, now: int, auto_ack: bool) -> Delivery | None:
        """The next prefetched entry, unless it expired meanwhile (then None: look again)."""
        store = self._store
        delivery = self._buffer.popleft()
        env = delivery.envelope
        if env.expiration and env.expiration <= now:
            store._expire_held(delivery)
            return None
        if auto_ack:
            store.ack([delivery], wait=False)
        return delivery

    def claim_may_wait(self, now: int) -> bool:
        """A claim writes unless it takes a row held already or nothing changed since the box was empty."""
        return not self._buffer and (self._selector is not None or self._worth_claiming(now))

    def _worth_claiming(self, now: int) -> bool:
        """False when nothing changed since a claim found the box empty (saves a write)."""
        if self._empty_at is None or self._empty_at != self._store._version(self._box):
            return True
        ready = self._store._next_ready.get(self._box)
        return ready is not None and ready <= now

    def _fill(self, now: int) -> bool:
        store = self._store
        if self._selector is not None:
            return self._fill_selective(now)
        if not self._worth_claiming(now):
            return False
        version, batch = store._version(self._box), self._batch
        return self._filled(store._claim_rows(self._box, batch, None, now), version, batch)

    def _filled(self, rows: list[Delivery], version: int, batch: int) -> bool:
        """Keep what a claim of ``batch`` rows, asked at box ``version``, got. False if it got nothing."""
        if self._grown(len(rows), version, batch, sum(_body_size(d.envelope) for d in rows)):
            self._extend(rows)
            return True
        return False

    def _grown(self, got: int, version: int, batch: int, size: int) -> bool:
        """After a claim of ``batch`` rows asked at box ``version`` got ``got`` rows of ``size`` bytes of
        bodies: the next claim grows while claims come back full and small (:data:`CLAIM_BYTES`), and
        shrinks to what fits in it. False if it got nothing."""
        if not got:
            self._empty_at = version
            self._batch = 1
            return False
        self._empty_at = None
        if size * 2 > CLAIM_BYTES:
            self._batch = max(1, min(got, got * CLAIM_BYTES // size))
        else:
            self._batch = min(self.prefetch, batch * 2) if got == batch else max(1, got)
        return True

    def _extend(self, deliveries: list[Delivery]) -> None:
        self._buffer.extend(deliveries)

    def _waiting_for_new(self) -> bool:
        """For the writer: this reader found its box empty, nothing came in
        since, it holds nothing, and its consumer is waiting."""
        demand = self.demand
        return (
            not self._buffer
            and not self._candidates
            and self._empty_at is not None
            and not self._closed
            and self._empty_at == self._store._version(self._box)
            and demand is not None
            and demand()
        )

    def _accept(self, deliveries: list[Delivery], wake: bool = True) -> bool:
        """Entries claimed for this reader by the writer (*wake*: its consumer waits for them); False if
        closed."""
        with self._inbox_lock:
            if self._closed:
                return False
            self._buffer.extend(deliveries)
        waker = self.wake
        if wake and waker is not None:
            waker()
        return True

    def _scan(self, now: int) -> None:
        store = self._store
        statement = store._sql.scan[self._needs_body]
        selector = self._selector
        decode_properties, read_body = _codec.decode_properties, _codec.read_body
        with store.engine.connect() as conn:
            while True:
                rows = conn.exec_driver_sql(statement, (self._box, self._cursor)).cursor.fetchall()
                for row in rows:
                    (
                        entry_id,
                        priority,
                        seq,
                        ready_at,
                        expiration,
                        message_id,
                        timestamp,
                        correlation_id,
                        type_,
                        delivery_mode,
                        properties,
                        kind,
                    ) = row[:12]
                    self._cursor = entry_id
                    if 0 < expiration <= now:
                        continue
                    if self._needs_body:
                        kind, body = read_body(kind, row[12])
                    else:
                        kind, body = kind.removesuffix(_codec.COMPRESSED), None
                    env = Envelope(
                        message_id,
                        None,
                        delivery_mode,
                        priority,
                        expiration,
                        timestamp,
                        correlation_id,
                        None,
                        type_,
                        decode_properties(properties),
                        kind,
                        body,
                    )
                    if selector.matches(env):
                        heapq.heappush(self._candidates, (-priority, seq, entry_id, ready_at))
                if len(rows) < 5000:
                    conn.rollback()
                    return

    def _fill_selective(self, now: int) -> bool:
        store = self._store
        version = store._version(self._box)
        if self._empty_at != version:
            self._empty_at = version  # before scanning: a change during the scan is seen next time
            self._scan(now)
        # Competing consumers see the same candidates and want the oldest: offering a window of them,
        # of which the claim takes the first ``prefetch`` still waiting, turns a collision into taking
        # the next one in the same transaction rather than another transaction per candidate.
        window = max(self.prefetch, min(64, self.prefetch + _CLAIM_WINDOW))
        while self._candidates:
            picked, later = [], []
            while self._candidates and len(picked) < window:
                item = heapq.heappop(self._candidates)
                (later if item[3] > now else picked).append(item)
            for item in later:
                heapq.heappush(self._candidates, item)
            if not picked:
                return False
            want = min(self.prefetch, len(picked))
            rows = store._claim_rows(self._box, want, [item[2] for item in picked], now)
            if len(picked) > want and len(rows) == want:
                # the claim took the first ``want`` still waiting, in the order of ``picked``: the
                # candidates after the last one taken may still be waiting, the ones before were gone
                got = {d.ref for d in rows}
                last = max(i for i, item in enumerate(picked) if item[2] in got) if got else len(picked)
                for item in picked[last + 1 :]:
                    if item[2] not in got:
                        heapq.heappush(self._candidates, item)
            if rows:
                self._extend(rows)
                return True
        return False

    def next_ready(self) -> int | None:
        ready = self._store._next_ready.get(self._box)
        if self._selector is not None and self._candidates:
            delayed = [item[3] for item in self._candidates if item[3] > 0]
            if delayed:
                ready = min(delayed) if ready is None else min(ready, min(delayed))
        memory = self._memory.next_ready()
        if ready is None:
            return memory
        return ready if memory is None else min(ready, memory)

    def release_held(self) -> None:
        """Give back prefetched rows that were never handed out (see Reader.release_held)."""
        with self._lock, self._inbox_lock:
            if self._closed:
                return
            ids = [d.ref for d in self._buffer]
            self._buffer.clear()
        self._give_back(ids)

    def close(self) -> None:
        """Give back prefetched rows that were never handed out."""
        with self._lock, self._inbox_lock:
            if self._closed:
                return
            self._closed = True
            ids = [d.ref for d in self._buffer]
            self._buffer.clear()
        self._store._unregister_reader(self)
        self._memory.close()
        self._give_back(ids)

    def _give_back(self, ids: list[int]) -> None:
        if ids and not self._store._closed:
            store = self._store
            try:
                store._write(
                    lambda b: store._op_release(b, ids, "not delivered", store.instance_id, counted=False),
                    durable=False,
                )
            except StoreError:
                log.warning("could not give back %d prefetched messages; they return when the lease expires", len(ids))
