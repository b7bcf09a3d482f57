"""Unit-testing handlers: run one against an in-memory broker, in the test's own thread (a plain function) or
event loop (an ``async def``), with the worker's own code, and look at what became of each request::

    with HandlerHarness(respond) as harness:
        result = harness.request(order_xml)
    assert result.committed and result.reply.jms_type == "OrderResponse"

A request is sent (committed) to the handler's destination, with the harness's reply queue as
``JMSReplyTo`` and, like the gateway, ``JMSType`` = its root element's local name; then the handler takes it
and its transaction ends as the worker would end it. :class:`Result` says how: ``committed`` (with the
``reply`` and the other messages ``sent``), ``rejected`` (``reason``), ``redelivered`` (``error``; the
request waits again: :meth:`HandlerHarness.deliver` runs the next attempt) or ``dead_lettered``. Nothing
waits on a clock: each call returns once the attempt is over. docs/handlers.md shows it in use.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any, TypedDict, Unpack

from lxml import etree

from broker_core import (
    AckMode,
    Broker,
    Destination,
    Message,
    MessageConsumer,
    MessageProducer,
    Queue,
    Session,
    XMLMessage,
    reply_correlation_id,
)
from gateway.handlers.api import (
    ERROR_CODE_PROPERTY,
    AnyHandler,
    AsyncHandlerContext,
    BusinessError,
    HandlerContext,
    _Context,
)
from gateway.handlers.worker import COMMITTED, REJECTED, HandlerStats, _Counters, _Processor

__all__ = ["Document", "HandlerHarness", "HarnessError", "RequestOptions", "Result"]

#: What a request may be made of: XML text or bytes, an lxml element or tree, or a Message (sent as it is).
Document = str | bytes | etree._Element | etree._ElementTree | Message


class RequestOptions(TypedDict, total=False):
    """The options of :meth:`HandlerHarness.send` that :meth:`HandlerHarness.request` passes on."""

    reply: bool
    jms_type: str | None
    correlation_id: str | None
    properties: dict[str, bool | int | float | str] | None
    priority: int | None


class HarnessError(AssertionError):
    """Raised when a test asks the harness for something that cannot happen:
    a handler it does not run, a request no handler's consumer takes (its
    selector does not match), a plain call of an ``async def`` from inside a
    running event loop."""


@dataclasses.dataclass
class Result:
    """What became of one attempt at a request (see the module doc).

    ``request``: the message as the handler received it; ``outcome``:
    ``committed``, ``rejected``, ``redelivered`` or ``dead_lettered``;
    ``reply``: the reply committed to the requester (an error reply for a
    :class:`~gateway.handlers.BusinessError`); ``sent``: the other messages
    committed with the request, as ``(destination, message)``; ``reason``:
    why it was rejected or dead-lettered (``JMS_DLQ_Reason``); ``error``: what
    the handler (or the commit) raised; ``business_error``: the
    BusinessError answered."""

    request: Message
    outcome: str
    reply: Message | None = None
    sent: list[tuple[Destination, Message]] = dataclasses.field(default_factory=list)
    reason: str | None = None
    error: BaseException | None = None
    business_error: BusinessError | None = None

    @property
    def committed(self) -> bool:
        return self.outcome == COMMITTED

    @property
    def rejected(self) -> bool:
        return self.outcome == REJECTED

    @property
    def redelivered(self) -> bool:
        return self.outcome == "redelivered"

    @property
    def dead_lettered(self) -> bool:
        return self.outcome == "dead_lettered"

    @property
    def error_code(self) -> str | None:
        """The code of a BusinessError answered (``B2BErrorCode`` of the reply)."""
        if self.reply is not None and self.reply.property_exists(ERROR_CODE_PROPERTY):
            return self.reply.get_string_property(ERROR_CODE_PROPERTY)
        return None

    def sent_to(self, destination: str | Destination) -> list[Message]:
        """The messages committed to one destination (a queue name or a Destination)."""
        dest = Queue(destination) if isinstance(destination, str) else destination
        return [message for where, message in self.sent if where == dest]


class _Station:
    """One handler under test: its session, consumer and processor."""

    def __init__(self, harness: HandlerHarness, item: AnyHandler) -> None:
        self.handler = item
        self.counters = _Counters()
        self.processor = _Processor(item, self.counters, harness._lock)
        self.session: Session = harness._conn.create_session(transacted=True)
        self.consumer: MessageConsumer = self.session.create_consumer(item.destination, item.selector, prefetch=1)
        self.producer: MessageProducer = self.session.create_producer(None)
        context_type = AsyncHandlerContext if item.is_async else HandlerContext
        self.sent: list[tuple[Destination, Message]] = []
        self.context: _Context = context_type(
            item.name, self.session, self.producer, harness.broker, self.processor.logger, self.sent
        )


class HandlerHarness:
    """Runs ``handlers`` (from ``@handler``) on ``broker`` (by default a new
    ``memory://`` broker with ``max_deliveries``, closed with the harness).
    A context manager, plain or ``async with``."""

    def __init__(self, *handlers: AnyHandler, broker: Broker | None = None, max_deliveries: int = 10) -> None:
        if not handlers:
            raise HarnessError("give the harness at least one handler (a function decorated with @handler)")
        self._own_broker = broker is None
        self.broker = (
            broker if broker is not None else Broker.open("memory://", sweep_interval=0, max_deliveries=max_deliveries)
        )
        self._lock = threading.Lock()
        self._conn = self.broker.connect()
        self._stations: dict[str, _Station] = {}
        try:
            for item in handlers:
                if item.name in self._stations:
                    raise HarnessError(f"two handlers are named {item.name!r}")
                self._stations[item.name] = _Station(self, item)
            self._requester = self._conn.create_session(ack_mode=AckMode.AUTO)
            self._producer = self._requester.create_producer(None)
            self.reply_queue = self._conn.create_temporary_queue()
            self._replies = self._requester.create_consumer(self.reply_queue)
            self._unclaimed: dict[str | None, list[Message]] = {}
            self._conn.start()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ life

    def close(self) -> None:
        self._conn.close()
        if self._own_broker:
            self.broker.close()

    def __enter__(self) -> HandlerHarness:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> HandlerHarness:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> dict[str, HandlerStats]:
        """Every handler's counters, as :meth:`gateway.handlers.Worker.stats` gives them."""
        with self._lock:
            return {name: station.counters.snapshot() for name, station in self._stations.items()}

    # ------------------------------------------------------------ requests

    def _station(self, which: AnyHandler | str | None) -> _Station:
        if which is None:
            if len(self._stations) != 1:
                raise HarnessError(f"the harness runs {len(self._stations)} handlers: say which one (handler=...)")
            return next(iter(self._stations.values()))
        name = which if isinstance(which, str) else which.name
        station = self._stations.get(name)
        if station is None:
            raise HarnessError(f"the harness does not run a handler named {name!r} (it runs {list(self._stations)})")
        return station

    def send(
        self,
        document: Document,
        *,
        handler: AnyHandler | str | None = None,
        reply: bool = True,
        jms_type: str | None = None,
        correlation_id: str | None = None,
        properties: dict[str, bool | int | float | str] | None = None,
        priority: int | None = None,
    ) -> Message:
        """Send a request to the handler's destination (committed) and return
        it. ``document``: XML text or bytes, an lxml element or tree, or a
        Message (sent as it is). ``reply``: set ``JMSReplyTo`` to the
        harness's reply queue. ``jms_type`` defaults, for XML, to the root
        element's local name (as the gateway sets it)."""
        station = self._station(handler)
        message = self._message(document)
        if jms_type is not None:
            message.jms_type = jms_type
        elif message.jms_type is None and isinstance(message, XMLMessage):
            message.jms_type = etree.QName(message.document()).localname
        if correlation_id is not None:
            message.jms_correlation_id = correlation_id
        if reply:
            message.jms_reply_to = self.reply_queue
        for name, value in (properties or {}).items():
            message.set_object_property(name, value)
        self._producer.send(station.handler.destination, message, priority=priority)
        return message

    @staticmethod
    def _message(document: Document) -> Message:
        if isinstance(document, Message):
            return document
        if isinstance(document, bytes):
            document = document.decode("utf-8")
        if isinstance(document, etree._ElementTree):
            document = document.getroot()
        if isinstance(document, etree._Element):
            document = etree.tostring(document, encoding="unicode")
        if isinstance(document, str):
            return XMLMessage(document)
        raise TypeError(f"a request is XML text or bytes, an lxml element or a Message, not {type(document).__name__}")

    def request(
        self, document: Document, *, handler: AnyHandler | str | None = None, **options: Unpack[RequestOptions]
    ) -> Result:
        """:meth:`send` a request, then :meth:`deliver` it: the handler runs in
        this thread (an ``async def`` in an event loop of its own for the call)."""
        self.send(document, handler=handler, **options)
        return self.deliver(handler)

    async def request_async(
        self, document: Document, *, handler: AnyHandler | str | None = None, **options: Unpack[RequestOptions]
    ) -> Result:
        """:meth:`send` a request, then :meth:`deliver_async` it in the running loop."""
        self.send(document, handler=handler, **options)
        return await self.deliver_async(handler)

    def deliver(self, handler: AnyHandler | str | None = None) -> Result:
        """The handler takes the next request waiting for it (a new one, or
        one redelivered after a failed attempt) and its attempt ends."""
        station = self._station(handler)
        if station.handler.is_async:
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return asyncio.run(self.deliver_async(handler))
            raise HarnessError(
                f"{station.handler.name} is an async def: `await harness.request_async(...)` or "
                "`await harness.deliver_async()` inside a running event loop"
            )
        request = self._take(station)
        attempt = station.processor.process(station.session, station.producer, station.context, request)
        return self._result(station, request, attempt)

    async def deliver_async(self, handler: AnyHandler | str | None = None) -> Result:
        """As :meth:`deliver`, in the running event loop (a plain function runs inline)."""
        station = self._station(handler)
        request = self._take(station)
        if station.handler.is_async:
            attempt = await station.processor.process_async(station.session, station.producer, station.context, request)
        else:
            attempt = station.processor.process(station.session, station.producer, station.context, request)
        return self._result(station, request, attempt)

    def _take(self, station: _Station) -> Message:
        station.sent.clear()
        request = station.consumer.receive_no_wait()
        if request is None:
            selector = f" (its selector: {station.handler.selector!r})" if station.handler.selector else ""
            raise HarnessError(f"no request waits for handler {station.handler.name}{selector}")
        return request

    def _result(self, station: _Station, request: Message, attempt: Any) -> Result:
        if attempt.outcome == COMMITTED:
            reply = self._reply_to(request) if attempt.replied else None
            return Result(
                request,
                COMMITTED,
                reply=reply,
                sent=list(station.sent),
                error=None,
                business_error=attempt.business_error,
            )
        if attempt.outcome == REJECTED:
            return Result(request, REJECTED, reason=attempt.reason)
        message_id = request.jms_message_id or ""
        if self.broker.message_status([message_id])[message_id] == "dead_lettered":
            dlq = Queue(self.broker.policy.dead_letter_name(request.jms_destination or station.handler.destination))
            reason = next(
                (
                    m.get_string_property("JMS_DLQ_Reason")
                    for m in self.broker.browse(dlq)
                    if m.jms_message_id == message_id
                ),
                None,
            )
            return Result(request, "dead_lettered", reason=reason, error=attempt.error)
        return Result(request, "redelivered", error=attempt.error)

    def _reply_to(self, request: Message) -> Message | None:
        """The reply committed for ``request`` (replies to others are kept for them)."""
        correlation = reply_correlation_id(request)
        waiting = self._unclaimed.get(correlation)
        if waiting:
            return waiting.pop(0)
        while True:
            message = self._replies.receive_no_wait()
            if message is None:
                return None
            if message.jms_correlation_id == correlation:
                return message
            self._unclaimed.setdefault(message.jms_correlation_id, []).append(message)
