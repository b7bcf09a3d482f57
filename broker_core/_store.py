"""The store interface: where messages wait between send and acknowledgement.

A store keeps *boxes*: the physical queues of the broker. A queue is one box;
every topic subscription (durable or not) is a box of its own that receives a
copy of what is published to the topic, filtered by the subscription's
selector and ``no_local`` at publish time. Box keys are strings
(:func:`queue_box`, :func:`subscription_box`).

An entry in a box is *available*, *in flight* (claimed by one consumer, not yet
acknowledged) or gone. Claiming makes it in flight and counts a delivery;
acknowledging removes it; releasing makes it available again, or moves it to
the dead-letter queue once it has been delivered ``max_deliveries`` times.
Expired entries are never claimed: they are counted and dropped (or moved to
the configured expiry queue).

The broker calls a store from many threads; a store is thread-safe. After a
message becomes available in a box the store calls the ``on_available``
callback given to :meth:`Store.attach` with the box key, outside its own locks.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import quote

from ._destinations import Destination
from ._envelope import Envelope
from .clock import now_ms

__all__ = [
    "Store",
    "Reader",
    "Delivery",
    "Subscription",
    "RedeliveryPolicy",
    "DestinationStats",
    "StoredMessage",
    "queue_box",
    "subscription_box",
]


def queue_box(destination: Destination) -> str:
    """The box key of a queue (or temporary queue)."""
    return str(destination)


def subscription_box(client_id: str | None, name: str | None, unique: str | None = None) -> str:
    """The box key of a durable subscription (``client_id`` + ``name``), or of a
    non-durable one (``unique``)."""
    if name is not None:
        return f"durable://{quote(client_id or '', safe='')}/{quote(name, safe='')}"
    return f"subscriber://{unique}"


@dataclasses.dataclass(frozen=True)
class RedeliveryPolicy:
    """What happens to messages that are not acknowledged, and to expired ones.

    ``max_deliveries`` (default 10): a message delivered this many times and
    released again goes to ``dead_letter_prefix + destination name`` (default
    ``DLQ.``). ``redelivery_delay`` seconds (default 0: at once) before the
    first redelivery, multiplied by ``redelivery_backoff`` (default 2.0) for
    each further one, up to ``max_redelivery_delay`` (default 60 s).
    ``expiry_queue`` (default ``None``: expired messages are dropped and
    counted) names a queue that receives expired messages instead.
    """

    max_deliveries: int = 10
    redelivery_delay: float = 0.0
    redelivery_backoff: float = 2.0
    max_redelivery_delay: float = 60.0
    dead_letter_prefix: str = "DLQ."
    expiry_queue: str | None = None

    def __post_init__(self) -> None:
        from ._options import BROKER_OPTIONS  # the rules Broker.open checks these by

        for field in dataclasses.fields(self):
            BROKER_OPTIONS[field.name].check(field.name, getattr(self, field.name))

    def delay_ms(self, delivery_count: int) -> int:
        """Milliseconds to wait before making a message available again after
        its ``delivery_count``-th delivery failed."""
        if self.redelivery_delay <= 0:
            return 0
        delay = self.redelivery_delay * self.redelivery_backoff ** max(0, delivery_count - 1)
        return int(min(delay, self.max_redelivery_delay) * 1000)

    def dead_letter_name(self, destination: Destination) -> str:
        return self.dead_letter_prefix + destination.name


@dataclasses.dataclass(frozen=True)
class Subscription:
    """A topic subscription as the store knows it.

    ``local_origin`` is the origin (client id, or connection id) whose own
    messages a ``no_local`` subscription does not receive.
    """

    box: str
    topic: Destination
    selector: str | None
    no_local: bool
    local_origin: str | None
    client_id: str | None = None
    name: str | None = None

    @property
    def durable(self) -> bool:
        return self.name is not None


@dataclasses.dataclass(frozen=True)
class DestinationStats:
    """A snapshot of one box's counters.

    ``name``: the destination (``queue://a``) or subscription box key;
    ``depth``: messages waiting (available or waiting for a redelivery delay);
    ``in_flight``: delivered, not yet acknowledged; ``consumers``: open
    consumers; ``enqueued`` / ``dequeued`` (acknowledged) / ``expired`` /
    ``dead_lettered``: counts since the store was opened.
    ``topic``: for a subscription, the topic it subscribes to.
    ``oldest``: epoch ms at which the longest-waiting message entered the
    box (the memory store: when it was sent), ``None`` when none waits.
    ``redelivered``: deliveries given back to be delivered again (a
    consumer's rollback, recover or failure), counted like ``enqueued``.
    A SQL store counts what every process sharing it did (the counters of
    the last second or so of each other process may not be in yet), and its
    ``consumers`` are every process's.
    """

    name: str
    depth: int
    in_flight: int
    consumers: int
    enqueued: int
    dequeued: int
    expired: int
    dead_lettered: int
    topic: str | None = None
    oldest: int | None = None
    redelivered: int = 0


@dataclasses.dataclass(frozen=True)
class StoredMessage:
    """A message in a box as an operator sees it: its envelope, ``state``
    (``"pending"``: waiting, or ``"in_flight"``), how many times it was
    delivered, the ``size`` of its body in bytes as sent, and its
    ``position`` in the box's delivery order (what browse pages continue
    after; a tuple of ints)."""

    box: str
    envelope: Envelope
    state: str
    delivery_count: int
    size: int
    position: tuple[int, ...]


def body_size(envelope: Envelope) -> int:
    """The size in bytes of a message body as sent (UTF-8 for text)."""
    if envelope.encoded is not None:
        return len(envelope.encoded)
    body = envelope.body
    if body is None:
        return 0
    if isinstance(body, str):
        return len(body.encode("utf-8"))
    if isinstance(body, (bytes, bytearray)):
        return len(body)
    return len(repr(body).encode("utf-8"))


class Delivery:
    """One delivery of an entry to a consumer: what acknowledge and release name."""

    __slots__ = ("box", "ref", "envelope", "count")

    def __init__(self, box: str, ref: Any, envelope: Envelope, count: int) -> None:
        self.box = box
        self.ref = ref
        self.envelope = envelope
        self.count = count

    def __repr__(self) -> str:
        return f"<Delivery {self.envelope.message_id} from {self.box} #{self.count}>"


class Reader(abc.ABC):
    """A consumer's cursor on one box, with its selector compiled once."""

    #: Set by the consumer that owns the reader: whether it is waiting for a
    #: message right now. A store may hand new messages straight to a
    #: waiting reader (the SQL store does, saving the claim round trip).
    demand: Callable[[], bool] | None = None
    #: Set by the consumer that owns the reader: wake it up. A store that
    #: hands a message to this reader wakes its consumer alone.
    wake: Callable[[], None] | None = None

    @abc.abstractmethod
    def claim(self, now: int, auto_ack: bool) -> Delivery | None:
        """The next available entry that matches, made in flight (or, with
        ``auto_ack``, removed at once); ``None`` if there is none now."""

    async def claim_async(self, now: int, auto_ack: bool) -> Delivery | None:
        """:meth:`claim` for an event loop, called when :meth:`claim_may_wait`.
        Here the claim itself, for a store whose claims never wait; one whose
        claims may wait overrides it, and keeps what a claim takes for the
        consumer's next receive when the waiting task is cancelled."""
        return self.claim(now, auto_ack)

    def next_ready(self) -> int | None:
        """Epoch ms at which a delayed redelivery becomes available, if any."""
        return None

    def claim_may_wait(self, now: int) -> bool:
        """Whether :meth:`claim` may wait on a write (the SQL store's claim
        transaction): ``receive_async`` then claims in a thread, so that the
        event loop is not stalled. False for a store whose claims never wait."""
        return False

    def release_held(self) -> None:
        """Give back the entries claimed ahead for the consumer (prefetched)
        but not handed out yet: available again, no delivery counted. A
        session's recover or rollback calls it so that redelivery restarts
        with the oldest unacknowledged message, not behind what was prefetched.
        A store that claims one entry per receive holds none."""

    @abc.abstractmethod
    def close(self) -> None:
        """Forget this reader. In-flight entries stay in flight."""


class Store(abc.ABC):
    """Where boxes live. See the module docstring for the model."""

    policy: RedeliveryPolicy
    #: True when sends may be seen by other processes (so temporary
    #: destinations and subscriptions must be registered in the store).
    shared = False

    def attach(
        self,
        policy: RedeliveryPolicy,
        on_available: Callable[[str], None],
        xpath_namespaces: dict[str, str] | None = None,
    ) -> None:
        self.policy = policy
        self._on_available = on_available
        self._xpath_namespaces = xpath_namespaces

    @abc.abstractmethod
    def close(self) -> None: ...

    # subscriptions and boxes
    @abc.abstractmethod
    def create_queue(self, box: str, destination: Destination) -> None:
        """Make sure the box of a queue exists (idempotent)."""

    @abc.abstractmethod
    def delete_box(self, box: str) -> None:
        """Drop a box and everything in it (temporary queues, unsubscribe)."""

    @abc.abstractmethod
    def create_subscription(self, subscription: Subscription) -> None:
        """Add a topic subscription box (replacing none: callers delete first)."""

    @abc.abstractmethod
    def durable_subscription(self, client_id: str, name: str) -> Subscription | None: ...

    def register_temporary(self, destination: Destination) -> None:
        """Record that a temporary destination exists (for other processes)."""

    def unregister_temporary(self, destination: Destination) -> None:
        """Forget a temporary destination."""

    def temporary_exists(self, destination: Destination) -> bool:
        """Whether another process of a shared store owns this temporary destination."""
        return False

    # writes
    @abc.abstractmethod
    def send(self, envelope: Envelope) -> None:
        """Store one message: into its queue's box, or a copy into every
        matching subscription of its topic. Returns once stored (durably, for
        a persistent message on a durable store)."""

    @abc.abstractmethod
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
        """Atomically store ``sends`` and acknowledge ``acks`` (a transacted
        session's commit). Each ``extra`` function is called inside the same
        transaction with the store's handle (a SQLAlchemy connection on the SQL
        store, ``None`` in memory), so an application's own record commits
        with the messages or not at all. With ``callback`` the call returns at
        once and ``callback(error_or_None)`` runs, in another thread, once the
        commit is done; with ``finish_on`` too, ``finish_on(fn)`` is handed the
        rest of the commit to run where the caller wants it (its event loop):
        a store that finishes commits in the caller's thread runs it inline.
        ``durable=False`` (``extra`` work alone, which its caller can redo):
        the commit need not wait for the disk; a power cut
        may lose it, but never half of it, nor anything committed after it
        without what came before."""

    def locate(self, message_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
        """Where messages are: ``{message_id: (box, state)}``, state one of
        ``"pending"``, ``"in_flight"`` or ``"expired"`` (expired in that box,
        remembered for a while); messages not found were consumed and
        acknowledged, or never stored."""
        return {}

    # reads
    @abc.abstractmethod
    def reader(self, box: str, selector: str | None, prefetch: int | None = None) -> Reader:
        """A cursor for one consumer; raises InvalidSelectorError for a bad selector. *prefetch*: at
        most this many messages it holds for its consumer at once (None: the store's setting; a store
        that hands messages out one at a time ignores it)."""

    @abc.abstractmethod
    def ack(self, deliveries: Sequence[Delivery], wait: bool = True) -> None:
        """Remove acknowledged entries; with ``wait=False`` the removal may
        complete after the call returns (AUTO and DUPS_OK acknowledgements)."""

    @abc.abstractmethod
    def release(self, deliveries: Sequence[Delivery], reason: str) -> None:
        """Make in-flight entries available again (after the policy's delay),
        or dead-letter those delivered ``max_deliveries`` times, with ``reason``."""

    @abc.abstractmethod
    def dead_letter(self, deliveries: Sequence[Delivery], reason: str) -> None:
        """Move in-flight entries to their dead-letter queue now, whatever
        their delivery count, with ``reason`` as ``JMS_DLQ_Reason``
        (an application that knows a message can never be processed).
        Entries no longer in flight are left alone."""

    @abc.abstractmethod
    def browse(self, box: str, selector: str | None) -> Iterator[Envelope]:
        """Available entries in delivery order, without consuming them."""

    def browse_page(
        self, box: str, selector: str | None, after: tuple[int, ...] | None, limit: int, scan_limit: int
    ) -> tuple[list[StoredMessage], tuple[int, ...] | None]:
        """Up to ``limit`` waiting entries of ``box`` that match ``selector``, in
        delivery order, strictly after position ``after`` (``None``: from the
        start), looking at no more than ``scan_limit`` entries; and the
        position to continue from (``None`` when the box has no more). Bounded
        memory, however deep the box. This default walks :meth:`browse`;
        stores override it with a keyset query."""
        start = after[0] if after else 0
        out: list[StoredMessage] = []
        for n, env in enumerate(self.browse(box, selector)):
            if n < start:
                continue
            out.append(StoredMessage(box, env, "pending", 0, body_size(env), (n + 1,)))
            if len(out) >= limit:
                return out, (n + 1,)
        return out, None

    def find(self, box: str, message_id: str) -> StoredMessage | None:
        """The entry of message ``message_id`` in ``box``, waiting or in flight."""
        for env in self.browse(box, None):
            if env.message_id == message_id:
                return StoredMessage(box, env, "pending", 0, body_size(env), ())
        return None

    def purge(self, box: str) -> int:
        """Remove every waiting entry of ``box`` (in-flight ones stay with
        their consumers); returns how many."""
        reader = self.reader(box, None)
        count = 0
        try:
            while True:
                delivery = reader.claim(now_ms(), True)
                if delivery is None:
                    return count
                count += 1
        finally:
            reader.close()

    def claim_positions(self, box: str, positions: Sequence[tuple[int, ...]]) -> list[Delivery]:
        """Claim (make in flight) the entries of ``box`` at these positions (from :meth:`browse_page` or
        :meth:`find`) that are still waiting and ready; the others are skipped. What an operator's action
        takes (``Broker.remove_messages``, ``move_messages``, ``replay_dead_letters``)."""
        raise NotImplementedError(f"{type(self).__name__} cannot claim messages by position")

    def observe_commits(self, observer: Callable[[float, int], None] | None) -> None:
        """Call ``observer(seconds, operations)`` after each store transaction
        (stores that have none ignore it)."""

    def consumer_counts(self, counts: Callable[[], dict[str, int]]) -> None:
        """Where the broker's open consumers per box can be read (a shared
        store publishes them for other processes)."""

    @abc.abstractmethod
    def stats(self) -> list[DestinationStats]:
        """Counters of every box; ``consumers`` is filled in by the broker."""

    @abc.abstractmethod
    def sweep_expired(self, now: int) -> int:
        """Remove expired entries from every box; returns how many."""


def dead_letter_envelope(envelope: Envelope, policy: RedeliveryPolicy, reason: str, box: str) -> Envelope:
    """The copy of ``envelope`` that goes to its dead-letter queue: it keeps its
    id and headers, never expires, and says where it came from and why."""
    from ._destinations import Queue

    properties = dict(envelope.properties)
    properties["JMS_DLQ_OriginalDestination"] = str(envelope.destination)
    properties["JMS_DLQ_Reason"] = reason[:1000]
    if box.startswith("durable://"):
        properties["JMS_DLQ_Subscription"] = box
    return envelope.replace(
        destination=Queue(policy.dead_letter_name(envelope.destination)),
        expiration=0,
        properties=properties,
    )


def expired_envelope(envelope: Envelope, policy: RedeliveryPolicy) -> Envelope | None:
    """The copy of an expired message for the expiry queue, or ``None`` if none is configured."""
    from ._destinations import Queue

    if policy.expiry_queue is None:
        return None
    properties = dict(envelope.properties)
    properties["JMS_DLQ_OriginalDestination"] = str(envelope.destination)
    properties["JMS_DLQ_Reason"] = f"expired at {envelope.expiration}"
    return envelope.replace(destination=Queue(policy.expiry_queue), expiration=0, properties=properties)
