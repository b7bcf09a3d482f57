"""Request-reply over a temporary queue (JMS's ``QueueRequestor`` pattern)."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ._commit import store_commit_async
from ._destinations import Destination
from ._errors import IllegalStateError, RequestTimeoutError
from ._message import Message, message_from_envelope
from ._store import queue_box
from ._waiters import AsyncWaiter, ThreadWaiter
from .clock import now_ms

__all__ = ["Requestor", "reply_correlation_id"]

log = logging.getLogger(__name__)


def reply_correlation_id(request: Message) -> str | None:
    """The correlation id a responder puts on its reply: the request's
    correlation id if it has one, else its message id (the JMS convention)."""
    return request.jms_correlation_id or request.jms_message_id


class _Slot:
    __slots__ = ("waiter", "reply")

    def __init__(self, waiter: Any) -> None:
        self.waiter = waiter
        self.reply: Message | None = None


class Requestor:
    """Sends requests to ``destination`` and waits for their replies.

    One temporary queue per requestor receives every reply; replies are
    matched to waiting requests by correlation id (the request's
    ``jms_correlation_id`` if set, else its ``jms_message_id``), so many
    threads or tasks may call :meth:`request` / :meth:`request_async` at once.
    Replies are routed in the thread that sends them, with no dispatcher
    thread in between. A reply that arrives after its request timed out goes
    to ``on_late_reply`` (logged and dropped when not given).
    """

    def __init__(
        self, session: Any, destination: Destination, on_late_reply: Callable[[Message], Any] | None = None
    ) -> None:
        session._check_open()
        if session.transacted:
            raise IllegalStateError(
                "a Requestor needs a non-transacted session: in a transaction the request would not be sent "
                "before commit(), so its reply could never arrive"
            )
        self._session = session
        self._connection = session.connection
        self._broker = session._broker
        self._producer = session.create_producer(destination)
        self.destination = destination
        self.reply_queue = self._connection.create_temporary_queue()
        self._box = queue_box(self.reply_queue)
        self._reader = self._broker.store.reader(self._box, None)
        self._pending: dict[str, collections.deque[_Slot]] = {}
        self._lock = threading.Lock()
        self._on_late_reply = on_late_reply
        self._closed = False
        self._broker._add_waker(self._box, self._route)

    def __enter__(self) -> Requestor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _route(self) -> None:
        """Hand every waiting reply to its request (runs in the sender's thread)."""
        reader = self._reader
        while not self._closed:
            delivery = reader.claim(now_ms(), True)
            if delivery is None:
                return
            env = delivery.envelope
            with self._lock:
                slots = self._pending.get(env.correlation_id) if env.correlation_id else None
                slot = slots.popleft() if slots else None
                if slots is not None and not slots:
                    del self._pending[env.correlation_id]
            reply = message_from_envelope(env, delivery.count)
            if slot is None:
                self._late(reply)
                continue
            slot.reply = reply
            slot.waiter.wake()

    def _late(self, reply: Message) -> None:
        if self._on_late_reply is None:
            log.warning(
                "reply %s (correlation id %r) came after its request timed out; dropped",
                reply.jms_message_id,
                reply.jms_correlation_id,
            )
            return
        try:
            self._on_late_reply(reply)
        except Exception:
            log.exception("on_late_reply failed for reply %s", reply.jms_message_id)

    def _prepare(self, message: Message, waiter: Any) -> tuple[str, str, _Slot]:
        if self._closed:
            raise IllegalStateError("the requestor is closed")
        message.jms_reply_to = self.reply_queue
        message_id = self._broker._new_message_id()
        key = message.jms_correlation_id or message_id
        slot = _Slot(waiter)
        with self._lock:
            self._pending.setdefault(key, collections.deque()).append(slot)
        return message_id, key, slot

    def _forget(self, key: str, slot: _Slot) -> None:
        with self._lock:
            slots = self._pending.get(key)
            if slots is not None and slot in slots:
                slots.remove(slot)
                if not slots:
                    del self._pending[key]

    def _send(self, message: Message, message_id: str, key: str, slot: _Slot, options: dict[str, Any]) -> None:
        try:
            self._producer._send(
                self.destination,
                message,
                options.get("delivery_mode"),
                options.get("priority"),
                options.get("time_to_live"),
                message_id,
            )
        except BaseException:
            self._forget(key, slot)
            raise

    def request(self, message: Message, timeout: float | None = None, **options: Any) -> Message:
        """Send ``message`` and return its reply; :class:`RequestTimeoutError`
        if none comes within ``timeout`` seconds (``None``: wait forever).
        ``options``: ``delivery_mode``, ``priority``, ``time_to_live`` (ms)."""
        waiter = ThreadWaiter()
        message_id, key, slot = self._prepare(message, waiter)
        self._send(message, message_id, key, slot, options)
        deadline = None if timeout is None else time.monotonic() + timeout
        while slot.reply is None:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            waiter.wait(remaining)
        return self._outcome(message_id, key, slot, timeout)

    async def request_async(
        self,
        message: Message,
        timeout: float | None = None,
        in_transaction: Sequence[Callable[[Any], Any]] = (),
        **options: Any,
    ) -> Message:
        """Like :meth:`request`, for asyncio: waits without blocking the loop.
        ``in_transaction`` functions run in the store transaction that stores
        the request (see ``Session.commit``), e.g. to record it in a ledger."""
        waiter = AsyncWaiter()
        message_id, key, slot = self._prepare(message, waiter)
        producer = self._producer
        try:
            env = producer._envelope(
                self.destination,
                message,
                options.get("delivery_mode"),
                options.get("priority"),
                options.get("time_to_live"),
                message_id,
            )
            producer._stamp(message, env)  # ``in_transaction`` code can read message.jms_message_id
            await store_commit_async(self._broker.store, (env,), (), in_transaction)
        except BaseException:
            self._forget(key, slot)
            raise
        deadline = None if timeout is None else time.monotonic() + timeout
        while slot.reply is None:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            await waiter.wait(remaining)
        return self._outcome(message_id, key, slot, timeout)

    def _outcome(self, message_id: str, key: str, slot: _Slot, timeout: float | None) -> Message:
        if slot.reply is None:
            self._forget(key, slot)
            if slot.reply is None:  # a reply may have raced the timeout
                raise RequestTimeoutError(
                    f"no reply to request {message_id} (correlation id {key!r}) on {self.destination} "
                    f"within {timeout} s"
                )
        return slot.reply

    def close(self) -> None:
        """Stop waiting for replies and delete the temporary reply queue."""
        if self._closed:
            return
        self._closed = True
        self._broker._remove_waker(self._box, self._route)
        self._reader.close()
        try:
            self.reply_queue.delete()
        except Exception:  # the connection may be closed already
            pass
        with self._lock:
            pending = [slot for slots in self._pending.values() for slot in slots]
            self._pending.clear()
        for slot in pending:
            slot.waiter.wake()
