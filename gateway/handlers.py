"""Message handlers: consume documents from the broker and reply, exactly once.

A backend developer writes a function and declares where its messages come
from::

    from gateway.handlers import handler, registry, Worker

    @handler("orders.inbound", selector="JMSType = 'Order'")
    def respond(message, context):
        order = message.document()          # lxml root of the XML body
        ...
        return reply_xml                     # str, lxml element, Message, or None

    worker = Worker(broker, registry)        # or Worker(broker, [respond, ...])
    worker.start()
    ...
    worker.stop()                            # waits for messages in progress

What the worker guarantees:

* Each handler gets its own connection and ``concurrency`` transacted
  sessions, each with its own consumer and thread (a ``receive`` loop).
* The request and everything sent for it (the reply, and whatever the handler
  sends through ``context``) commit in ONE transaction: a crash or an
  exception before the commit sends nothing and redelivers the request
  (``jms_redelivered``); the broker dead-letters it after its
  ``max_deliveries``.
* The reply goes to the request's ``jms_reply_to`` with
  ``jms_correlation_id = reply_correlation_id(request)`` and, unless the
  handler set one, ``jms_type`` = the local name of the reply's root element.
* A request without ``jms_reply_to`` just commits (a reply the handler
  returned is dropped, with a debug log line). When the reply destination no
  longer exists (the requester's temporary queue is gone) the worker logs a
  warning and commits without the reply, so the request is not redelivered
  forever.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from lxml import etree

from broker_core import (
    Broker,
    Connection,
    Destination,
    IllegalStateError,
    InvalidDestinationError,
    JMSError,
    Message,
    MessageConsumer,
    MessageProducer,
    Queue,
    Session,
    TextMessage,
    XMLMessage,
    parse_destination,
    reply_correlation_id,
)

__all__ = [
    "Handler",
    "HandlerContext",
    "HandlerRegistry",
    "HandlerStats",
    "Worker",
    "handler",
    "registry",
]

log = logging.getLogger(__name__)

#: What a handler function looks like: ``fn(message, context) -> reply``.
HandlerFunction = Callable[[Message, "HandlerContext"], Any]


# --------------------------------------------------------------------------- declaring handlers


def _as_destination(destination: str | Destination) -> Destination:
    if isinstance(destination, Destination):
        dest = destination
    elif isinstance(destination, str):
        dest = parse_destination(destination) if "://" in destination else Queue(destination)
    else:
        raise TypeError(f"a handler consumes from a queue name or a Queue/Topic, got {destination!r}")
    if dest.is_temporary:
        raise ValueError(f"{dest}: a handler cannot consume from a temporary destination of another connection")
    return dest


@dataclasses.dataclass(frozen=True, eq=False)
class Handler:
    """A handler function and where it consumes from.

    Calling it calls the function (so a decorated function stays usable
    directly, e.g. in unit tests). ``name`` identifies it in the registry, in
    :meth:`Worker.stats`, in thread names and in log lines.
    """

    function: HandlerFunction
    destination: Destination
    selector: str | None = None
    concurrency: int = 1
    name: str = ""
    #: messages each session's consumer claims ahead of the one it works on (see :func:`handler`)
    prefetch: int = 1

    def __post_init__(self) -> None:
        if not callable(self.function):
            raise TypeError(f"a handler must be callable, got {self.function!r}")
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ValueError(f"concurrency must be an int >= 1, got {self.concurrency!r}")
        if isinstance(self.prefetch, bool) or not isinstance(self.prefetch, int) or self.prefetch < 1:
            raise ValueError(f"prefetch must be an int >= 1, got {self.prefetch!r}")
        if self.destination.is_topic and self.concurrency != 1:
            raise ValueError(
                f"{self.destination}: concurrency must be 1 for a topic (each session would be a subscription of "
                "its own and get its own copy of every message)"
            )
        if not self.name:
            fn = self.function
            default = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
            object.__setattr__(self, "name", default)

    def __call__(self, message: Message, context: "HandlerContext") -> Any:
        return self.function(message, context)

    def __repr__(self) -> str:
        selector = f" selector={self.selector!r}" if self.selector else ""
        return f"<Handler {self.name} on {self.destination}{selector} concurrency={self.concurrency}>"


class HandlerRegistry:
    """Handlers by name, in registration order. Registering a name again
    replaces the earlier handler (so reloading a module does not duplicate it)."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._lock = threading.Lock()

    def add(self, item: Handler) -> Handler:
        if not isinstance(item, Handler):
            raise TypeError(f"expected a Handler, got {item!r}")
        with self._lock:
            if item.name in self._handlers:
                log.debug("handler %s registered again; replacing the earlier one", item.name)
            self._handlers[item.name] = item
        return item

    def remove(self, name: str) -> Handler | None:
        with self._lock:
            return self._handlers.pop(name, None)

    def get(self, name: str) -> Handler | None:
        return self._handlers.get(name)

    def clear(self) -> None:
        with self._lock:
            self._handlers.clear()

    def __iter__(self) -> Iterator[Handler]:
        with self._lock:
            return iter(list(self._handlers.values()))

    def __len__(self) -> int:
        return len(self._handlers)

    def __contains__(self, item: object) -> bool:
        if isinstance(item, Handler):
            return self._handlers.get(item.name) is item
        return item in self._handlers

    def __repr__(self) -> str:
        return f"<HandlerRegistry {list(self._handlers)}>"


#: The process-wide registry ``@handler`` registers into by default.
registry = HandlerRegistry()

_DEFAULT_REGISTRY: Any = object()


def handler(
    destination: str | Destination,
    selector: str | None = None,
    *,
    concurrency: int = 1,
    name: str | None = None,
    prefetch: int = 1,
    registry: HandlerRegistry | None = _DEFAULT_REGISTRY,
) -> Callable[[HandlerFunction], Handler]:
    """Declare ``fn(message, context)`` as the handler of ``destination``.

    ``destination``: a queue name (``"orders.inbound"``), ``"queue://..."`` /
    ``"topic://..."``, or a :class:`~broker_core.Queue` / :class:`~broker_core.Topic`.
    ``selector``: a message selector (``"JMSType = 'Order'"``).
    ``concurrency``: how many sessions (threads) consume in parallel (1 for a
    topic). ``name``: defaults to ``module.qualname`` of the function.
    ``prefetch``: how many messages each session's consumer claims ahead of
    the one it works on; 1 (the default) shares a backlog among the sessions
    and processes as it builds up (with more, one session could hold dozens
    of requests while the others idle: measured with the sample responder,
    two processes, 100 clients in a closed loop); raise it for cheap handlers
    to save claim transactions.
    ``registry``: where to register (the module's :data:`registry` by default;
    ``None``: nowhere). Returns the :class:`Handler`, which is callable like
    the function.
    """
    dest = _as_destination(destination)

    def decorate(fn: HandlerFunction) -> Handler:
        item = Handler(fn, dest, selector or None, concurrency, name or "", prefetch)
        target = globals()["registry"] if registry is _DEFAULT_REGISTRY else registry
        if target is not None:
            target.add(item)
        return item

    return decorate


# --------------------------------------------------------------------------- what a handler gets


@dataclasses.dataclass(frozen=True)
class HandlerContext:
    """What a handler function gets besides the message.

    ``session`` is the transacted session the request was received on: what
    is sent on it (``context.send(...)`` or a producer of its own) commits with
    the request and the reply, or not at all. Do not commit or roll it back:
    the worker does. ``logger`` is ``gateway.handlers.<handler name>``.
    """

    handler_name: str
    session: Session
    producer: MessageProducer
    broker: Broker
    logger: logging.Logger

    def send(self, destination: str | Destination, message: Message | str | etree._Element, **options: Any) -> Message:
        """Send ``message`` (a Message, XML text or an lxml element) to
        ``destination`` (a queue name or a Destination) in the current
        transaction. ``options``: ``delivery_mode``, ``priority``,
        ``time_to_live``. Returns the message sent."""
        dest = _as_destination(destination) if isinstance(destination, str) else destination
        msg = _to_message(self.session, message)
        if msg is None:
            raise TypeError("send() needs a message")
        _set_type(msg)
        self.producer.send(dest, msg, **options)
        return msg


def _to_message(session: Session, result: Any) -> Message | None:
    """The reply a handler returned, as a Message (``None`` for no reply)."""
    if result is None or isinstance(result, Message):
        return result
    if isinstance(result, str):
        return session.create_xml_message(result)
    if isinstance(result, etree._ElementTree):
        result = result.getroot()
    if isinstance(result, etree._Element):
        return session.create_xml_message(etree.tostring(result, encoding="unicode"))
    raise TypeError(
        f"a handler returns XML text, an lxml element, a Message or None; got {type(result).__name__}"
    )


def _set_type(message: Message) -> None:
    """Set ``jms_type`` to the root element's local name of an XML body, unless set."""
    if message.jms_type is not None:
        return
    if isinstance(message, XMLMessage):
        root = message.document()  # MessageFormatError when the text is not well-formed
    elif isinstance(message, TextMessage) and message.text and message.text.lstrip().startswith("<"):
        try:
            root = XMLMessage(message.text).document()
        except JMSError:
            return  # plain text that happens to start with '<'
    else:
        return
    message.jms_type = etree.QName(root).localname


# --------------------------------------------------------------------------- statistics


@dataclasses.dataclass(frozen=True)
class HandlerStats:
    """Counters of one handler since its worker was made.

    ``handled``: requests whose transaction committed; ``replied``: replies
    committed with them; ``failed``: attempts rolled back (the handler or the
    commit raised; the request is redelivered or dead-lettered);
    ``undeliverable``: replies dropped because their destination no longer
    existed.
    """

    handled: int = 0
    replied: int = 0
    failed: int = 0
    undeliverable: int = 0


class _Counters:
    __slots__ = ("handled", "replied", "failed", "undeliverable")

    def __init__(self) -> None:
        self.handled = self.replied = self.failed = self.undeliverable = 0

    def snapshot(self) -> HandlerStats:
        return HandlerStats(self.handled, self.replied, self.failed, self.undeliverable)


# --------------------------------------------------------------------------- the worker


class _Runner:
    """One handler's connection, sessions and threads."""

    def __init__(self, worker: "Worker", item: Handler) -> None:
        self.worker = worker
        self.handler = item
        self.logger = logging.getLogger(f"{__name__}.{item.name}")
        self.connection: Connection | None = None
        self.threads: list[threading.Thread] = []
        # held by the one session that waits on the broker for the next message (see _receive)
        self.waiting = threading.Lock()

    def open(self) -> None:
        broker = self.worker.broker
        self.connection = broker.connect()
        loops = []
        for n in range(self.handler.concurrency):
            session = self.connection.create_session(transacted=True)
            consumer = session.create_consumer(self.handler.destination, self.handler.selector,
                                               prefetch=self.handler.prefetch)
            producer = session.create_producer(None)
            context = HandlerContext(self.handler.name, session, producer, broker, self.logger)
            loops.append((n, session, consumer, producer, context))
        self.threads = [
            threading.Thread(target=self._loop, args=loop[1:], name=f"handler-{self.handler.name}-{loop[0]}",
                             daemon=True)
            for loop in loops
        ]

    def start(self) -> None:
        assert self.connection is not None
        self.connection.start()
        for thread in self.threads:
            thread.start()

    def close(self) -> None:
        if self.connection is not None:
            try:
                self.connection.close()
            except Exception:
                log.exception("closing the connection of handler %s failed", self.handler.name)

    def _loop(self, session: Session, consumer: MessageConsumer, producer: MessageProducer,
               context: HandlerContext) -> None:
        stopping = self.worker._stopping
        poll = self.worker.poll_interval
        backoff = poll
        while not stopping.is_set():
            try:
                message = self._receive(consumer, poll)
            except IllegalStateError:
                return  # the session, connection or broker was closed
            except JMSError:
                if stopping.is_set():
                    return
                log.exception("handler %s: receiving failed; retrying in %.1f s", self.handler.name, backoff)
                stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = poll
            if message is not None:
                # a message received is processed even when stopping: it is claimed already
                self._process(session, producer, context, message)

    def _receive(self, consumer: MessageConsumer, poll: float) -> Message | None:
        """The next message for this session: one it holds already or that is there now, else the one it
        waits for -- but only one session of the handler waits on the broker at a time, the others wait
        for their turn here. Otherwise every new message would wake all of them: each would look for it,
        all but one would try to claim it in vain, every such attempt a write the store's single writer
        serialises ahead of the real work, and the round-trip latency of every request grows with
        ``concurrency``."""
        if self.handler.concurrency == 1:
            return consumer.receive(poll)
        message = consumer.receive_no_wait()
        if message is not None:
            return message
        if not self.waiting.acquire(timeout=poll):
            return None
        try:
            return consumer.receive(poll)
        finally:
            self.waiting.release()

    def _process(self, session: Session, producer: MessageProducer, context: HandlerContext,
                 request: Message) -> None:
        item = self.handler
        counters = self.worker._counters[item.name]
        lock = self.worker._lock
        replied = undeliverable = False
        try:
            reply = _to_message(session, item.function(request, context))
            if reply is not None:
                reply_to = request.jms_reply_to
                if reply_to is None:
                    self.logger.debug("request %s has no reply-to; its reply is dropped", request.jms_message_id)
                else:
                    reply.jms_correlation_id = reply_correlation_id(request)
                    _set_type(reply)
                    try:
                        producer.send(reply_to, reply)
                        replied = True
                    except InvalidDestinationError as exc:
                        undeliverable = True
                        self.logger.warning(
                            "handler %s: the reply to request %s cannot be sent (%s); committing the request "
                            "without it", item.name, request.jms_message_id, exc,
                        )
            session.commit()
        except Exception as exc:
            self.logger.warning(
                "handler %s failed on message %s (delivery %s): %s: %s; rolling back",
                item.name, request.jms_message_id, request.get_object_property("JMSXDeliveryCount"),
                type(exc).__name__, exc, exc_info=True,
            )
            try:
                session.rollback()
            except Exception:
                self.logger.exception("handler %s: rolling back failed", item.name)
            with lock:
                counters.failed += 1
            return
        with lock:
            counters.handled += 1
            counters.replied += replied
            counters.undeliverable += undeliverable


class Worker:
    """Runs handlers against a broker.

    ``handlers``: a :class:`HandlerRegistry` (e.g. the module's
    :data:`registry`) or an iterable of :class:`Handler`; taken when the
    worker is made. ``poll_interval`` (s) bounds how long :meth:`stop` waits
    for an idle consumer to notice. Also a context manager (start / stop).
    """

    def __init__(self, broker: Broker, handlers: HandlerRegistry | Iterable[Handler], *,
                 poll_interval: float = 0.1) -> None:
        items = list(handlers)
        names: set[str] = set()
        for item in items:
            if not isinstance(item, Handler):
                raise TypeError(f"expected Handler objects (from @handler), got {item!r}")
            if item.name in names:
                raise ValueError(f"two handlers are named {item.name!r}")
            names.add(item.name)
        if poll_interval <= 0:
            raise ValueError("poll_interval must be positive")
        self.broker = broker
        self.handlers: tuple[Handler, ...] = tuple(items)
        self.poll_interval = poll_interval
        self._lock = threading.Lock()
        self._counters = {item.name: _Counters() for item in items}
        self._stopping = threading.Event()
        self._runners: list[_Runner] = []
        self._state_lock = threading.Lock()

    def __enter__(self) -> "Worker":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<Worker {[h.name for h in self.handlers]} running={self.running}>"

    @property
    def running(self) -> bool:
        return bool(self._runners)

    def start(self) -> None:
        """Open a connection per handler and start consuming. Raises (and
        opens nothing) if a consumer cannot be made, e.g. for a bad selector."""
        with self._state_lock:
            if self._runners:
                raise RuntimeError("the worker is already running")
            self._stopping.clear()
            runners = [_Runner(self, item) for item in self.handlers]
            try:
                for runner in runners:
                    runner.open()
            except BaseException:
                for runner in runners:
                    runner.close()
                raise
            for runner in runners:
                runner.start()
            self._runners = runners
            log.info("worker started: %s", ", ".join(repr(h) for h in self.handlers) or "no handlers")

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop consuming: let messages in progress finish and commit (up to
        ``timeout`` seconds in all), then close the connections. A message
        still in progress after the timeout is rolled back by the close and
        redelivered later. Returns False in that case, else True."""
        with self._state_lock:
            runners, self._runners = self._runners, []
            if not runners:
                return True
            self._stopping.set()
            deadline = time.monotonic() + timeout
            clean = True
            for runner in runners:
                for thread in runner.threads:
                    thread.join(max(0.0, deadline - time.monotonic()))
                    if thread.is_alive():
                        clean = False
            if not clean:
                log.warning("worker stop: handlers still busy after %.1f s; closing their connections "
                            "(their messages will be redelivered)", timeout)
            for runner in runners:
                runner.close()
            return clean

    def stats(self) -> dict[str, HandlerStats]:
        """A snapshot of every handler's counters, by handler name."""
        with self._lock:
            return {name: counters.snapshot() for name, counters in self._counters.items()}
