"""Message handlers: consume documents from the broker and reply, exactly once.

A backend developer writes ``fn(message, context)``, plain or ``async def``, and declares with
:func:`handler` where its messages come from; a :class:`Worker` runs the handlers of a registry
(docs/handlers.md and docs/backend-guide.md are the guides). What the worker guarantees:

* Each handler gets its own connection and ``concurrency`` transacted sessions: a thread each for a plain
  function, a task each on the worker's event loop for an ``async def``.
* The request, the reply and whatever the handler sends through ``context`` commit in one transaction: a
  crash or an exception before the commit sends nothing and redelivers the request, which the broker
  dead-letters after its ``max_deliveries``.
* :class:`Reject` (raised or returned) dead-letters a request that can never be processed at once, without
  redelivery. :class:`BusinessError` answers an error reply (``B2BError``, ``B2BErrorCode``, an optional
  body: the gateway answers the partner ``502 backend-error``) and commits.
* The reply goes to ``jms_reply_to`` with ``reply_correlation_id(request)`` and, unless the handler set one,
  ``jms_type`` = its root element's local name. Without ``jms_reply_to``, or when the requester's temporary
  queue is gone, the request commits without the reply, so that it is not redelivered for ever.

:mod:`gateway.testing` runs a handler with this same code in a test's own thread or event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any, Generic, ParamSpec, Protocol, TypedDict, TypeVar, Union, Unpack, cast, overload

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
    "ERROR_CODE_PROPERTY",
    "ERROR_PROPERTY",
    "AsyncHandlerContext",
    "BusinessError",
    "Handler",
    "HandlerContext",
    "HandlerRegistry",
    "HandlerStats",
    "Reject",
    "Reply",
    "SendOptions",
    "Worker",
    "handler",
    "registry",
]

log = logging.getLogger(__name__)

#: The property of an error reply that says why (what the gateway reads: gateway.exchange.request_reply.ERROR_PROPERTY).
ERROR_PROPERTY = "B2BError"
#: The property of an error reply that holds a :class:`BusinessError`'s code alone.
ERROR_CODE_PROPERTY = "B2BErrorCode"
#: Longest code and detail of a BusinessError, and reason of a Reject (they travel as properties).
MAX_CODE = 100
MAX_TEXT = 1000


# --------------------------------------------------------------------------- outcomes


class Reject(Exception):
    """Raised (or returned) by a handler for a request that can never be
    processed: the worker dead-letters it at once, with ``JMS_DLQ_Reason`` =
    ``reason``, instead of redelivering it ``max_deliveries`` times; nothing
    the handler sent for it is committed."""

    def __init__(self, reason: str) -> None:
        if not isinstance(reason, str) or not reason.strip():
            raise ValueError("Reject needs a reason: a non-empty string saying why the message is dead-lettered")
        self.reason = reason[:MAX_TEXT]
        super().__init__(self.reason)


class BusinessError(Exception):
    """Raised (or returned) by a handler whose answer to the request is an
    error (an order for an unknown customer): the requester gets an error
    reply and the transaction commits. ``code``: a short token
    (``unknown-customer``); ``detail``: a sentence for a person; ``reply``: an
    optional body (XML text, an lxml element or a Message) sent with it."""

    def __init__(self, code: str, detail: str,
                 reply: str | etree._Element | etree._ElementTree | Message | None = None) -> None:
        if not isinstance(code, str) or not code.strip() or len(code) > MAX_CODE:
            raise ValueError(f"BusinessError needs a code: a non-empty string of at most {MAX_CODE} characters")
        if not isinstance(detail, str):
            raise ValueError("BusinessError's detail must be a string")
        self.code = code.strip()
        self.detail = detail[:MAX_TEXT]
        self.reply = reply
        super().__init__(f"{self.code}: {self.detail}")


#: What a handler may return (or its coroutine return): a reply (XML text, an lxml element or
#: tree, a Message), ``None`` for no reply, or an outcome marker (``Reject``, ``BusinessError``).
Reply = Union[str, etree._Element, etree._ElementTree, Message, Reject, BusinessError, None]

_P = ParamSpec("_P")
_R = TypeVar("_R")
_ReplyT = TypeVar("_ReplyT", bound=Reply)

#: What a handler function looks like: ``fn(message, context) -> reply`` (or a coroutine function).
HandlerFunction = Callable[..., Union[Reply, Awaitable[Reply]]]


class SendOptions(TypedDict, total=False):
    """The options of ``context.send(...)``, as a producer's ``send`` takes them."""

    delivery_mode: int | None
    priority: int | None
    time_to_live: int | None


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


def _is_async(fn: Any) -> bool:
    """Whether calling ``fn`` gives a coroutine (an ``async def``, also behind
    ``functools.partial`` or as an object's ``async def __call__``)."""
    if inspect.iscoroutinefunction(fn):
        return True
    inner = getattr(fn, "func", None)  # functools.partial
    if inner is not None and inspect.iscoroutinefunction(inner):
        return True
    call = getattr(type(fn), "__call__", None)
    return call is not None and not inspect.isfunction(fn) and inspect.iscoroutinefunction(call)


@dataclasses.dataclass(frozen=True, eq=False)
class Handler(Generic[_P, _R]):
    """A handler function and where it consumes from.

    Calling it calls the function (so a decorated function stays usable
    directly, e.g. in unit tests). ``name`` identifies it in the registry, in
    :meth:`Worker.stats`, in thread names and in log lines. ``is_async``: the
    function is a coroutine function (run on the worker's event loop).
    """

    function: Callable[_P, _R]
    destination: Destination
    selector: str | None = None
    concurrency: int = 1
    name: str = ""
    #: messages each session's consumer claims ahead of the one it works on (see :func:`handler`)
    prefetch: int = 1
    is_async: bool = dataclasses.field(default=False, init=False)

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
        object.__setattr__(self, "is_async", _is_async(self.function))
        if not self.name:
            fn = self.function
            default = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
            object.__setattr__(self, "name", default)

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        selector = f" selector={self.selector!r}" if self.selector else ""
        kind = " async" if self.is_async else ""
        return f"<Handler{kind} {self.name} on {self.destination}{selector} concurrency={self.concurrency}>"


AnyHandler = Handler[..., Any]


class HandlerRegistry:
    """Handlers by name, in registration order. Registering a name again
    replaces the earlier handler (so reloading a module does not duplicate it)."""

    def __init__(self) -> None:
        self._handlers: dict[str, AnyHandler] = {}
        self._lock = threading.Lock()

    def add(self, item: AnyHandler) -> AnyHandler:
        if not isinstance(item, Handler):
            raise TypeError(f"expected a Handler, got {item!r}")
        with self._lock:
            if item.name in self._handlers:
                log.debug("handler %s registered again; replacing the earlier one", item.name)
            self._handlers[item.name] = item
        return item

    def remove(self, name: str) -> AnyHandler | None:
        with self._lock:
            return self._handlers.pop(name, None)

    def get(self, name: str) -> AnyHandler | None:
        return self._handlers.get(name)

    def clear(self) -> None:
        with self._lock:
            self._handlers.clear()

    def __iter__(self) -> Iterator[AnyHandler]:
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


class HandlerDecorator(Protocol):
    """What :func:`handler` returns: it takes ``fn(message, context)``, a plain
    function given a :class:`HandlerContext` or an ``async def`` given an
    :class:`AsyncHandlerContext`, that returns a :data:`Reply`; a type checker
    rejects any other signature."""

    @overload
    def __call__(
        self, fn: Callable[[Message, AsyncHandlerContext], Awaitable[_ReplyT]], /
    ) -> Handler[[Message, AsyncHandlerContext], Awaitable[_ReplyT]]: ...

    @overload
    def __call__(
        self, fn: Callable[[Message, HandlerContext], _ReplyT], /
    ) -> Handler[[Message, HandlerContext], _ReplyT]: ...


def handler(
    destination: str | Destination,
    selector: str | None = None,
    *,
    concurrency: int = 1,
    name: str | None = None,
    prefetch: int = 1,
    registry: HandlerRegistry | None = _DEFAULT_REGISTRY,
) -> HandlerDecorator:
    """Declare ``fn(message, context)`` (plain or ``async def``) as the handler of ``destination``.

    ``destination``: a queue name (``"orders.inbound"``), ``"queue://..."`` /
    ``"topic://..."``, or a :class:`~broker_core.Queue` / :class:`~broker_core.Topic`.
    ``selector``: a message selector (``"JMSType = 'Order'"``).
    ``concurrency``: how many sessions consume in parallel, threads for a plain
    function and tasks for an ``async def`` (1 for a topic). ``name``: defaults
    to ``module.qualname`` of the function.
    ``prefetch``: how many messages each session's consumer claims ahead of
    the one it works on; 1 (the default) shares a backlog among the sessions
    and processes as it builds up (with more, one session could hold dozens
    of requests while the others idle); raise it for cheap handlers to save
    claim transactions.
    ``registry``: where to register (the module's :data:`registry` by default;
    ``None``: nowhere). Returns the :class:`Handler`, which is callable like
    the function.
    """
    dest = _as_destination(destination)

    def decorate(fn: Any) -> AnyHandler:
        item: AnyHandler = Handler(fn, dest, selector or None, concurrency, name or "", prefetch)
        target = globals()["registry"] if registry is _DEFAULT_REGISTRY else registry
        if target is not None:
            target.add(item)
        return item

    return cast(HandlerDecorator, decorate)


# --------------------------------------------------------------------------- what a handler gets


@dataclasses.dataclass(frozen=True)
class _Context:
    handler_name: str
    session: Session
    producer: MessageProducer
    broker: Broker
    logger: logging.Logger
    #: what was sent in the current attempt, kept only when a test harness asks (else None)
    sent: list[tuple[Destination, Message]] | None = dataclasses.field(default=None, repr=False)
    #: the partners (a PartnerRegistry) whose endpoints ``deliver`` may name; None: deliveries are refused
    partners: Any = dataclasses.field(default=None, repr=False)
    #: the ledger rows of this attempt's deliveries, written inside its commit
    pending: list[Callable[[Any], Any]] = dataclasses.field(default_factory=list, repr=False)

    def _deliver(self, partner: str, document: bytes | str | etree._Element, endpoint: str | None,
                 content_type: str) -> str:
        from gateway.delivery.hooks import endpoint_of, stage_delivery

        target = endpoint_of(self.partners, partner, endpoint)
        if isinstance(document, etree._Element):
            document = etree.tostring(document, xml_declaration=True, encoding="UTF-8")
        elif isinstance(document, str):
            document = document.encode("utf-8")
        insert = stage_delivery(self.producer, target, bytes(document), source=f"handler:{self.handler_name}",
                                content_type=content_type)
        self.pending.append(insert)
        return insert.message_id  # type: ignore[attr-defined]

    def _send(self, destination: str | Destination, message: Message | str | etree._Element,
              options: SendOptions) -> Message:
        dest = _as_destination(destination) if isinstance(destination, str) else destination
        msg = _to_message(self.session, message)
        if msg is None:
            raise TypeError("send() needs a message")
        _set_type(msg)
        self.producer.send(dest, msg, **options)
        if self.sent is not None:
            self.sent.append((dest, msg))
        return msg


@dataclasses.dataclass(frozen=True)
class HandlerContext(_Context):
    """What a plain handler function gets besides the message.

    ``session`` is the transacted session the request was received on: what
    is sent on it (``context.send(...)`` or a producer of its own) commits with
    the request and the reply, or not at all. Do not commit or roll it back:
    the worker does. ``logger`` is ``gateway.handlers.<handler name>``.
    """

    def send(self, destination: str | Destination, message: Message | str | etree._Element,
             **options: Unpack[SendOptions]) -> Message:
        """Send ``message`` (a Message, XML text or an lxml element) to
        ``destination`` (a queue name or a Destination) in the current
        transaction. ``options``: ``delivery_mode``, ``priority``,
        ``time_to_live``. Returns the message sent."""
        return self._send(destination, message, options)

    def deliver(self, partner: str, document: bytes | str | etree._Element, *, endpoint: str | None = None,
                content_type: str = "application/xml") -> str:
        """Deliver ``document`` to ``partner``'s endpoint (its only one unless ``endpoint`` names one), in
        the current transaction: it is queued if and only if the request's processing commits. Returns
        the delivery's id (its ``webhook-id``). Raises UnknownEndpointError for an endpoint not configured."""
        return self._deliver(partner, document, endpoint, content_type)


@dataclasses.dataclass(frozen=True)
class AsyncHandlerContext(_Context):
    """What an ``async def`` handler gets besides the message: as
    :class:`HandlerContext`, with ``await context.send(...)``. The session
    belongs to the handler's task on the worker's event loop; do not commit
    or roll it back."""

    async def send(self, destination: str | Destination, message: Message | str | etree._Element,
                   **options: Unpack[SendOptions]) -> Message:
        """Send ``message`` (a Message, XML text or an lxml element) to
        ``destination`` (a queue name or a Destination) in the current
        transaction (staged: it is stored at the commit, with the request).
        ``options``: ``delivery_mode``, ``priority``, ``time_to_live``.
        Returns the message sent."""
        return self._send(destination, message, options)

    async def deliver(self, partner: str, document: bytes | str | etree._Element, *, endpoint: str | None = None,
                      content_type: str = "application/xml") -> str:
        """As :meth:`HandlerContext.deliver` (staged: stored at the commit, with the request)."""
        return self._deliver(partner, document, endpoint, content_type)


def _to_message(session: Session, result: Any) -> Message | None:
    """The reply a handler returned, as a Message (``None`` for no reply)."""
    if result is None or isinstance(result, Message):
        return result
    if isinstance(result, str):
        return session.create_xml_message(result)
    if isinstance(result, etree._ElementTree):
        result = result.getroot()
    if isinstance(result, etree._Element):
        message = session.create_xml_message(etree.tostring(result, encoding="unicode"))
        message.jms_type = etree.QName(result).localname  # what _set_type would parse the text again for
        return message
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # not awaited: say so here rather than in a RuntimeWarning
        raise TypeError(
            "the handler returned an awaitable: declare it `async def` so that the worker awaits it "
            "(a plain function that returns a coroutine is not awaited)"
        )
    raise TypeError(
        "a handler returns XML text, an lxml element, a Message, None, Reject or BusinessError; "
        f"got {type(result).__name__}"
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


def _error_reply(session: Session, error: BusinessError) -> Message:
    """The reply that tells the requester about a BusinessError."""
    reply = _to_message(session, error.reply) if error.reply is not None else None
    if reply is None:
        reply = session.create_text_message("")
    reply.set_string_property(ERROR_PROPERTY, f"{error.code}: {error.detail}")
    reply.set_string_property(ERROR_CODE_PROPERTY, error.code)
    return reply


# --------------------------------------------------------------------------- statistics


@dataclasses.dataclass(frozen=True)
class HandlerStats:
    """Counters of one handler since its worker was made.

    ``handled``: requests whose transaction committed (business errors
    included); ``replied``: replies committed with them; ``failed``: attempts
    rolled back (the handler or the commit raised; the request is redelivered
    or dead-lettered); ``undeliverable``: replies dropped because their
    destination no longer existed; ``rejected``: requests dead-lettered by
    :class:`Reject`; ``business_errors``: error replies of
    :class:`BusinessError` (counted in ``handled`` and ``replied`` too).
    """

    handled: int = 0
    replied: int = 0
    failed: int = 0
    undeliverable: int = 0
    rejected: int = 0
    business_errors: int = 0


class _Counters:
    __slots__ = ("handled", "replied", "failed", "undeliverable", "rejected", "business_errors")

    def __init__(self) -> None:
        self.handled = self.replied = self.failed = self.undeliverable = 0
        self.rejected = self.business_errors = 0

    def snapshot(self) -> HandlerStats:
        return HandlerStats(self.handled, self.replied, self.failed, self.undeliverable, self.rejected,
                            self.business_errors)


# --------------------------------------------------------------------------- one attempt


#: What became of one attempt at a request (see :class:`Attempt`).
COMMITTED, REJECTED, FAILED = "committed", "rejected", "failed"


@dataclasses.dataclass
class Attempt:
    """One attempt at a request: ``outcome`` is ``committed`` (the request,
    the reply and what was sent for it are stored), ``rejected`` (the request
    went to the dead-letter queue with ``reason``) or ``failed`` (rolled
    back: ``error`` is why; the broker redelivers or dead-letters it).
    ``business_error``: the BusinessError answered, if any."""

    outcome: str
    replied: bool = False
    undeliverable: bool = False
    reason: str | None = None
    error: BaseException | None = None
    business_error: BusinessError | None = None


class _Processor:
    """Runs one handler on one request and ends its transaction, the same way
    for the worker and for :mod:`gateway.testing`."""

    def __init__(self, item: AnyHandler, counters: _Counters, lock: threading.Lock) -> None:
        self.handler = item
        self.counters = counters
        self.lock = lock
        self.logger = logging.getLogger(f"{__name__}.{item.name}")

    # ------------------------------------------------------------ shared steps

    @staticmethod
    def _outcome_of(result: Any) -> Any:
        """A returned outcome marker acts as if raised."""
        if isinstance(result, (Reject, BusinessError)):
            raise result
        return result

    def _stage_reply(self, producer: MessageProducer, request: Message, reply: Message | None,
                     attempt: Attempt) -> None:
        if reply is None:
            return
        reply_to = request.jms_reply_to
        if reply_to is None:
            self.logger.debug("request %s has no reply-to; its reply is dropped", request.jms_message_id)
            return
        reply.jms_correlation_id = reply_correlation_id(request)
        _set_type(reply)
        try:
            producer.send(reply_to, reply)
            attempt.replied = True
        except InvalidDestinationError as exc:
            attempt.undeliverable = True
            self.logger.warning(
                "handler %s: the reply to request %s cannot be sent (%s); committing the request without it",
                self.handler.name, request.jms_message_id, exc,
            )

    def _staged(self, session: Session, producer: MessageProducer, request: Message, result: Any,
                attempt: Attempt) -> None:
        """Stage the reply (or the error reply) of a result; raises Reject."""
        try:
            reply = _to_message(session, self._outcome_of(result))
        except BusinessError as error:
            attempt.business_error = error
            self.logger.info("handler %s answered request %s with business error %s: %s", self.handler.name,
                             request.jms_message_id, error.code, error.detail)
            reply = _error_reply(session, error)
        self._stage_reply(producer, request, reply, attempt)

    def _log_failure(self, request: Message, exc: BaseException) -> None:
        self.logger.warning(
            "handler %s failed on message %s (delivery %s): %s: %s; rolling back",
            self.handler.name, request.jms_message_id, request.get_object_property("JMSXDeliveryCount"),
            type(exc).__name__, exc, exc_info=True,
        )

    def _log_reject(self, request: Message, reason: str) -> None:
        self.logger.warning("handler %s rejected message %s (delivery %s): %s; dead-lettered",
                            self.handler.name, request.jms_message_id,
                            request.get_object_property("JMSXDeliveryCount"), reason)

    def _count(self, attempt: Attempt) -> Attempt:
        counters = self.counters
        with self.lock:
            if attempt.outcome == COMMITTED:
                counters.handled += 1
                counters.replied += attempt.replied
                counters.undeliverable += attempt.undeliverable
                counters.business_errors += attempt.business_error is not None
            elif attempt.outcome == REJECTED:
                counters.rejected += 1
            else:
                counters.failed += 1
        return attempt

    # ------------------------------------------------------------ plain functions

    def process(self, session: Session, producer: MessageProducer, context: _Context,
                request: Message) -> Attempt:
        attempt = Attempt(COMMITTED)
        context.pending.clear()
        try:
            try:
                result = self.handler.function(request, context)
            except BusinessError as error:
                result = error
            self._staged(session, producer, request, result, attempt)
            session.commit(in_transaction=context.pending)
        except Reject as reject:
            return self._count(self._reject(session, request, reject.reason))
        except Exception as exc:
            self._log_failure(request, exc)
            self._rollback(session, exc)
            return self._count(Attempt(FAILED, error=exc))
        return self._count(attempt)

    def _reject(self, session: Session, request: Message, reason: str) -> Attempt:
        self._log_reject(request, reason)
        try:
            session.dead_letter(request, reason)
        except Exception as exc:  # the store failed: the request stays unacknowledged, and is redelivered
            self._log_failure(request, exc)
            self._rollback(session, exc)
            return Attempt(FAILED, error=exc)
        self._rollback(session)  # drops what the handler sent; the request is not held any more
        return Attempt(REJECTED, reason=reason)

    def _rollback(self, session: Session, error: BaseException | None = None) -> None:
        try:
            session.rollback(None if error is None else f"handler {self.handler.name} raised "
                                                         f"{type(error).__name__}: {error}")
        except Exception:
            self.logger.exception("handler %s: rolling back failed", self.handler.name)

    # ------------------------------------------------------------ async def

    async def process_async(self, session: Session, producer: MessageProducer, context: _Context,
                            request: Message) -> Attempt:
        attempt = Attempt(COMMITTED)
        context.pending.clear()
        try:
            try:
                result = await self.handler.function(request, context)
            except BusinessError as error:
                result = error
            self._staged(session, producer, request, result, attempt)
            await session.commit_async(in_transaction=context.pending)
        except Reject as reject:
            return self._count(await _off_loop(session, lambda: self._reject(session, request, reject.reason)))
        except Exception as exc:
            self._log_failure(request, exc)
            await _off_loop(session, lambda: self._rollback(session, exc))
            return self._count(Attempt(FAILED, error=exc))
        except asyncio.CancelledError:  # the worker stopped and gave up waiting: redelivered later
            await _off_loop(session, lambda: self._rollback(session))
            self._count(Attempt(FAILED, error=asyncio.CancelledError()))
            raise
        return self._count(attempt)


async def _off_loop(session: Session, fn: Callable[[], _R]) -> _R:
    """``fn()``, which may write to the store: inline on the memory store, in
    a thread on the SQL store (a write must not stall the event loop)."""
    if session.connection.broker.engine is not None:
        return await asyncio.to_thread(fn)
    return fn()


# --------------------------------------------------------------------------- the worker


class _Runner:
    """One handler's connection and sessions; threads for a plain function,
    tasks on the worker's loop for an ``async def``."""

    def __init__(self, worker: "Worker", item: AnyHandler) -> None:
        self.worker = worker
        self.handler = item
        self.processor = _Processor(item, worker._counters[item.name], worker._lock)
        self.logger = self.processor.logger
        self.connection: Connection | None = None
        self.loops: list[tuple[Session, MessageConsumer, MessageProducer, _Context]] = []
        self.threads: list[threading.Thread] = []
        self.tasks: list[concurrent.futures.Future[None]] = []
        # held by the one session that waits on the broker for the next message (see _receive)
        self.waiting = threading.Lock()
        self.waiting_async = asyncio.Lock()

    def open(self) -> None:
        broker = self.worker.broker
        self.connection = broker.connect()
        context_type = AsyncHandlerContext if self.handler.is_async else HandlerContext
        for _ in range(self.handler.concurrency):
            session = self.connection.create_session(transacted=True)
            consumer = session.create_consumer(self.handler.destination, self.handler.selector,
                                               prefetch=self.handler.prefetch)
            producer = session.create_producer(None)
            context = context_type(self.handler.name, session, producer, broker, self.logger,
                                   partners=self.worker.partners)
            self.loops.append((session, consumer, producer, context))
        if not self.handler.is_async:
            self.threads = [
                threading.Thread(target=self._loop, args=loop, name=f"handler-{self.handler.name}-{n}", daemon=True)
                for n, loop in enumerate(self.loops)
            ]

    def start(self, loop: asyncio.AbstractEventLoop | None) -> None:
        assert self.connection is not None
        self.connection.start()
        if self.handler.is_async:
            assert loop is not None
            self.tasks = [asyncio.run_coroutine_threadsafe(self._loop_async(*args), loop) for args in self.loops]
        for thread in self.threads:
            thread.start()

    def join(self, deadline: float) -> bool:
        """Wait until the sessions are done (or the deadline passes); True if they are."""
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self.tasks:
            concurrent.futures.wait(self.tasks, max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self.threads) and all(t.done() for t in self.tasks)

    def cancel(self) -> None:
        """Cancel the tasks still running (a stuck ``async def``); threads cannot be."""
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            concurrent.futures.wait(self.tasks, 1.0)

    def close(self) -> None:
        if self.connection is not None:
            try:
                self.connection.close()
            except Exception:
                log.exception("closing the connection of handler %s failed", self.handler.name)

    # ------------------------------------------------------------ threads

    def _loop(self, session: Session, consumer: MessageConsumer, producer: MessageProducer,
              context: _Context) -> None:
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
                self.processor.process(session, producer, context, message)

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

    # ------------------------------------------------------------ tasks

    async def _loop_async(self, session: Session, consumer: MessageConsumer, producer: MessageProducer,
                          context: _Context) -> None:
        stopping = self.worker._stopping
        poll = self.worker.poll_interval
        backoff = poll
        while not stopping.is_set():
            try:
                message = await self._receive_async(consumer, poll)
            except IllegalStateError:
                return
            except JMSError:
                if stopping.is_set():
                    return
                log.exception("handler %s: receiving failed; retrying in %.1f s", self.handler.name, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            backoff = poll
            if message is not None:
                await self.processor.process_async(session, producer, context, message)

    async def _receive_async(self, consumer: MessageConsumer, poll: float) -> Message | None:
        """As :meth:`_receive`, for the tasks of an ``async def`` handler."""
        if self.handler.concurrency == 1:
            return await consumer.receive_async(poll)
        message = await consumer.receive_async(0)
        if message is not None:
            return message
        try:
            async with asyncio.timeout(poll):  # unlike wait_for, no task per turn
                await self.waiting_async.acquire()
        except TimeoutError:
            return None
        try:
            return await consumer.receive_async(poll)
        finally:
            self.waiting_async.release()


class _Loop:
    """The worker's event loop for ``async def`` handlers, in a thread of its own."""

    def __init__(self) -> None:
        try:  # uvloop when installed (a dependency where it builds), as uvicorn does for the gateway
            import uvloop

            self.loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:
            self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="handler-loop", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            try:
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
                self.loop.run_until_complete(self.loop.shutdown_default_executor())  # the to_thread threads
            finally:
                self.loop.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class Worker:
    """Runs handlers against a broker.

    ``handlers``: a :class:`HandlerRegistry` (e.g. the module's
    :data:`registry`) or an iterable of :class:`Handler`; taken when the
    worker is made. ``poll_interval`` (s) bounds how long :meth:`stop` waits
    for an idle consumer to notice. ``async def`` handlers run on one event
    loop the worker starts in a thread of its own. Also a context manager
    (start / stop).
    """

    def __init__(self, broker: Broker, handlers: HandlerRegistry | Iterable[AnyHandler], *,
                 poll_interval: float = 0.1, partners: Any = None) -> None:
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
        self.handlers: tuple[AnyHandler, ...] = tuple(items)
        self.poll_interval = poll_interval
        #: the partners whose endpoints ``context.deliver`` may name (a PartnerRegistry)
        self.partners = partners
        self._lock = threading.Lock()
        self._counters = {item.name: _Counters() for item in items}
        self._stopping = threading.Event()
        self._runners: list[_Runner] = []
        self._loop: _Loop | None = None
        self._state_lock = threading.Lock()

    def __enter__(self) -> "Worker":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
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
            if any(item.is_async for item in self.handlers):
                self._loop = _Loop()
            for runner in runners:
                runner.start(self._loop.loop if self._loop is not None else None)
            self._runners = runners
            log.info("worker started: %s", ", ".join(repr(h) for h in self.handlers) or "no handlers")

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop consuming: let messages in progress finish and commit (up to
        ``timeout`` seconds in all), then close the connections. A message
        still in progress after the timeout is rolled back (an ``async def``
        is cancelled first) and redelivered later. Returns False in that
        case, else True."""
        with self._state_lock:
            runners, self._runners = self._runners, []
            if not runners:
                return True
            self._stopping.set()
            deadline = time.monotonic() + timeout
            clean = all([runner.join(deadline) for runner in runners])
            if not clean:
                log.warning("worker stop: handlers still busy after %.1f s; closing their connections "
                            "(their messages will be redelivered)", timeout)
                for runner in runners:
                    runner.cancel()
            for runner in runners:
                runner.close()
            if self._loop is not None:
                self._loop.stop()
                self._loop = None
            return clean

    def stats(self) -> dict[str, HandlerStats]:
        """A snapshot of every handler's counters, by handler name."""
        with self._lock:
            return {name: counters.snapshot() for name, counters in self._counters.items()}
