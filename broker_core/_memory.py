"""The memory store: every box in this process's memory (``memory://``).

Each box keeps ten FIFO deques, one per priority, so a plain claim is O(1).
A consumer with a selector gets its own heap of matching entries, filled when
the reader opens (one scan of the backlog) and then at every put, so a
selective consumer never rescans a backlog it does not match. Entries leave
those structures lazily: whoever pops an entry that is no longer available
drops it.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ._destinations import Destination, Queue
from ._envelope import Envelope
from ._store import (
    Delivery,
    DestinationStats,
    Reader,
    Store,
    StoredMessage,
    Subscription,
    body_size,
    dead_letter_envelope,
    expired_envelope,
)
from .clock import now_ms

__all__ = ["MemoryStore"]

AVAILABLE, IN_FLIGHT, GONE, DELAYED = 0, 1, 2, 3
#: How many expired message ids the memory store remembers for ``locate``.
_EXPIRED_REMEMBERED = 100_000


class _Entry:
    __slots__ = ("env", "seq", "count", "state")

    def __init__(self, env: Envelope, seq: int, count: int = 0) -> None:
        self.env = env
        self.seq = seq
        self.count = count
        self.state = AVAILABLE


class _Box:
    __slots__ = (
        "key",
        "destination",
        "subscription",
        "selector",
        "levels",
        "delayed",
        "selective",
        "available",
        "in_flight",
        "enqueued",
        "dequeued",
        "expired",
        "dead_lettered",
        "redelivered",
        "deleted",
    )

    def __init__(
        self, key: str, destination: Destination, subscription: Subscription | None = None, selector: Any = None
    ) -> None:
        self.key = key
        self.destination = destination
        self.subscription = subscription
        self.selector = selector  # a subscription's selector, applied at publish time
        self.levels: list[collections.deque[_Entry]] = [collections.deque() for _ in range(10)]
        self.delayed: list[tuple[int, int, _Entry]] = []
        self.selective: list[_SelectiveReader] = []
        self.available = 0
        self.in_flight = 0
        self.enqueued = 0
        self.dequeued = 0
        self.expired = 0
        self.dead_lettered = 0
        self.redelivered = 0
        self.deleted = False


class MemoryStore(Store):
    """All boxes in memory; nothing survives the process. Thread-safe."""

    def __init__(self, url: str = "memory://", **options: Any) -> None:
        if options:
            from ._errors import InvalidArgumentError

            raise InvalidArgumentError(f"the memory store takes no options, got {sorted(options)}")
        self.url = url
        self._lock = threading.Lock()
        self._boxes: dict[str, _Box] = {}
        self._topics: dict[Destination, list[_Box]] = {}
        self._by_destination: dict[Destination, _Box] = {}  # queue boxes, to route without formatting keys
        self._seq = itertools.count(1)
        self._flying: dict[_Entry, str] = {}  # in-flight entries and their box (for locate)
        self._expired_ids: dict[str, str] = {}  # message id -> box, the last expired ones (for locate)

    def close(self) -> None:
        with self._lock:
            self._boxes.clear()
            self._topics.clear()

    # ------------------------------------------------------------ boxes

    def _queue_box(self, key: str, destination: Destination) -> _Box:
        box = self._boxes.get(key)
        if box is None:
            box = self._boxes[key] = _Box(key, destination)
        return box

    def create_queue(self, box: str, destination: Destination) -> None:
        with self._lock:
            self._queue_box(box, destination)

    def delete_box(self, box: str) -> None:
        with self._lock:
            found = self._boxes.pop(box, None)
            if found is None:
                return
            found.deleted = True
            self._by_destination.pop(found.destination, None)
            if found.subscription is not None:
                subs = self._topics.get(found.subscription.topic, [])
                if found in subs:
                    subs.remove(found)

    def create_subscription(self, subscription: Subscription) -> None:
        from ._selector import compile_selector

        selector = compile_selector(subscription.selector, xpath_namespaces=self._xpath_namespaces)
        with self._lock:
            box = _Box(subscription.box, subscription.topic, subscription, selector)
            self._boxes[subscription.box] = box
            self._topics.setdefault(subscription.topic, []).append(box)

    def has_box(self, box: str) -> bool:
        return box in self._boxes

    def durable_subscription(self, client_id: str, name: str) -> Subscription | None:
        with self._lock:
            for box in self._boxes.values():
                sub = box.subscription
                if sub is not None and sub.client_id == client_id and sub.name == name:
                    return sub
        return None

    # ------------------------------------------------------------ writes

    def _put(self, box: _Box, entry: _Entry, front: bool = False) -> None:
        entry.state = AVAILABLE
        env = entry.env
        if front:
            box.levels[env.priority].appendleft(entry)
        else:
            box.levels[env.priority].append(entry)
        box.available += 1
        if box.selective:
            item = (-env.priority, entry.seq, entry)
            for reader in box.selective:
                if reader.selector.matches(env):
                    heapq.heappush(reader.heap, item)

    def _route(self, env: Envelope, touched: list[str]) -> None:
        """Put ``env`` into its box(es); the store lock is held."""
        dest = env.destination
        if dest.is_topic:
            for box in self._topics.get(dest, ()):
                sub = box.subscription
                if sub.no_local and env.origin is not None and env.origin == sub.local_origin:
                    continue
                if box.selector is not None and not box.selector.matches(env):
                    continue
                box.enqueued += 1
                self._put(box, _Entry(env, next(self._seq)))
                touched.append(box.key)
        else:
            box = self._by_destination.get(dest)
            if box is None or box.deleted:
                key = str(dest)
                box = self._boxes.get(key)
                if box is None:
                    box = self._boxes[key] = _Box(key, dest)
                self._by_destination[dest] = box
            box.enqueued += 1
            self._put(box, _Entry(env, next(self._seq)))
            touched.append(box.key)

    def _notify(self, touched: list[str]) -> None:
        notify = self._on_available
        for key in touched:
            notify(key)

    def send(self, envelope: Envelope) -> None:
        touched: list[str] = []
        with self._lock:
            self._route(envelope, touched)
        self._notify(touched)

    def commit(
        self,
        sends: Sequence[Envelope],
        acks: Sequence[Delivery],
        extra: Sequence[Callable[[Any], Any]] = (),
        callback: Callable[[BaseException | None], None] | None = None,
        *,
        durable: bool = True,
        finish_on: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
        try:  # all of it in the caller's thread: finish_on has nothing to take over
            for fn in extra:
                fn(None)
        except BaseException as error:
            if callback is None:
                raise
            callback(error)
            return
        touched: list[str] = []
        with self._lock:
            self._ack_locked(acks)
            for env in sends:
                self._route(env, touched)
        self._notify(touched)
        if callback is not None:
            callback(None)

    def locate(self, message_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
        wanted = set(message_ids)
        found: dict[str, tuple[str, str]] = {}
        with self._lock:
            for message_id in wanted:
                box_key = self._expired_ids.get(message_id)
                if box_key is not None:
                    found[message_id] = (box_key, "expired")
            for box in self._boxes.values():
                for level in box.levels:
                    for entry in level:
                        if entry.state is AVAILABLE and entry.env.message_id in wanted:
                            found[entry.env.message_id] = (box.key, "pending")
                for item in box.delayed:
                    if item[2].state is DELAYED and item[2].env.message_id in wanted:
                        found[item[2].env.message_id] = (box.key, "pending")
            for entry, key in self._flying.items():
                if entry.env.message_id in wanted:
                    found[entry.env.message_id] = (key, "in_flight")
        return found

    # ------------------------------------------------------------ reads

    def reader(self, box: str, selector: str | None, prefetch: int | None = None) -> Reader:
        from ._selector import compile_selector

        compiled = compile_selector(selector, xpath_namespaces=self._xpath_namespaces)
        with self._lock:
            found = self._boxes.get(box)
            if found is None:
                found = self._boxes[box] = _Box(box, Queue(box.partition("://")[2]))
            if compiled is None:
                return _PlainReader(self, found)
            reader = _SelectiveReader(self, found, compiled)
            now = now_ms()
            for level in found.levels:
                for entry in level:
                    if entry.state is AVAILABLE and compiled.matches(entry.env):
                        reader.heap.append((-entry.env.priority, entry.seq, entry))
            heapq.heapify(reader.heap)
            found.selective.append(reader)
            self._promote_delayed(found, now)
            return reader

    def _promote_delayed(self, box: _Box, now: int) -> None:
        """Make delayed redeliveries whose time has come available (lock held)."""
        delayed = box.delayed
        while delayed and delayed[0][0] <= now:
            entry = heapq.heappop(delayed)[2]
            if entry.state is DELAYED:
                box.available -= 1  # counted when it was delayed; _put counts it again
                self._put(box, entry)

    def _take(self, box: _Box, entry: _Entry, now: int, auto_ack: bool, touched: list[str]) -> Delivery | None:
        """Claim ``entry`` (available, lock held), or expire it and return None."""
        box.available -= 1
        env = entry.env
        if env.expiration and env.expiration <= now:
            entry.state = GONE
            box.expired += 1
            expired_ids = self._expired_ids
            expired_ids[env.message_id] = box.key
            if len(expired_ids) > _EXPIRED_REMEMBERED:
                del expired_ids[next(iter(expired_ids))]
            copy = expired_envelope(env, self.policy)
            if copy is not None:
                self._route(copy, touched)
            return None
        entry.count += 1
        if auto_ack:
            entry.state = GONE
            box.dequeued += 1
        else:
            entry.state = IN_FLIGHT
            box.in_flight += 1
            self._flying[entry] = box.key
        return Delivery(box.key, entry, env, entry.count)

    def _claim_plain(self, box: _Box, now: int, auto_ack: bool) -> Delivery | None:
        touched: list[str] = []
        delivery = None
        with self._lock:
            if box.delayed:
                self._promote_delayed(box, now)
            if box.available:
                for level in reversed(box.levels):
                    while level:
                        entry = level.popleft()
                        if entry.state is AVAILABLE:
                            delivery = self._take(box, entry, now, auto_ack, touched)
                            if delivery is not None:
                                break
                    if delivery is not None:
                        break
        if touched:
            self._notify(touched)
        return delivery

    def _claim_selective(self, reader: _SelectiveReader, now: int, auto_ack: bool) -> Delivery | None:
        touched: list[str] = []
        delivery = None
        box = reader.box
        heap = reader.heap
        with self._lock:
            if box.delayed:
                self._promote_delayed(box, now)
            while heap:
                entry = heapq.heappop(heap)[2]
                if entry.state is AVAILABLE:
                    delivery = self._take(box, entry, now, auto_ack, touched)
                    if delivery is not None:
                        break
            reader.claims += 1
            if reader.claims % 4096 == 0:
                self._compact(box)
        if touched:
            self._notify(touched)
        return delivery

    def _compact(self, box: _Box) -> None:
        """Drop entries that are no longer available from the lazy structures."""
        for i, level in enumerate(box.levels):
            if level and len(level) > 64:
                box.levels[i] = collections.deque(e for e in level if e.state is AVAILABLE)
        for reader in box.selective:
            if len(reader.heap) > 64:
                reader.heap = [item for item in reader.heap if item[2].state is AVAILABLE]
                heapq.heapify(reader.heap)

    def ack(self, deliveries: Sequence[Delivery], wait: bool = True) -> None:
        with self._lock:
            self._ack_locked(deliveries)

    def _ack_locked(self, deliveries: Sequence[Delivery]) -> None:
        boxes = self._boxes
        for d in deliveries:
            entry = d.ref
            if entry.state is IN_FLIGHT:
                entry.state = GONE
                self._flying.pop(entry, None)
                box = boxes.get(d.box)
                if box is not None:
                    box.in_flight -= 1
                    box.dequeued += 1

    def release(self, deliveries: Sequence[Delivery], reason: str) -> None:
        touched: list[str] = []
        policy = self.policy
        now = now_ms()
        with self._lock:
            fronts: list[tuple[_Box, _Entry]] = []
            for d in deliveries:
                entry = d.ref
                if entry.state is not IN_FLIGHT:
                    continue
                entry.state = GONE
                self._flying.pop(entry, None)
                box = self._boxes.get(d.box)
                if box is None:
                    continue
                box.in_flight -= 1
                if entry.count >= policy.max_deliveries:
                    box.dead_lettered += 1
                    why = f"delivered {entry.count} times without acknowledgement (max_deliveries={policy.max_deliveries}); last failure: {reason}"
                    self._route(dead_letter_envelope(entry.env, policy, why, box.key), touched)
                    continue
                again = _Entry(entry.env, entry.seq, entry.count)
                box.redelivered += 1
                delay = policy.delay_ms(entry.count)
                if delay:
                    again.state = DELAYED
                    box.available += 1
                    heapq.heappush(box.delayed, (now + delay, again.seq, again))
                else:
                    fronts.append((box, again))
                touched.append(box.key)
            fronts.sort(key=lambda item: -item[1].seq)
            for box, again in fronts:
                self._put(box, again, front=True)
        self._notify(touched)

    def dead_letter(self, deliveries: Sequence[Delivery], reason: str) -> None:
        touched: list[str] = []
        with self._lock:
            for d in deliveries:
                entry = d.ref
                if entry.state is not IN_FLIGHT:
                    continue
                entry.state = GONE
                self._flying.pop(entry, None)
                box = self._boxes.get(d.box)
                if box is None:
                    continue
                box.in_flight -= 1
                box.dead_lettered += 1
                self._route(dead_letter_envelope(entry.env, self.policy, reason, box.key), touched)
        self._notify(touched)

    def browse(self, box: str, selector: str | None) -> Iterator[Envelope]:
        from ._selector import compile_selector

        compiled = compile_selector(selector, xpath_namespaces=self._xpath_namespaces)
        now = now_ms()
        with self._lock:
            found = self._boxes.get(box)
            if found is None:
                return iter(())
            entries = [e for level in found.levels for e in level if e.state is AVAILABLE]
            entries.extend(item[2] for item in found.delayed if item[2].state is DELAYED)
        entries.sort(key=lambda e: (-e.env.priority, e.seq))
        return (
            e.env
            for e in entries
            if not (e.env.expiration and e.env.expiration <= now) and (compiled is None or compiled.matches(e.env))
        )

    def _waiting(self, box: _Box) -> Iterator[_Entry]:
        """The waiting entries of a box (lock held), in no particular order."""
        for level in box.levels:
            for entry in level:
                if entry.state is AVAILABLE:
                    yield entry
        for item in box.delayed:
            if item[2].state is DELAYED:
                yield item[2]

    def browse_page(
        self, box: str, selector: str | None, after: tuple[int, ...] | None, limit: int, scan_limit: int
    ) -> tuple[list[StoredMessage], tuple[int, ...] | None]:
        from ._selector import compile_selector

        compiled = compile_selector(selector, xpath_namespaces=self._xpath_namespaces)
        now = now_ms()
        # positions: (9 - priority, seq), so that delivery order is ascending
        with self._lock:
            found = self._boxes.get(box)
            if found is None:
                return [], None
            keyed = ((9 - e.env.priority, e.seq, e) for e in self._waiting(found))
            if after is not None:
                keyed = (k for k in keyed if (k[0], k[1]) > after)
            window = heapq.nsmallest(scan_limit + 1, keyed, key=lambda k: (k[0], k[1]))
        out: list[StoredMessage] = []
        position: tuple[int, ...] | None = None
        examined = 0
        for rank, seq, entry in window[:scan_limit]:
            examined += 1
            position = (rank, seq)
            env = entry.env
            if env.expiration and env.expiration <= now:
                continue
            if compiled is None or compiled.matches(env):
                out.append(StoredMessage(box, env, "pending", entry.count, body_size(env), position))
                if len(out) >= limit:
                    break
        return out, position if examined < len(window) else None

    def find(self, box: str, message_id: str) -> StoredMessage | None:
        with self._lock:
            found = self._boxes.get(box)
            if found is None:
                return None
            for entry in self._waiting(found):
                if entry.env.message_id == message_id:
                    return StoredMessage(
                        box,
                        entry.env,
                        "pending",
                        entry.count,
                        body_size(entry.env),
                        (9 - entry.env.priority, entry.seq),
                    )
            for entry, key in self._flying.items():
                if key == box and entry.env.message_id == message_id:
                    return StoredMessage(
                        box,
                        entry.env,
                        "in_flight",
                        entry.count,
                        body_size(entry.env),
                        (9 - entry.env.priority, entry.seq),
                    )
        return None

    def claim_positions(self, box: str, positions: Sequence[tuple[int, ...]]) -> list[Delivery]:
        wanted = set(positions)
        out: list[Delivery] = []
        touched: list[str] = []
        now = now_ms()
        with self._lock:
            found = self._boxes.get(box)
            if found is None or not wanted:
                return out
            for entry in [e for e in self._waiting(found) if (9 - e.env.priority, e.seq) in wanted]:
                delivery = self._take(found, entry, now, False, touched)
                if delivery is not None:
                    out.append(delivery)
        self._notify(touched)
        out.sort(key=lambda d: (-d.envelope.priority, d.ref.seq))
        return out

    def purge(self, box: str) -> int:
        with self._lock:
            found = self._boxes.get(box)
            if found is None:
                return 0
            entries = list(self._waiting(found))
            for entry in entries:
                entry.state = GONE
            found.available -= len(entries)
            found.delayed = []
            self._compact(found)
        return len(entries)

    def stats(self) -> list[DestinationStats]:
        with self._lock:
            out = []
            for box in self._boxes.values():
                oldest = None
                if box.available:
                    oldest = min((e.env.timestamp for e in self._waiting(box)), default=None)
                out.append(
                    DestinationStats(
                        name=box.key,
                        depth=box.available,
                        in_flight=box.in_flight,
                        consumers=0,
                        enqueued=box.enqueued,
                        dequeued=box.dequeued,
                        expired=box.expired,
                        dead_lettered=box.dead_lettered,
                        topic=str(box.subscription.topic) if box.subscription else None,
                        oldest=oldest,
                        redelivered=box.redelivered,
                    )
                )
            return out

    def sweep_expired(self, now: int) -> int:
        touched: list[str] = []
        count = 0
        with self._lock:
            for box in list(self._boxes.values()):
                # waiting entries: available ones and those delayed for redelivery
                expired = [e for level in box.levels for e in level if e.state is AVAILABLE and e.env.expired(now)]
                expired.extend(e for _, _, e in box.delayed if e.state is DELAYED and e.env.expired(now))
                for entry in expired:
                    self._take(box, entry, now, True, touched)
                count += len(expired)
                self._compact(box)
        self._notify(touched)
        return count


class _PlainReader(Reader):
    __slots__ = ("_claim", "box")

    def __init__(self, store: MemoryStore, box: _Box) -> None:
        self.box = box
        claim = store._claim_plain
        self._claim: Callable[[int, bool], Delivery | None] = lambda now, auto_ack: claim(box, now, auto_ack)

    def claim(self, now: int, auto_ack: bool) -> Delivery | None:
        return self._claim(now, auto_ack)

    def next_ready(self) -> int | None:
        delayed = self.box.delayed
        return delayed[0][0] if delayed else None

    def close(self) -> None:
        pass


class _SelectiveReader(Reader):
    def __init__(self, store: MemoryStore, box: _Box, selector: Any) -> None:
        self.store = store
        self.box = box
        self.selector = selector
        self.heap: list[tuple[int, int, _Entry]] = []
        self.claims = 0

    def claim(self, now: int, auto_ack: bool) -> Delivery | None:
        return self.store._claim_selective(self, now, auto_ack)

    def next_ready(self) -> int | None:
        delayed = self.box.delayed
        return delayed[0][0] if delayed else None

    def close(self) -> None:
        with self.store._lock:
            if self in self.box.selective:
                self.box.selective.remove(self)
            self.heap = []
