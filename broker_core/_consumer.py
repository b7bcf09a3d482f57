"""Message consumers: receive (blocking, timed, asyncio) or a listener, from
the store's reader of their box."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._commit import close_off_loop
from ._constants import AckMode
from ._destinations import Destination
from ._errors import IllegalStateError, InvalidArgumentError
from ._message import Message
from ._store import Subscription
from ._waiters import AsyncWaiter, ThreadWaiter
from .clock import now_ms

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["MessageConsumer", "MessageListener"]

MessageListener = Callable[[Message], Any]


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

    def __init__(
        self,
        session: Session,
        destination: Destination,
        box: str,
        reader: Any,
        selector: str | None,
        no_local: bool,
        subscription: Subscription | None,
        durable: bool = False,
    ) -> None:
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
        return (
            not self._closed
            and self._session._connection._started
            and (self._waiter is not None or self._listener is not None)
        )

    def __enter__(self) -> MessageConsumer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> MessageConsumer:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await close_off_loop(self._session._store, self.close)

    def __aiter__(self) -> MessageConsumer:
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
        return self._session._deliver(self, delivery)

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
        return self._session._deliver(self, delivery)

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
