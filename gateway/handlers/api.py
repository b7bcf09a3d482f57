"""What a handler author writes against: the ``@handler`` decorator, the context a handler gets, and the
outcomes it can give (a reply, :class:`Reject`, :class:`BusinessError`)."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Generic, ParamSpec, Protocol, TypedDict, TypeVar, Unpack, cast, overload

from lxml import etree

from broker_core import (
    Broker,
    Destination,
    JMSError,
    Message,
    MessageProducer,
    Queue,
    Session,
    TextMessage,
    XMLMessage,
    parse_destination,
)

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

    def __init__(
        self, code: str, detail: str, reply: str | etree._Element | etree._ElementTree | Message | None = None
    ) -> None:
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
Reply = str | etree._Element | etree._ElementTree | Message | Reject | BusinessError | None

_P = ParamSpec("_P")
_R = TypeVar("_R")
_ReplyT = TypeVar("_ReplyT", bound=Reply)


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
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - the class's own __call__: is it async?
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

    def _deliver(
        self, partner: str, document: bytes | str | etree._Element, endpoint: str | None, content_type: str
    ) -> str:
        from gateway.delivery.hooks import endpoint_of, stage_delivery

        target = endpoint_of(self.partners, partner, endpoint, documents=True)
        if isinstance(document, etree._Element):
            document = etree.tostring(document, xml_declaration=True, encoding="UTF-8")
        elif isinstance(document, str):
            document = document.encode("utf-8")
        insert = stage_delivery(
            self.producer, target, bytes(document), source=f"handler:{self.handler_name}", content_type=content_type
        )
        self.pending.append(insert)
        return insert.message_id  # type: ignore[attr-defined]

    def _send(
        self, destination: str | Destination, message: Message | str | etree._Element, options: SendOptions
    ) -> Message:
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

    def send(
        self, destination: str | Destination, message: Message | str | etree._Element, **options: Unpack[SendOptions]
    ) -> Message:
        """Send ``message`` (a Message, XML text or an lxml element) to
        ``destination`` (a queue name or a Destination) in the current
        transaction. ``options``: ``delivery_mode``, ``priority``,
        ``time_to_live``. Returns the message sent."""
        return self._send(destination, message, options)

    def deliver(
        self,
        partner: str,
        document: bytes | str | etree._Element,
        *,
        endpoint: str | None = None,
        content_type: str = "application/xml",
    ) -> str:
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

    async def send(
        self, destination: str | Destination, message: Message | str | etree._Element, **options: Unpack[SendOptions]
    ) -> Message:
        """Send ``message`` (a Message, XML text or an lxml element) to
        ``destination`` (a queue name or a Destination) in the current
        transaction (staged: it is stored at the commit, with the request).
        ``options``: ``delivery_mode``, ``priority``, ``time_to_live``.
        Returns the message sent."""
        return self._send(destination, message, options)

    async def deliver(
        self,
        partner: str,
        document: bytes | str | etree._Element,
        *,
        endpoint: str | None = None,
        content_type: str = "application/xml",
    ) -> str:
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
