"""Sessions, producers, consumers and browsers."""

from __future__ import annotations

import logging
import threading
import time
import uuid
import asyncio
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from ._commit import close_off_loop, store_commit_async
from ._constants import DEFAULT_PRIORITY, AckMode, DeliveryMode
from ._destinations import Destination, Queue, Topic
from ._envelope import NON_PERSISTENT
from ._errors import (
    IllegalStateError,
    InvalidArgumentError,
    InvalidClientIDError,
    InvalidDestinationError,
    JMSError,
)
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
from ._store import Delivery, Subscription, queue_box, subscription_box
from ._waiters import AsyncWaiter, ThreadWaiter
from .clock import now_ms

if TYPE_CHECKING:
    import sqlalchemy as sa

    from ._broker import Connection

__all__ = ["Session", "MessageProducer", "MessageConsumer", "QueueBrowser"]

log = logging.getLogger(__name__)

MessageListener = Callable[[Message], Any]


class Session:
    """A single-threaded context for producing and consuming.

    Also a context manager, plain or ``async with``, that closes it.
    A transacted session stages its sends and receives until :meth:`commit`
    (or discards and redelivers them on :meth:`rollback`); its ack mode is
    ``AckMode.TRANSACTED``. Listener calls of one session never overlap.
    """

    def __init__(self, connection: "Connection", transacted: bool, ack_mode: AckMode) -> None:
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

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await close_off_loop(self._store, self.close)

    @property
    def connection(self) -> "Connection":
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

    def create_producer(self, destination: Destination | None = None) -> "MessageProducer":
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

    def create_consumer(self, destination: Destination, selector: str | None = None,
                        no_local: bool = False, *, prefetch: int | None = None) -> "MessageConsumer":
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

    def create_durable_subscriber(self, topic: Topic, name: str, selector: str | None = None,
                                  no_local: bool = False) -> "MessageConsumer":
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
                raise IllegalStateError(f"durable subscription {name!r} of client {client_id!r} already has an active subscriber")
            existing = store.durable_subscription(client_id, name)
            if existing is not None and (existing.topic != topic or existing.selector != selector
                                         or existing.no_local != bool(no_local)):
                store.delete_box(existing.box)
                existing = None
            sub = existing or Subscription(box, topic, selector, bool(no_local), self._connection.origin,
                                           client_id=client_id, name=name)
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

    def _add_consumer(self, consumer: "MessageConsumer") -> "MessageConsumer":
        self._consumers.append(consumer)
        broker = self._broker
        with broker._lock:
            broker._consumers[consumer._box] += 1
        broker._add_waker(consumer._box, consumer._wake)
        return consumer

    def create_browser(self, queue: Queue, selector: str | None = None) -> "QueueBrowser":
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

    def _deliver(self, consumer: "MessageConsumer", delivery: Delivery, for_listener: bool) -> Message:
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
            ack = lambda: self._acknowledge_one(delivery)  # noqa: E731
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
        self._release_unacked(f"the transaction was rolled back: {reason}"[:500] if reason
                              else "the transaction was rolled back")

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

    def _set_listener(self, consumer: "MessageConsumer", listener: MessageListener | None) -> None:
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

    def _dispatch_one(self, consumer: "MessageConsumer", listener: MessageListener) -> bool:
        mode = self.ack_mode
        no_ack = mode is AckMode.NO_ACKNOWLEDGE
        try:
            delivery = consumer._reader.claim(now_ms(), no_ack)
        except JMSError:
            log.exception("claiming a message for a listener failed")
            return False
        if delivery is None:
            return False
        message = self._deliver(consumer, delivery, True)
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


class MessageProducer:
    """Sends messages, to its destination or (unidentified) to the one named
    at each send. ``delivery_mode``, ``priority`` and ``time_to_live`` (ms)
    are the defaults for its sends: PERSISTENT, 4 and 0 (never expires)."""

    def __init__(self, session: Session, destination: Destination | None) -> None:
        self._session = session
        self._broker = session._broker
        self.destination = destination
        self.delivery_mode = DeliveryMode.PERSISTENT
        self.priority = DEFAULT_PRIORITY
        self.time_to_live = 0
        self._closed = False

    def close(self) -> None:
        self._closed = True

    def __enter__(self) -> "MessageProducer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> "MessageProducer":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def send(self, *args: Destination | Message, delivery_mode: int | None = None, priority: int | None = None,
             time_to_live: int | None = None) -> None:
        """``send(message)`` on a producer with a destination, or
        ``send(destination, message)`` on an unidentified one. Sets the sent
        message's ``jms_message_id``, ``jms_timestamp`` and the other headers."""
        destination, message = self._target(args)
        self._send(destination, message, delivery_mode, priority, time_to_live, None)

    def send_async(self, *args: Destination | Message, delivery_mode: int | None = None, priority: int | None = None,
                   time_to_live: int | None = None) -> "asyncio.Future[None]":
        """Like :meth:`send`, for asyncio (JMS 2.0's asynchronous send):
        ``await producer.send_async(message)`` returns once the message is
        stored (durably, when persistent) without blocking the event loop;
        many concurrent sends share commits. What it returns is a plain
        future of the running loop (no task per send): gather it, or add a
        done callback. Invalid arguments raise at the call. In a transacted
        session the message is staged and the future is already done."""
        destination, message = self._target(args)
        env = self._envelope(destination, message, delivery_mode, priority, time_to_live, None)
        self._stamp(message, env)  # before the commit: code running inside it can read jms_message_id
        if self._session.transacted:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._stage(env)
            future.set_result(None)
            return future
        return store_commit_async(self._broker.store, (env,), ())

    def _target(self, args: tuple[Any, ...]) -> tuple[Destination, Message]:
        if len(args) == 1:
            if self.destination is None:
                raise InvalidDestinationError("this producer has no destination: use send(destination, message)")
            return self.destination, args[0]
        if len(args) == 2:
            if self.destination is not None:
                raise InvalidDestinationError(
                    f"this producer sends to {self.destination}; use an unidentified producer to name destinations"
                )
            self._session._check_destination(args[0])
            return args[0], args[1]
        raise TypeError("send() takes (message) or (destination, message)")

    def _send(self, destination: Destination, message: Message, delivery_mode: int | None, priority: int | None,
              time_to_live: int | None, message_id: str | None) -> None:
        env = self._envelope(destination, message, delivery_mode, priority, time_to_live, message_id)
        if self._session.transacted:
            self._stage(env)
        else:
            self._broker.store.send(env)
        self._stamp(message, env)

    def _stage(self, env: Any) -> None:
        session = self._session
        with session._lock:
            session._staged.append(env)

    @staticmethod
    def _stamp(message: Message, env: Any) -> None:
        """Set the headers JMS sets on a sent message."""
        message.jms_message_id = env.message_id
        message.jms_destination = env.destination
        message.jms_delivery_mode = env.delivery_mode
        message.jms_priority = env.priority
        message.jms_timestamp = env.timestamp
        message.jms_expiration = env.expiration

    def _envelope(self, destination: Destination, message: Message, delivery_mode: int | None,
                  priority: int | None, time_to_live: int | None, message_id: str | None) -> Any:
        """Check the arguments and snapshot ``message`` for sending."""
        session = self._session
        if self._closed:
            raise IllegalStateError("the producer is closed")
        if session._closed or session._connection._closed:
            session._check_open()
        if not isinstance(message, Message):
            raise InvalidArgumentError(f"send() takes a Message, got {type(message).__name__}")
        mode = self.delivery_mode if delivery_mode is None else delivery_mode
        if mode != 2 and mode != 1:
            raise InvalidArgumentError(f"delivery_mode must be DeliveryMode.PERSISTENT or NON_PERSISTENT, got {mode!r}")
        prio = self.priority if priority is None else priority
        if prio.__class__ is not int or not 0 <= prio <= 9:
            if isinstance(prio, bool) or not isinstance(prio, int) or not 0 <= prio <= 9:
                raise InvalidArgumentError(f"priority must be an int from 0 to 9, got {prio!r}")
        ttl = self.time_to_live if time_to_live is None else time_to_live
        if not isinstance(ttl, int) or ttl < 0:
            raise InvalidArgumentError(f"time_to_live must be a non-negative int of milliseconds, got {ttl!r}")
        broker = self._broker
        if destination.is_temporary:
            if destination not in broker._temporaries and not broker.store.temporary_exists(destination):
                raise InvalidDestinationError(f"{destination} does not exist any more (deleted, or its connection closed)")
            mode = NON_PERSISTENT
        connection = session._connection
        timestamp = int(time.time() * 1000)
        if message_id is None:
            message_id = f"ID:{broker.instance_id}-{next(broker._ids)}"
        env = message._to_envelope(message_id, destination, mode, prio, timestamp + ttl if ttl else 0,
                                   timestamp, connection.origin)
        if connection.user is not None:  # stamped on the sent copy: a received message stays forwardable
            env.properties["JMSXUserID"] = connection.user
        return env


class MessageConsumer:
    """Receives from a queue or a topic subscription.

    ``receive(timeout)`` blocks up to ``timeout`` seconds (forever when
    ``None``) and returns ``None`` on timeout; ``receive_no_wait()`` never
    blocks; ``await receive_async(timeout)`` waits without blocking the event
    loop, and ``async for message in consumer`` receives that way until the
    consumer (or its session or connection) closes. A consumer with a
    listener (:meth:`set_message_listener`) cannot receive synchronously.
    Also a context manager, plain or ``async with``, that closes it.
    """

    def __init__(self, session: Session, destination: Destination, box: str, reader: Any, selector: str | None,
                 no_local: bool, subscription: Subscription | None, durable: bool = False) -> None:
        self._session = session
        self._destination = destination
        self._box = box
        self._reader = reader
        self.message_selector = selector or None
        self.no_local = no_local
        self._subscription = subscription
        self._durable = durable
        self._closed = False
        self._listener: MessageListener | None = None
        self._waiter: Any = None
        self._thread_waiter = ThreadWaiter()
        self._auto_ack = session.ack_mode in (AckMode.AUTO, AckMode.DUPS_OK, AckMode.NO_ACKNOWLEDGE)
        reader.demand = self._waiting  # stores may hand new messages straight to a waiting consumer
        reader.wake = self._wake  # ... and then wake it alone

    def _waiting(self) -> bool:
        """Whether this consumer is waiting for a message right now."""
        return (not self._closed and self._session._connection._started
                and (self._waiter is not None or self._listener is not None))

    def __enter__(self) -> "MessageConsumer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> "MessageConsumer":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await close_off_loop(self._session._store, self.close)

    def __aiter__(self) -> "MessageConsumer":
        return self

    async def __anext__(self) -> Message:
        """``async for message in consumer``: each message as it arrives,
        until the consumer, its session or its connection closes."""
        while True:
            if self._closed or self._session._closed or self._session._connection._closed:
                raise StopAsyncIteration
            message = await self.receive_async(None)
            if message is not None:
                return message

    def __repr__(self) -> str:
        return f"<MessageConsumer {self._destination} selector={self.message_selector!r}>"

    @property
    def destination(self) -> Destination:
        return self._destination

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            waiter.wake()
        elif self._listener is not None:
            self._session._dispatch_waiter.wake()

    def _check_receivable(self) -> None:
        if self._closed:
            raise IllegalStateError("the consumer is closed")
        self._session._check_open()
        if self._listener is not None:
            raise IllegalStateError("this consumer has a message listener; it cannot also receive synchronously")

    def _receive_now(self) -> Message | None:
        if not self._session._connection._started:
            return None
        delivery = self._reader.claim(now_ms(), self._auto_ack)
        if delivery is None:
            return None
        return self._session._deliver(self, delivery, False)

    def _wait_time(self, deadline: float | None) -> float | None:
        """Seconds to wait next: until the deadline or a delayed redelivery."""
        remaining = None if deadline is None else deadline - time.monotonic()
        ready = self._reader.next_ready()
        if ready is not None:
            until_ready = max(0.0, (ready - now_ms()) / 1000) + 0.001
            remaining = until_ready if remaining is None else min(remaining, until_ready)
        return remaining

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, waiting up to ``timeout`` seconds (``None``:
        until one arrives or the consumer closes). ``None`` on timeout."""
        self._check_receivable()
        message = self._receive_now()
        if message is not None or timeout == 0:
            return message
        deadline = None if timeout is None else time.monotonic() + timeout
        waiter = self._thread_waiter
        self._waiter = waiter
        try:
            while True:
                message = self._receive_now()
                if message is not None or self._closed:
                    return message
                wait = self._wait_time(deadline)
                if wait is not None and wait <= 0 and deadline is not None and time.monotonic() >= deadline:
                    return None
                waiter.wait(wait)
                if self._closed or self._session._closed:
                    return None
        finally:
            self._waiter = None

    def receive_no_wait(self) -> Message | None:
        """The next message if one is available now, else ``None``."""
        self._check_receivable()
        return self._receive_now()

    async def _receive_now_async(self) -> Message | None:
        """:meth:`_receive_now` without stalling the loop on a claim that waits for a store write."""
        reader, now = self._reader, now_ms()
        if not reader.claim_may_wait(now):
            return self._receive_now()
        if not self._session._connection._started:
            return None
        delivery = await reader.claim_async(now, self._auto_ack)
        if delivery is None:
            return None
        return self._session._deliver(self, delivery, False)

    async def receive_async(self, timeout: float | None = None) -> Message | None:
        """Like :meth:`receive`, for asyncio: waits without blocking the loop
        (a claim that writes to the SQL store runs in a thread)."""
        self._check_receivable()
        message = await self._receive_now_async()
        if message is not None or timeout == 0:
            return message
        deadline = None if timeout is None else time.monotonic() + timeout
        waiter = AsyncWaiter()
        self._waiter = waiter
        try:
            while True:
                message = await self._receive_now_async()
                if message is not None or self._closed:
                    return message
                wait = self._wait_time(deadline)
                if wait is not None and wait <= 0 and deadline is not None and time.monotonic() >= deadline:
                    return None
                await waiter.wait(wait)
                if self._closed or self._session._closed:
                    return None
        finally:
            self._waiter = None

    @property
    def message_listener(self) -> MessageListener | None:
        return self._listener

    def set_message_listener(self, listener: MessageListener | None) -> None:
        """Deliver messages to ``listener(message)`` on the session's dispatch
        thread (``None`` removes it). A listener that raises fails the
        delivery: the message is redelivered, then dead-lettered."""
        if self._closed:
            raise IllegalStateError("the consumer is closed")
        self._session._check_open()
        if listener is not None and not callable(listener):
            raise InvalidArgumentError("a message listener must be callable")
        self._listener = listener
        self._session._set_listener(self, listener)

    def close(self) -> None:
        """Stop receiving. Messages received but not acknowledged stay with
        the session (acknowledge, recover or close it)."""
        if self._closed:
            return
        if self._listener is not None:
            self._session._wait_listener_idle()
        self._close()

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        session = self._session
        broker = session._broker
        self._listener = None
        session._set_listener(self, None)
        waiter = self._waiter
        if waiter is not None:
            waiter.wake()
        broker._remove_waker(self._box, self._wake)
        self._reader.close()
        with broker._lock:
            broker._consumers[self._box] -= 1
            if broker._consumers[self._box] <= 0:
                del broker._consumers[self._box]
            broker._active_durables.discard(self._box) if self._durable else None
        if self._subscription is not None and not self._durable:
            broker.store.delete_box(self._box)
        if self in session._consumers:
            session._consumers.remove(self)


class QueueBrowser:
    """Iterate (``for m in browser``) over the messages waiting in a queue, in
    delivery order, without consuming them; each iteration takes a fresh look."""

    def __init__(self, session: Session, queue: Queue, selector: str | None) -> None:
        self._session = session
        self.queue = queue
        self.message_selector = selector
        self._closed = False

    def __iter__(self) -> Iterator[Message]:
        if self._closed:
            raise IllegalStateError("the browser is closed")
        self._session._check_open()
        for env in self._session._store.browse(queue_box(self.queue), self.message_selector):
            yield message_from_envelope(env, 0)

    def close(self) -> None:
        self._closed = True
        if self in self._session._browsers:
            self._session._browsers.remove(self)

    def __enter__(self) -> "QueueBrowser":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
