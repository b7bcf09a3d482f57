"""Sessions: the single-threaded context that creates producers, consumers and
browsers, and holds a transaction or the unacknowledged deliveries."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ._browser import QueueBrowser
from ._commit import close_off_loop, store_commit_async
from ._constants import AckMode
from ._consumer import MessageConsumer, MessageListener
from ._destinations import Destination, Queue, Topic
from ._errors import IllegalStateError, InvalidArgumentError, InvalidClientIDError, InvalidDestinationError, JMSError
from ._message import (
    BodyValue,
    BytesMessage,
    MapMessage,
    Message,
    ObjectMessage,
    StreamMessage,
    TextMessage,
    XMLMessage,
    message_from_envelope,
)
from ._producer import MessageProducer
from ._store import Delivery, Subscription, queue_box, subscription_box
from ._waiters import ThreadWaiter
from .clock import now_ms

if TYPE_CHECKING:
    import sqlalchemy as sa

    from ._connection import Connection

__all__ = ["Session"]

log = logging.getLogger(__name__)


class Session:
    """A single-threaded context for producing and consuming.

    Also a context manager, plain or ``async with``, that closes it.
    A transacted session stages its sends and receives until :meth:`commit`
    (or discards and redelivers them on :meth:`rollback`); its ack mode is
    ``AckMode.TRANSACTED``. Listener calls of one session never overlap.
    """

    def __init__(self, connection: Connection, transacted: bool, ack_mode: AckMode) -> None:
        if not transacted:
            try:
                ack_mode = AckMode(ack_mode)
            except ValueError:
                raise InvalidArgumentError(f"unknown acknowledge mode {ack_mode!r}; use an AckMode") from None
            if ack_mode is AckMode.TRANSACTED:
                raise InvalidArgumentError("AckMode.TRANSACTED is for transacted sessions: pass transacted=True")
        self._connection = connection
        self._broker = connection._broker
        self._store = self._broker.store
        self.transacted = transacted
        self.ack_mode = AckMode.TRANSACTED if transacted else ack_mode
        self._closed = False
        self._lock = threading.Lock()  # guards _unacked and _staged; never held while calling out
        self._consumers: list[MessageConsumer] = []
        self._producers: list[MessageProducer] = []
        self._browsers: list[QueueBrowser] = []
        self._unacked: dict[int, Delivery] = {}  # CLIENT, INDIVIDUAL, TRANSACTED: id(delivery) -> delivery
        self._staged: list[Any] = []  # transacted sends (envelopes)
        self._listeners: list[MessageConsumer] = []
        self._dispatch_waiter = ThreadWaiter()
        self._dispatch_lock = threading.RLock()
        self._dispatcher: threading.Thread | None = None
        self._dispatch_thread_id: int | None = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await close_off_loop(self._store, self.close)

    @property
    def connection(self) -> Connection:
        return self._connection

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("the session is closed")
        if self._connection._closed:
            raise IllegalStateError("the connection is closed")

    # ------------------------------------------------------------ messages

    def create_message(self) -> Message:
        self._check_open()
        return Message()

    def create_text_message(self, text: str | None = None) -> TextMessage:
        self._check_open()
        return TextMessage(text)

    def create_xml_message(self, text: str | None = None) -> XMLMessage:
        self._check_open()
        return XMLMessage(text)

    def create_map_message(self, values: dict[str, BodyValue | None] | None = None) -> MapMessage:
        self._check_open()
        return MapMessage(values)

    def create_bytes_message(self, data: bytes | None = None) -> BytesMessage:
        self._check_open()
        return BytesMessage(data)

    def create_stream_message(self, values: Iterable[BodyValue | None] | None = None) -> StreamMessage:
        self._check_open()
        return StreamMessage(values)

    def create_object_message(self, obj: Any = None) -> ObjectMessage:
        self._check_open()
        return ObjectMessage(obj)

    def create_queue(self, name: str) -> Queue:
        return Queue(name)

    def create_topic(self, name: str) -> Topic:
        return Topic(name)

    # ------------------------------------------------------------ producers and consumers

    def create_producer(self, destination: Destination | None = None) -> MessageProducer:
        """A producer for ``destination``, or an unidentified one (``None``)
        that names the destination at each ``send(destination, message)``."""
        self._check_open()
        if destination is not None:
            self._check_destination(destination)
        producer = MessageProducer(self, destination)
        self._producers.append(producer)
        return producer

    def _check_destination(self, destination: Any) -> None:
        if not isinstance(destination, Destination):
            raise InvalidDestinationError(f"expected a Queue or Topic, got {destination!r}")

    def _check_own_temporary(self, destination: Destination) -> None:
        if destination.is_temporary and self._broker._temporaries.get(destination) is not self._connection:
            raise InvalidDestinationError(
                f"{destination} belongs to another connection (or was deleted): only the connection that created a "
                "temporary destination may consume from it"
            )

    def create_consumer(
        self,
        destination: Destination,
        selector: str | None = None,
        no_local: bool = False,
        *,
        prefetch: int | None = None,
    ) -> MessageConsumer:
        """A consumer of a queue, or a non-durable subscriber of a topic.
        ``no_local`` (topics only) skips messages sent by this connection.
        ``prefetch`` (ActiveMQ's ``consumer.prefetchSize``): at most this many
        messages the store claims for this consumer ahead of ``receive``
        (default: the store's ``prefetch`` option). A consumer that does slow
        work per message should take 1, so that a backlog is shared among
        its peers instead of waiting behind it."""
        self._check_open()
        if prefetch is not None and (isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1):
            raise InvalidArgumentError(f"prefetch must be an int >= 1 or None, got {prefetch!r}")
        self._check_destination(destination)
        self._check_own_temporary(destination)
        store = self._store
        if destination.is_topic:
            box = subscription_box(None, None, unique=uuid.uuid4().hex)
            sub = Subscription(box, destination, selector or None, bool(no_local), self._connection.origin)
            store.create_subscription(sub)
            try:
                reader = store.reader(box, None, prefetch)
            except BaseException:
                store.delete_box(box)
                raise
            return self._add_consumer(MessageConsumer(self, destination, box, reader, selector, no_local, sub))
        box = queue_box(destination)
        store.create_queue(box, destination)
        reader = store.reader(box, selector or None, prefetch)
        return self._add_consumer(MessageConsumer(self, destination, box, reader, selector, False, None))

    def create_durable_subscriber(
        self, topic: Topic, name: str, selector: str | None = None, no_local: bool = False
    ) -> MessageConsumer:
        """A durable subscription (client id + ``name``) that keeps messages
        while its subscriber is away. Re-creating it with another topic,
        selector or ``no_local`` replaces it (its messages are dropped)."""
        self._check_open()
        if not isinstance(topic, Topic) or topic.is_temporary:
            raise InvalidDestinationError(f"durable subscriptions need a (non-temporary) Topic, got {topic!r}")
        client_id = self._connection.client_id
        if client_id is None:
            raise InvalidClientIDError("durable subscriptions need a client id: connect(client_id=...)")
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError("a durable subscription needs a non-empty name")
        broker = self._broker
        store = self._store
        selector = selector or None
        from ._selector import compile_selector

        # fail before an existing subscription is replaced (and its messages dropped)
        compile_selector(selector, xpath_namespaces=broker.xpath_namespaces or None)
        box = subscription_box(client_id, name)
        with broker._lock:
            if box in broker._active_durables:
                raise IllegalStateError(
                    f"durable subscription {name!r} of client {client_id!r} already has an active subscriber"
                )
            existing = store.durable_subscription(client_id, name)
            if existing is not None and (
                existing.topic != topic or existing.selector != selector or existing.no_local != bool(no_local)
            ):
                store.delete_box(existing.box)
                existing = None
            sub = existing or Subscription(
                box, topic, selector, bool(no_local), self._connection.origin, client_id=client_id, name=name
            )
            if existing is None:
                store.create_subscription(sub)
            reader = store.reader(box, None)
            broker._active_durables.add(box)
        return self._add_consumer(MessageConsumer(self, topic, box, reader, selector, no_local, sub, durable=True))

    def unsubscribe(self, name: str) -> None:
        """Delete a durable subscription of this connection's client id."""
        self._check_open()
        client_id = self._connection.client_id
        if client_id is None:
            raise InvalidClientIDError("unsubscribe needs a client id: connect(client_id=...)")
        box = subscription_box(client_id, name)
        with self._broker._lock:
            if box in self._broker._active_durables:
                raise IllegalStateError(f"durable subscription {name!r} has an active subscriber; close it first")
            if self._store.durable_subscription(client_id, name) is None:
                raise InvalidDestinationError(f"no durable subscription {name!r} for client {client_id!r}")
            self._store.delete_box(box)

    def _add_consumer(self, consumer: MessageConsumer) -> MessageConsumer:
        self._consumers.append(consumer)
        broker = self._broker
        with broker._lock:
            broker._consumers[consumer._box] += 1
        broker._add_waker(consumer._box, consumer._wake)
        return consumer

    def create_browser(self, queue: Queue, selector: str | None = None) -> QueueBrowser:
        """A browser: iterate over a queue's waiting messages without consuming them."""
        self._check_open()
        if not isinstance(queue, Queue):
            raise InvalidDestinationError(f"only queues can be browsed, got {queue!r}")
        from ._selector import compile_selector

        compile_selector(selector, xpath_namespaces=self._broker.xpath_namespaces or None)  # fail early
        browser = QueueBrowser(self, queue, selector or None)
        self._browsers.append(browser)
        return browser

    # ------------------------------------------------------------ delivery and acknowledgement

    def _deliver(self, consumer: MessageConsumer, delivery: Delivery) -> Message:
        """Wrap a claimed delivery and track it as the session's mode says."""
        mode = self.ack_mode
        ack = None
        if mode is AckMode.CLIENT:
            with self._lock:
                self._unacked[id(delivery)] = delivery
            ack = self._acknowledge_all
        elif mode is AckMode.INDIVIDUAL:
            with self._lock:
                self._unacked[id(delivery)] = delivery
            ack = lambda: self._acknowledge_one(delivery)
        elif mode is AckMode.TRANSACTED:
            with self._lock:
                self._unacked[id(delivery)] = delivery
        return message_from_envelope(delivery.envelope, delivery.count, ack)

    def _acknowledge_all(self) -> None:
        if self._closed:
            raise IllegalStateError("the session that received this message is closed")
        with self._lock:
            deliveries = list(self._unacked.values())
            self._unacked.clear()
        if deliveries:
            self._store.ack(deliveries)

    def _acknowledge_one(self, delivery: Delivery) -> None:
        if self._closed:
            raise IllegalStateError("the session that received this message is closed")
        with self._lock:
            found = self._unacked.pop(id(delivery), None)
        if found is not None:
            self._store.ack([found])

    def acknowledge(self) -> None:
        """Acknowledge everything this session consumed (CLIENT or INDIVIDUAL)."""
        self._check_open()
        if self.ack_mode in (AckMode.CLIENT, AckMode.INDIVIDUAL):
            self._acknowledge_all()

    def recover(self) -> None:
        """Redeliver every unacknowledged message, marked redelivered."""
        self._check_open()
        if self.transacted:
            raise IllegalStateError("recover() is for non-transacted sessions; use rollback()")
        self._release_unacked("the session was recovered")

    def dead_letter(self, message: Message, reason: str) -> None:
        """Move ``message``, received by this session and not yet
        acknowledged (CLIENT, INDIVIDUAL or transacted), to its dead-letter
        queue now, with ``JMS_DLQ_Reason`` = ``reason``: for a message the
        application knows it can never process, which redelivery would only
        repeat. It happens at once, outside any transaction: a later
        rollback or recover does not bring it back. Raises
        :class:`IllegalStateError` for a message this session does not hold
        unacknowledged (AUTO and DUPS_OK sessions acknowledge on receipt)."""
        self._check_open()
        if not isinstance(reason, str):
            raise InvalidArgumentError(f"the reason must be a string, got {type(reason).__name__}")
        message_id = getattr(message, "jms_message_id", None)
        with self._lock:
            found = None
            for key, delivery in self._unacked.items():
                if delivery.envelope.message_id == message_id:
                    found = key
                    break
            delivery = self._unacked.pop(found) if found is not None else None
        if delivery is None:
            raise IllegalStateError(
                f"message {message_id!r} is not held unacknowledged by this session (received elsewhere, "
                "acknowledged or committed already, or the session acknowledges on receipt)"
            )
        self._store.dead_letter([delivery], reason)

    def _release_unacked(self, reason: str) -> None:
        """Redeliver what this session received and did not acknowledge, and
        give back what its consumers hold prefetched, so that delivery
        restarts with the oldest of them (JMS: recover and rollback restart
        the session's stream of messages after its last acknowledged one)."""
        with self._lock:
            deliveries = sorted(self._unacked.values(), key=lambda d: d.count)
            self._unacked.clear()
        for consumer in list(self._consumers):
            consumer._reader.release_held()
        if deliveries:
            self._store.release(deliveries, reason)

    def commit(self, in_transaction: Sequence[Callable[[sa.Connection | None], object]] = ()) -> None:
        """Make this transaction's sends and receives happen, atomically.

        ``in_transaction``: functions called inside the same store transaction
        with the store's handle (a SQLAlchemy connection on the SQL store), so
        that an application record (a ledger row, say) commits with the
        messages or not at all."""
        staged, consumed = self._take_transaction()
        if staged or consumed or in_transaction:
            self._store.commit(staged, consumed, in_transaction)

    async def commit_async(self, in_transaction: Sequence[Callable[[sa.Connection | None], object]] = ()) -> None:
        """Like :meth:`commit`, for asyncio: waits for the durable commit
        without blocking the event loop (concurrent commits share one fsync)."""
        staged, consumed = self._take_transaction()
        if staged or consumed or in_transaction:
            await store_commit_async(self._store, staged, consumed, in_transaction)

    def _take_transaction(self) -> tuple[list[Any], list[Delivery]]:
        self._check_open()
        if not self.transacted:
            raise IllegalStateError("commit() is only for transacted sessions")
        with self._lock:
            staged, self._staged = self._staged, []
            consumed = list(self._unacked.values())
            self._unacked.clear()
        return staged, consumed

    def rollback(self, reason: str | None = None) -> None:
        """Discard this transaction's sends and redeliver what it received.
        ``reason`` (why it failed) is what a dead-letter queue records as the
        last failure of a message this was the last delivery of."""
        self._check_open()
        if not self.transacted:
            raise IllegalStateError("rollback() is only for transacted sessions")
        with self._lock:
            self._staged = []
        self._release_unacked(
            f"the transaction was rolled back: {reason}"[:500] if reason else "the transaction was rolled back"
        )

    def close(self) -> None:
        """Close consumers, producers and browsers; roll back an open
        transaction; redeliver what was not acknowledged."""
        if self._closed:
            return
        self._closed = True
        self._dispatch_waiter.wake()
        dispatcher = self._dispatcher
        if dispatcher is not None and threading.get_ident() != self._dispatch_thread_id:
            dispatcher.join(timeout=30)
        for consumer in list(self._consumers):
            consumer._close()
        for browser in list(self._browsers):
            browser.close()
        self._producers.clear()
        with self._lock:
            self._staged = []
        reason = "the transaction was rolled back" if self.transacted else "the session closed before acknowledging"
        self._release_unacked(reason)
        self._connection._session_closed(self)

    # ------------------------------------------------------------ listeners

    def _wake_all(self) -> None:
        self._dispatch_waiter.wake()
        for consumer in list(self._consumers):
            consumer._wake()

    def _wait_listener_idle(self) -> None:
        if threading.get_ident() != self._dispatch_thread_id:
            with self._dispatch_lock:
                pass

    def _set_listener(self, consumer: MessageConsumer, listener: MessageListener | None) -> None:
        with self._lock:
            if listener is None:
                if consumer in self._listeners:
                    self._listeners.remove(consumer)
                return
            if consumer not in self._listeners:
                self._listeners.append(consumer)
            if self._dispatcher is None:
                self._dispatcher = threading.Thread(target=self._dispatch_loop, name="session-dispatch", daemon=True)
                self._dispatcher.start()
        self._dispatch_waiter.wake()

    def _dispatch_loop(self) -> None:
        self._dispatch_thread_id = threading.get_ident()
        waiter = self._dispatch_waiter
        while not self._closed:
            delivered = False
            next_ready = None
            if self._connection._started:
                for consumer in list(self._listeners):
                    if self._closed or not self._connection._started:
                        break
                    listener = consumer._listener
                    if listener is None or consumer._closed:
                        continue
                    with self._dispatch_lock:  # stop() waits on this lock, then nothing new starts
                        if self._closed or not self._connection._started:
                            break
                        delivered |= self._dispatch_one(consumer, listener)
                    ready = consumer._reader.next_ready()
                    if ready is not None:
                        next_ready = ready if next_ready is None else min(next_ready, ready)
            if not delivered:
                timeout = None if next_ready is None else max(0.0, (next_ready - now_ms()) / 1000)
                waiter.wait(timeout if timeout is not None else 1.0)

    def _dispatch_one(self, consumer: MessageConsumer, listener: MessageListener) -> bool:
        mode = self.ack_mode
        no_ack = mode is AckMode.NO_ACKNOWLEDGE
        try:
            delivery = consumer._reader.claim(now_ms(), no_ack)
        except JMSError:
            log.exception("claiming a message for a listener failed")
            return False
        if delivery is None:
            return False
        message = self._deliver(consumer, delivery)
        try:
            listener(message)
        except Exception as exc:
            reason = f"listener raised {type(exc).__name__}: {exc}"[:500]
            log.warning("message %s: %s", delivery.envelope.message_id, reason, exc_info=True)
            if no_ack:
                return True
            if mode is AckMode.TRANSACTED:
                if not self._closed:
                    self.rollback()
                return True
            with self._lock:
                self._unacked.pop(id(delivery), None)
            self._store.release([delivery], reason)
            return True
        if mode is AckMode.AUTO or mode is AckMode.DUPS_OK:
            self._store.ack([delivery], wait=False)
        return True
