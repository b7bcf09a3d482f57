"""The worker runtime: consumers on the broker run each handler, and commit its reply, its sends and the
acknowledgement in one transaction, so that a message is handled exactly once."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from broker_core import (
    Broker,
    Connection,
    IllegalStateError,
    InvalidDestinationError,
    JMSError,
    Message,
    MessageConsumer,
    MessageProducer,
    Session,
    reply_correlation_id,
)
from gateway.handlers.api import (
    _R,
    AnyHandler,
    AsyncHandlerContext,
    BusinessError,
    Handler,
    HandlerContext,
    HandlerRegistry,
    Reject,
    _Context,
    _error_reply,
    _set_type,
    _to_message,
)

log = logging.getLogger(__name__)


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
        return HandlerStats(
            self.handled, self.replied, self.failed, self.undeliverable, self.rejected, self.business_errors
        )


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
        self.logger = logging.getLogger(f"gateway.handlers.{item.name}")

    # ------------------------------------------------------------ shared steps

    @staticmethod
    def _outcome_of(result: Any) -> Any:
        """A returned outcome marker acts as if raised."""
        if isinstance(result, (Reject, BusinessError)):
            raise result
        return result

    def _stage_reply(
        self, producer: MessageProducer, request: Message, reply: Message | None, attempt: Attempt
    ) -> None:
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
                self.handler.name,
                request.jms_message_id,
                exc,
            )

    def _staged(
        self, session: Session, producer: MessageProducer, request: Message, result: Any, attempt: Attempt
    ) -> None:
        """Stage the reply (or the error reply) of a result; raises Reject."""
        try:
            reply = _to_message(session, self._outcome_of(result))
        except BusinessError as error:
            attempt.business_error = error
            self.logger.info(
                "handler %s answered request %s with business error %s: %s",
                self.handler.name,
                request.jms_message_id,
                error.code,
                error.detail,
            )
            reply = _error_reply(session, error)
        self._stage_reply(producer, request, reply, attempt)

    def _log_failure(self, request: Message, exc: BaseException) -> None:
        self.logger.warning(
            "handler %s failed on message %s (delivery %s): %s: %s; rolling back",
            self.handler.name,
            request.jms_message_id,
            request.get_object_property("JMSXDeliveryCount"),
            type(exc).__name__,
            exc,
            exc_info=True,
        )

    def _log_reject(self, request: Message, reason: str) -> None:
        self.logger.warning(
            "handler %s rejected message %s (delivery %s): %s; dead-lettered",
            self.handler.name,
            request.jms_message_id,
            request.get_object_property("JMSXDeliveryCount"),
            reason,
        )

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

    def process(self, session: Session, producer: MessageProducer, context: _Context, request: Message) -> Attempt:
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
            session.rollback(
                None if error is None else f"handler {self.handler.name} raised {type(error).__name__}: {error}"
            )
        except Exception:
            self.logger.exception("handler %s: rolling back failed", self.handler.name)

    # ------------------------------------------------------------ async def

    async def process_async(
        self, session: Session, producer: MessageProducer, context: _Context, request: Message
    ) -> Attempt:
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
            reason = reject.reason
            return self._count(await _off_loop(session, lambda: self._reject(session, request, reason)))
        except Exception as exc:
            failure = exc
            self._log_failure(request, failure)
            await _off_loop(session, lambda: self._rollback(session, failure))
            return self._count(Attempt(FAILED, error=failure))
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

    def __init__(self, worker: Worker, item: AnyHandler) -> None:
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
            consumer = session.create_consumer(
                self.handler.destination, self.handler.selector, prefetch=self.handler.prefetch
            )
            producer = session.create_producer(None)
            context = context_type(
                self.handler.name, session, producer, broker, self.logger, partners=self.worker.partners
            )
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

    def stop(self) -> None:
        if self.connection is not None:
            try:
                self.connection.close()
            except Exception:
                log.exception("closing the connection of handler %s failed", self.handler.name)

    # ------------------------------------------------------------ threads

    def _loop(self, session: Session, consumer: MessageConsumer, producer: MessageProducer, context: _Context) -> None:
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

    async def _loop_async(
        self, session: Session, consumer: MessageConsumer, producer: MessageProducer, context: _Context
    ) -> None:
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

    def __init__(
        self,
        broker: Broker,
        handlers: HandlerRegistry | Iterable[AnyHandler],
        *,
        poll_interval: float = 0.1,
        partners: Any = None,
    ) -> None:
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

    def __enter__(self) -> Worker:
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
                    runner.stop()
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
                log.warning(
                    "worker stop: handlers still busy after %.1f s; closing their connections "
                    "(their messages will be redelivered)",
                    timeout,
                )
                for runner in runners:
                    runner.cancel()
            for runner in runners:
                runner.stop()
            if self._loop is not None:
                self._loop.stop()
                self._loop = None
            return clean

    def stats(self) -> dict[str, HandlerStats]:
        """A snapshot of every handler's counters, by handler name."""
        with self._lock:
            return {name: counters.snapshot() for name, counters in self._counters.items()}
