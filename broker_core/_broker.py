"""The broker: its store, its connections, and the operators' view of its
queues."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ._browse import BrowsedMessage, BrowsePage, _cursor, _position
from ._commit import close_off_loop, store_commit_async
from ._connection import Connection
from ._destinations import Destination, Queue, parse_destination
from ._errors import IllegalStateError, InvalidArgumentError, InvalidDestinationError
from ._message import Message, message_from_envelope
from ._options import check_options, store_kind
from ._store import DestinationStats, RedeliveryPolicy, Store, queue_box
from .clock import now_ms

if TYPE_CHECKING:
    import sqlalchemy as sa

__all__ = ["Broker"]

#: At most this many message ids name the messages of one operator action.
MAX_MESSAGE_IDS = 1000


def _queue(name: Queue | str) -> Queue:
    """A queue given as itself, as ``queue://NAME`` or as a bare name."""
    if isinstance(name, Queue):
        return name
    text = str(name)
    if "://" in text:
        found = parse_destination(text)
        if not isinstance(found, Queue) or found.is_temporary:
            raise InvalidDestinationError(f"{text} is not a queue")
        return found
    return Queue(text)


def _checked_ids(message_ids: Any) -> list[str] | None:
    if message_ids is None:
        return None
    ids = list(message_ids)
    if not ids or len(ids) > MAX_MESSAGE_IDS or not all(isinstance(i, str) and 0 < len(i) <= 128 for i in ids):
        raise InvalidArgumentError(
            f"message_ids must be 1 to {MAX_MESSAGE_IDS} message ids (strings of at most 128 characters)"
        )
    return list(dict.fromkeys(ids))


log = logging.getLogger(__name__)

_POLICY_OPTIONS = {field.name for field in dataclasses.fields(RedeliveryPolicy)}


def _collecting(fns: Sequence[Callable[[Any], Any]], results: list[Any]) -> list[Callable[[Any], None]]:
    """*fns* as store transaction functions that keep their results in *results*."""

    def keep(i: int, fn: Callable[[Any], Any]) -> Callable[[Any], None]:
        def run(conn: Any) -> None:
            results[i] = fn(conn)

        return run

    return [keep(i, fn) for i, fn in enumerate(fns)]


def _open_store(url: str, options: dict[str, Any]) -> Store:
    if store_kind(url) == "memory":
        from ._memory import MemoryStore

        return MemoryStore(url, **options)
    try:
        from ._sql import SQLStore
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise InvalidArgumentError(f"the SQL store is not available: {exc}") from exc
    return SQLStore(url, **options)


class Broker:
    """A JMS-style broker over one store.

    Open it with :meth:`open`; connect clients with :meth:`connect`. The
    introspection methods (:meth:`destinations`, :meth:`browse`,
    :meth:`replay_dead_letters`) serve operators and the command line.
    """

    def __init__(
        self,
        store: Store,
        policy: RedeliveryPolicy,
        *,
        xpath_namespaces: dict[str, str] | None = None,
        sweep_interval: float = 30.0,
        selector_string_numbers: str = "convert",
    ) -> None:
        if selector_string_numbers not in ("strict", "convert"):
            raise InvalidArgumentError(
                f"selector_string_numbers must be 'strict' or 'convert', not {selector_string_numbers!r}"
            )
        self.store = store
        self.policy = policy
        self.xpath_namespaces = dict(xpath_namespaces or {})
        #: how selectors read the string properties of messages from text protocols (STOMP): a
        #: listener given no choice of its own marks its messages so (see STRING_NUMBERS_PROPERTY)
        self.selector_string_numbers = selector_string_numbers
        self.instance_id = uuid.uuid4().hex[:16]
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._wakers: dict[str, list[Callable[[], None]]] = {}
        self._consumers: collections.Counter[str] = collections.Counter()
        self._active_durables: set[str] = set()
        self._client_ids: set[str] = set()
        self._temporaries: dict[Destination, Connection] = {}
        self._connections: set[Connection] = set()
        self._closed = False
        self._sweeper: threading.Thread | None = None
        self._sweep_stop = threading.Event()
        store.attach(policy, self._wake, self.xpath_namespaces or None)
        store.consumer_counts(self._consumer_counts)
        if sweep_interval > 0:
            self._sweeper = threading.Thread(
                target=self._sweep_loop, args=(sweep_interval,), name="broker-sweeper", daemon=True
            )
            self._sweeper.start()

    @classmethod
    def open(cls, url: str = "memory://", **options: Any) -> Broker:
        """Open a broker on the store named by ``url``.

        Redelivery options (see :class:`RedeliveryPolicy` for defaults):
        ``max_deliveries``, ``redelivery_delay`` (s), ``redelivery_backoff``,
        ``max_redelivery_delay`` (s), ``dead_letter_prefix``, ``expiry_queue``.
        ``xpath_namespaces`` maps prefixes for ``XPATH`` selectors;
        ``sweep_interval`` (s, default 30, 0 to disable) is how often expired
        messages are swept. ``selector_string_numbers`` (``convert``, the
        default, or ``strict``): whether selectors read the string properties
        of messages sent over STOMP (every header is a string there) as
        numbers where they want one, as ActiveMQ does, or keep the JMS rule
        (a string never compares with a number); a STOMP listener's own
        option overrides it. Other options go to the store.
        """
        options = check_options(url, options)
        policy = RedeliveryPolicy(**{k: options.pop(k) for k in list(options) if k in _POLICY_OPTIONS})
        xpath_namespaces = options.pop("xpath_namespaces", None)
        sweep_interval = options.pop("sweep_interval", 30.0)
        string_numbers = options.pop("selector_string_numbers", "CONVERT").lower()
        store = _open_store(url, options)
        return cls(
            store,
            policy,
            xpath_namespaces=xpath_namespaces,
            sweep_interval=sweep_interval,
            selector_string_numbers=string_numbers,
        )

    @staticmethod
    def check_options(url: str, **options: Any) -> None:
        """Check what :meth:`open` would be given, opening nothing: the URL's
        scheme, every option's name and value. Raises
        :class:`InvalidArgumentError` (its ``option`` names the one at fault)."""
        check_options(url, options)

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> Broker:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await close_off_loop(self.store, self.close)

    def connect(self, client_id: str | None = None, user: str | None = None) -> Connection:
        """A new, stopped connection. ``client_id`` (needed for durable
        subscriptions) must be unique among open connections; ``user``, when
        given, is stamped on every sent message as ``JMSXUserID``."""
        self._check_open()
        return Connection(self, client_id, user)

    def close(self) -> None:
        """Close every connection and the store."""
        if self._closed:
            return
        for conn in list(self._connections):
            conn.close()
        self._closed = True
        self._sweep_stop.set()
        self.store.close()

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------ the store's database

    @property
    def engine(self) -> sa.Engine | None:
        """The SQLAlchemy engine of a SQL store (None on the memory store): for reads
        of an application's own tables in the broker's database. Write them with
        :meth:`write`, which runs in the store's own transactions (on SQLite one
        writer per process, which the store's writer is)."""
        engine: sa.Engine | None = getattr(self.store, "engine", None)
        return engine

    def write(
        self,
        *fns: Callable[[sa.Connection | None], Any],
        durable: bool = True,
        callback: Callable[[BaseException | None], None] | None = None,
    ) -> list[Any]:
        """Run ``fn(conn)`` for each of *fns*, in order, inside one transaction of the
        store's writer (``conn``: a SQLAlchemy connection; None on the memory store);
        returns their results once committed. ``durable=False``: the commit need not
        wait for the disk (work its caller can redo: a power cut may lose it, never
        half of it). With ``callback`` the call returns at once (an empty list) and
        ``callback(error_or_None)`` runs in another thread once the commit is done."""
        results: list[Any] = [None] * len(fns)
        self.store.commit((), (), _collecting(fns, results), callback, durable=durable)
        return results if callback is None else []

    async def write_async(self, *fns: Callable[[sa.Connection | None], Any], durable: bool = True) -> list[Any]:
        """Like :meth:`write`, for asyncio: waits for the commit without blocking the event loop."""
        results: list[Any] = [None] * len(fns)
        await store_commit_async(self.store, (), (), _collecting(fns, results), durable=durable)
        return results

    def acquire_lease(self, name: str, seconds: float) -> bool:
        """Take or renew the named lease for *seconds*: True while this broker holds it. Processes
        sharing a SQL store elect one of them so for a task; a memory store has no other process."""
        acquire: Callable[[str, float], bool] | None = getattr(self.store, "acquire_lease", None)
        return True if acquire is None else acquire(name, seconds)

    def release_lease(self, name: str) -> None:
        """Give up the named lease, if this broker holds it."""
        release: Callable[[str], None] | None = getattr(self.store, "release_lease", None)
        if release is not None:
            release(name)

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("the broker is closed")

    # ------------------------------------------------------------ internals

    def _consumer_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._consumers)

    def _new_message_id(self) -> str:
        return f"ID:{self.instance_id}-{next(self._ids)}"

    def _wake(self, box: str) -> None:
        """Wake consumers of ``box`` (``"*"``: of every box)."""
        if box == "*":
            for wakers in list(self._wakers.values()):
                for wake in tuple(wakers):
                    wake()
            return
        wakers = self._wakers.get(box)
        if wakers:
            for wake in tuple(wakers):
                wake()

    def _add_waker(self, box: str, wake: Callable[[], None]) -> None:
        with self._lock:
            self._wakers.setdefault(box, []).append(wake)

    def _remove_waker(self, box: str, wake: Callable[[], None]) -> None:
        with self._lock:
            wakers = self._wakers.get(box)
            if wakers and wake in wakers:
                wakers.remove(wake)
                if not wakers:
                    del self._wakers[box]

    def _sweep_loop(self, interval: float) -> None:
        while not self._sweep_stop.wait(interval):
            try:
                self.sweep_expired()
            except Exception:  # keep sweeping; report it
                log.exception("sweeping expired messages failed")

    # ------------------------------------------------------------ introspection

    def sweep_expired(self) -> int:
        """Remove expired messages now; returns how many."""
        return self.store.sweep_expired(now_ms())

    def destinations(self) -> list[DestinationStats]:
        """Counters of every queue and subscription, sorted by name. On a shared (SQL) store the counts
        and consumers are those of every process (see :class:`DestinationStats`)."""
        stats = self.store.stats()
        counts = self._consumers
        out = [dataclasses.replace(s, consumers=s.consumers + counts.get(s.name, 0)) for s in stats]
        return sorted(out, key=lambda s: s.name)

    def stats(self, destination: Destination | str) -> DestinationStats:
        """Counters of one queue or subscription box."""
        key = destination if isinstance(destination, str) else queue_box(destination)
        for s in self.destinations():
            if s.name == key:
                return s
        return DestinationStats(key, 0, 0, self._consumers.get(key, 0), 0, 0, 0, 0)

    def browse_page(
        self,
        destination: Destination | str,
        selector: str | None = None,
        *,
        cursor: str | None = None,
        limit: int = 50,
        scan_limit: int = 10_000,
    ) -> BrowsePage:
        """One page of the messages waiting in a queue (or subscription box), in delivery order, without
        consuming them: at most *limit* that match *selector*, after *cursor* (a previous page's), looking
        at no more than *scan_limit* messages. Memory and time are bounded by those, however deep the
        queue: each page continues from a position (keyset), it never skips through the ones before.
        Raises :class:`InvalidSelectorError` for a bad selector, :class:`InvalidArgumentError` for a cursor
        no page gave or limits out of range (1-1000, 1-100000)."""
        if not 1 <= limit <= 1000 or not 1 <= scan_limit <= 100_000:
            raise InvalidArgumentError("limit must be 1 to 1000 and scan_limit 1 to 100000")
        key = destination if isinstance(destination, str) else queue_box(destination)
        found, after = self.store.browse_page(key, selector, _position(cursor), limit, scan_limit)
        return BrowsePage([BrowsedMessage._of(m, body=False) for m in found], None if after is None else _cursor(after))

    def find_message(self, destination: Destination | str, message_id: str) -> BrowsedMessage | None:
        """Message *message_id* in a queue (or subscription box), waiting or in flight, with its body."""
        key = destination if isinstance(destination, str) else queue_box(destination)
        found = self.store.find(key, message_id)
        return None if found is None else BrowsedMessage._of(found)

    def purge(self, destination: Destination | str) -> int:
        """Delete every message waiting in a queue (or subscription box); returns how many. Messages in
        flight stay with their consumers."""
        key = destination if isinstance(destination, str) else queue_box(destination)
        return self.store.purge(key)

    def remove_messages(
        self,
        destination: Destination | str,
        *,
        message_ids: Iterable[str] | None = None,
        selector: str | None = None,
        limit: int | None = None,
    ) -> list[str]:
        """Delete waiting messages of a queue (or subscription box): those named by *message_ids* (at most
        1000) and/or matching *selector*, at most *limit*; returns the ids of those deleted."""
        return self._take(destination, message_ids, selector, limit, None)

    def move_messages(
        self,
        destination: Destination | str,
        target: Queue | str,
        *,
        message_ids: Iterable[str] | None = None,
        selector: str | None = None,
        limit: int | None = None,
    ) -> list[str]:
        """Move waiting messages of a queue (or subscription box) to queue *target*, as they are (same id,
        headers and properties, a fresh delivery count): those named by *message_ids* and/or matching
        *selector*, at most *limit*; returns the ids of those moved."""
        queue = _queue(target)
        return self._take(destination, message_ids, selector, limit, lambda env: queue)

    def _take(
        self,
        destination: Destination | str,
        message_ids: Any,
        selector: str | None,
        limit: int | None,
        target: Callable[[Any], Destination | None] | None,
        strip: bool = False,
    ) -> list[str]:
        """Claim the messages named by *message_ids* (each found by its id) or matching *selector* (found
        page by page, as :meth:`browse_page` finds them: memory bounded however deep the box) and, in
        batches of up to 200 per store transaction, acknowledge them, sending each to
        ``target(envelope)`` if given (None there: leave that one where it is)."""
        if limit is not None and limit < 1:
            raise InvalidArgumentError(f"limit must be at least 1, not {limit}")
        key = destination if isinstance(destination, str) else queue_box(destination)
        ids = _checked_ids(message_ids)
        compiled = None
        if selector is not None:
            from ._selector import compile_selector

            compiled = compile_selector(selector, xpath_namespaces=self.xpath_namespaces or None)
        done: list[str] = []
        skipped: list[Any] = []

        def settle(deliveries: list[Any]) -> None:
            sends, acks = [], []
            for delivery in deliveries:
                env = delivery.envelope
                if target is not None:
                    where = target(env)
                    if where is None:
                        skipped.append(delivery)
                        continue
                    properties = env.properties
                    if strip:
                        properties = {k: v for k, v in properties.items() if not k.startswith("JMS_DLQ_")}
                    sends.append(env.replace(destination=where, properties=properties))
                acks.append(delivery)
            if acks:
                self.store.commit(sends, acks)
                done.extend(d.envelope.message_id for d in acks)

        def room() -> int:
            return 200 if limit is None else min(200, limit - len(done) - len(skipped))

        try:
            if ids is not None:
                for start in range(0, len(ids), 200):
                    if room() <= 0:
                        break
                    found = [self.store.find(key, i) for i in ids[start : start + 200]]
                    positions = [
                        m.position
                        for m in found
                        if m is not None and m.state == "pending" and (compiled is None or compiled.matches(m.envelope))
                    ][: room()]
                    settle(self.store.claim_positions(key, positions))
            else:
                cursor = None
                while room() > 0:
                    found, cursor = self.store.browse_page(key, selector, cursor, room(), 10_000)
                    if found:
                        settle(self.store.claim_positions(key, [m.position for m in found]))
                    if cursor is None:
                        break
        finally:
            if skipped:
                self.store.release(skipped, "not replayable: original destination unknown")
        return done

    def observe_commits(self, observer: Callable[[float, int], None] | None) -> None:
        """Call ``observer(seconds, operations)`` after each transaction of the store (the SQL store's
        group commits: how long it took from the first operation's arrival, how many it carried); None
        stops. The observer runs in the store's writer thread: it must be quick and must not raise."""
        self.store.observe_commits(observer)

    def browse(
        self, destination: Destination | str, selector: str | None = None, limit: int | None = None
    ) -> Iterator[Message]:
        """Read-only messages waiting in a queue (or subscription box), in
        delivery order, without consuming them."""
        key = destination if isinstance(destination, str) else queue_box(destination)
        for n, env in enumerate(self.store.browse(key, selector)):
            if limit is not None and n >= limit:
                return
            yield message_from_envelope(env, 0)

    def message_status(self, message_ids: list[str]) -> dict[str, str]:
        """Where each message stands: ``"pending"`` (waiting in a queue or
        subscription), ``"in_flight"`` (delivered, not yet acknowledged),
        ``"dead_lettered"`` (in a dead-letter queue), ``"expired"`` (its time
        to live ran out before anyone consumed it; remembered for
        ``expired_retention`` seconds on the SQL store, the last 100,000 on the
        memory store) or ``"gone"`` (consumed and acknowledged, or never
        stored)."""
        found = self.store.locate(message_ids)
        dlq = f"queue://{self.policy.dead_letter_prefix}"
        out = {}
        for message_id in message_ids:
            where = found.get(message_id)
            if where is None:
                out[message_id] = "gone"
            elif where[1] == "expired":
                out[message_id] = "expired"
            elif where[0].startswith(dlq):
                out[message_id] = "dead_lettered"
            else:
                out[message_id] = where[1]
        return out

    def replay_dead_letters(
        self,
        dead_letter_queue: Queue | str,
        limit: int | None = None,
        *,
        message_ids: Any = None,
        selector: str | None = None,
    ) -> int:
        """Move messages from a dead-letter queue back to their original
        destination (``JMS_DLQ_OriginalDestination``) with a fresh delivery
        count; returns how many moved. Only those named by *message_ids* (at
        most 1000) and/or matching *selector*, when given; at most *limit*.
        Messages whose original destination is unknown stay where they are."""
        return len(self.replay_dead_letter_ids(dead_letter_queue, limit, message_ids=message_ids, selector=selector))

    def replay_dead_letter_ids(
        self,
        dead_letter_queue: Queue | str,
        limit: int | None = None,
        *,
        message_ids: Any = None,
        selector: str | None = None,
    ) -> list[str]:
        """:meth:`replay_dead_letters`, returning the ids of the messages moved."""
        queue = _queue(dead_letter_queue)

        def origin(env: Any) -> Destination | None:
            text = env.properties.get("JMS_DLQ_OriginalDestination")
            try:
                found = parse_destination(text) if isinstance(text, str) else None
            except InvalidDestinationError:
                return None
            return None if found is None or found.is_temporary else found

        return self._take(queue, message_ids, selector, limit, origin, strip=True)
