"""Request-reply: a route's document sent to its back end, and the reply awaited on a temporary queue.

Each request-reply route has one long-lived :class:`broker_core.Requestor`. It sends the document (the ledger
insert in the same commit) and waits up to the route's timeout. The reply is recorded in the ledger (status
``replied``, or ``failed`` for a reply carrying :data:`ERROR_PROPERTY`) as it is returned; the write is not
awaited, as it would add a commit to every round trip, so until it lands the reply is kept in memory for
replays and GET. No reply in time: :class:`~gateway.errors.ReplyTimeoutError` (504), and a reply that comes
later (within ``late_reply_window``) is still recorded, so GET shows it.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from broker_core import Message, Requestor, RequestTimeoutError
from gateway.errors import BackendError, ReplyTimeoutError
from gateway.exchange.receipts import DOCUMENTS_PATH, Accepted, Outcome
from gateway.exchange.replies import ERROR_PROPERTY, PendingReplies, reply_parts
from gateway.ledger.records import Ledger
from gateway.routing.routes import Route

if TYPE_CHECKING:
    from gateway.exchange.idempotency import Idempotency

__all__ = ["ERROR_PROPERTY", "MAX_LATE", "Exchange", "RequestReply"]

log = logging.getLogger(__name__)

#: At most this many timed-out requests per route wait for a late reply.
MAX_LATE = 100_000


@dataclass
class Exchange:
    """A request-reply route's requestor and the requests it may still get replies to."""

    route: Route
    requestor: Requestor
    # correlation id -> [the message while waiting, then its message id; deadline for a late reply
    # (monotonic), None while waiting]
    open: dict[str, list[Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class RequestReply:
    """The request-reply routes' exchanges: one requestor per route, the requests that may still get a reply."""

    def __init__(
        self,
        ledger: Ledger,
        replies: PendingReplies,
        idempotency: Idempotency,
        *,
        late_reply_window: float,
        on_late_reply: Callable[[str, bytes, str | None, str | None], None] | None = None,
    ) -> None:
        self.ledger = ledger
        #: told of each late reply once it is recorded: (message id, reply, reply type, error)
        self.on_late_reply = on_late_reply
        self.replies = replies
        self.idempotency = idempotency
        self.late_reply_window = late_reply_window
        self._exchanges: dict[str, Exchange] = {}

    def start(self, connection: Any, routes: Any) -> None:
        """Open one requestor per request-reply route of *routes*, on sessions of *connection*."""
        for route in routes:
            if route.request_reply:
                session = connection.create_session(False)

                def late(reply: Message, _route: Route = route) -> None:
                    self._late_reply(self._exchanges[_route.id], reply)

                requestor = Requestor(session, route.destination, on_late_reply=late)
                self._exchanges[route.id] = Exchange(route, requestor)

    def stop(self) -> None:
        for exchange in self._exchanges.values():
            exchange.requestor.close()

    async def send(self, accepted: Accepted) -> Outcome:
        route, message, correlation = accepted.route, accepted.message, accepted.correlation
        exchange = self._exchanges[route.id]
        with exchange.lock:
            self._expire_late(exchange)
            if correlation in exchange.open:  # replies are matched by correlation id: keep it unique
                correlation = f"{correlation}~{secrets.token_hex(4)}"
            exchange.open[correlation] = [message, None]
        accepted.correlation = message.jms_correlation_id = correlation
        ledger = self.ledger
        holder: dict[str, Any] = {}

        def record(conn: Any) -> None:
            message_id = message.jms_message_id
            receipt = holder["receipt"] = accepted.receipt(message_id)
            ledger.insert(conn, accepted.row(message_id, receipt))

        try:
            reply = await exchange.requestor.request_async(
                message,
                route.timeout,
                in_transaction=[record],
                delivery_mode=route.delivery_mode,
                priority=route.priority,
                time_to_live=route.time_to_live_ms,
            )
        except RequestTimeoutError:
            message_id = message.jms_message_id
            self.idempotency.remember(accepted.key, message_id, accepted.digest)
            with exchange.lock:
                entry = exchange.open.get(correlation)
                if entry is not None:  # keep the id (not the message and its document) for a late reply
                    entry[0] = message_id
                    entry[1] = time.monotonic() + self.late_reply_window
            raise ReplyTimeoutError(
                f"No reply arrived within {route.timeout:g} s. The document was accepted as {message_id}; "
                f"GET {DOCUMENTS_PATH}{message_id} returns its status and the reply once it comes. Do not resend it.",
                message_id=message_id,
                correlation_id=correlation,
                status_url=DOCUMENTS_PATH + message_id,
            ) from None
        except BaseException:
            with exchange.lock:
                exchange.open.pop(correlation, None)
            raise
        with exchange.lock:
            exchange.open.pop(correlation, None)
        message_id = message.jms_message_id
        self.idempotency.remember(accepted.key, message_id, accepted.digest)
        reply_bytes, reply_type, error = reply_parts(reply)
        self.replies.record(message_id, reply_bytes, reply_type, error, ("accepted", "delivered"))
        if error is not None:
            raise BackendError(
                f"The back end could not process the document: {error}",
                message_id=message_id,
                correlation_id=correlation,
                status_url=DOCUMENTS_PATH + message_id,
            )
        return Outcome(message_id, correlation, route.id, holder["receipt"], reply=reply_bytes, reply_type=reply_type)

    # ----------------------------------------------------------------- late replies

    def _expire_late(self, exchange: Exchange) -> None:
        """Forget timed-out requests whose late-reply window has passed, and the oldest of them beyond
        :data:`MAX_LATE` (call with the lock held)."""
        if len(exchange.open) < 64:
            return
        now = time.monotonic()
        stale = [c for c, (_, deadline) in exchange.open.items() if deadline is not None and deadline < now]
        for c in stale:
            del exchange.open[c]
        excess = len(exchange.open) - MAX_LATE
        if excess > 0:  # in insertion order: the oldest first
            for c in [c for c, (_, deadline) in exchange.open.items() if deadline is not None][:excess]:
                del exchange.open[c]

    def _late_reply(self, exchange: Exchange, reply: Message) -> None:
        """A reply came after its request timed out: record it (runs in the replier's thread)."""
        correlation = reply.jms_correlation_id
        with exchange.lock:
            entry = exchange.open.pop(correlation, None) if correlation else None
        target = None if entry is None else entry[0]
        message_id = target if isinstance(target, str) or target is None else target.jms_message_id
        if message_id is None:
            log.warning(
                "route %s: a reply (correlation id %r) matches no request of this gateway; dropped",
                exchange.route.id,
                (correlation or "")[:100],
            )
            return
        reply_bytes, reply_type, error = reply_parts(reply)
        self.replies.record(message_id, reply_bytes, reply_type, error, ("accepted", "delivered", "dead_lettered"))
        log.info("recording a late reply to %s (route %s)", message_id, exchange.route.id)
        if self.on_late_reply is not None:
            self.on_late_reply(message_id, reply_bytes, reply_type, error)
