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
from dataclasses import dataclass, field
from typing import Any

from broker_core import Message, Requestor, RequestTimeoutError, XMLMessage

from gateway.delivery.notify import push_late_reply
from gateway.errors import BackendError, ReplyTimeoutError
from gateway.ledger.records import Ledger, LedgerRecord, now_ms
from gateway.routing.partners import Partner
from gateway.exchange.receipts import DOCUMENTS_PATH, Outcome, make_receipt, new_document
from gateway.routing.routes import Route

__all__ = ["ERROR_PROPERTY", "MAX_LATE", "Exchange", "RequestReply"]

log = logging.getLogger("gateway.exchange.submission")  # the gateway's log, whichever part of it writes

#: The property a back end sets on a reply to say it failed (its value: why).
ERROR_PROPERTY = "B2BError"
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
    """The request-reply exchanges of a :class:`gateway.exchange.submission.Gateway` (it holds the state they use)."""

    ledger: Ledger
    store: Any
    late_reply_window: float
    _exchanges: dict[str, Exchange]
    _unrecorded: dict[str, tuple[str, bytes, str | None, str | None]]

    async def _request_reply(self, route: Route, partner: Partner, message: XMLMessage, correlation: str,
                             key: str, doc_id: str | None, document: bytes, received_at: int, digest: str,
                             facts: str | None = None, warnings: list[dict[str, Any]] | None = None) -> Outcome:
        exchange = self._exchanges[route.id]
        with exchange.lock:
            self._expire_late(exchange)
            if correlation in exchange.open:  # replies are matched by correlation id: keep it unique
                correlation = f"{correlation}~{secrets.token_hex(4)}"
            exchange.open[correlation] = [message, None]
        message.jms_correlation_id = correlation
        ledger = self.ledger
        holder: dict[str, Any] = {}

        def record(conn: Any) -> None:
            message_id = message.jms_message_id
            receipt = make_receipt(route, message_id, correlation, doc_id, received_at, warnings)
            holder["receipt"] = receipt
            ledger.insert(conn, new_document(route, partner, message_id, correlation, key, doc_id, document,
                                             received_at, receipt, digest, facts))

        try:
            reply = await exchange.requestor.request_async(
                message, route.timeout, in_transaction=[record], delivery_mode=route.delivery_mode,
                priority=route.priority, time_to_live=route.time_to_live_ms,
            )
        except RequestTimeoutError:
            message_id = message.jms_message_id
            self._remember(key, message_id, digest)
            with exchange.lock:
                entry = exchange.open.get(correlation)
                if entry is not None:  # keep the id (not the message and its document) for a late reply
                    entry[0] = message_id
                    entry[1] = time.monotonic() + self.late_reply_window
            raise ReplyTimeoutError(
                f"No reply arrived within {route.timeout:g} s. The document was accepted as {message_id}; "
                f"GET {DOCUMENTS_PATH}{message_id} returns its status and the reply once it comes. Do not resend it.",
                message_id=message_id, correlation_id=correlation, status_url=DOCUMENTS_PATH + message_id,
            ) from None
        except BaseException:
            with exchange.lock:
                exchange.open.pop(correlation, None)
            raise
        with exchange.lock:
            exchange.open.pop(correlation, None)
        message_id = message.jms_message_id
        self._remember(key, message_id, digest)
        reply_bytes, reply_type, error = self._reply_parts(reply)
        self._record_reply(message_id, reply_bytes, reply_type, error, ("accepted", "delivered"))
        if error is not None:
            raise BackendError(
                f"The back end could not process the document: {error}",
                message_id=message_id, correlation_id=correlation, status_url=DOCUMENTS_PATH + message_id,
            )
        return Outcome(message_id, correlation, route.id, holder["receipt"], reply=reply_bytes, reply_type=reply_type)

    @staticmethod
    def _reply_parts(reply: Message) -> tuple[bytes, str | None, str | None]:
        text = getattr(reply, "text", None)
        error = reply.get_string_property(ERROR_PROPERTY) if reply.property_exists(ERROR_PROPERTY) else None
        if text is None:
            text = ""
            error = error or "the reply has no text body"
        return text.encode("utf-8"), (reply.jms_type or None), error

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
            log.warning("route %s: a reply (correlation id %r) matches no request of this gateway; dropped",
                        exchange.route.id, (correlation or "")[:100])
            return
        reply_bytes, reply_type, error = self._reply_parts(reply)
        self._record_reply(message_id, reply_bytes, reply_type, error, ("accepted", "delivered", "dead_lettered"))
        log.info("recording a late reply to %s (route %s)", message_id, exchange.route.id)
        push_late_reply(self, message_id, reply_bytes, reply_type, error)

    def _record_reply(self, message_id: str, reply: bytes, reply_type: str | None, error: str | None,
                      from_statuses: tuple[str, ...]) -> None:
        """Record a reply in the ledger without waiting for the commit (any thread).

        The HTTP answer does not wait for this write (it would add a commit to every round trip); until it
        lands, the reply is kept in memory so a replay or a GET of the document already sees it."""
        status = "failed" if error is not None else "replied"
        ledger = self.ledger
        self._unrecorded[message_id] = (status, reply, reply_type, error)

        def done(err: BaseException | None) -> None:
            self._unrecorded.pop(message_id, None)
            if err is not None:
                log.error("could not record the reply to %s: %s", message_id, err)

        try:
            self.broker.write(lambda conn: ledger.transition(
                conn, message_id, status, from_statuses=from_statuses, reply=reply, reply_type=reply_type,
                error=error), callback=done)
        except Exception as exc:  # noqa: BLE001 - the store is closing: the reply is only in memory now
            self._unrecorded.pop(message_id, None)
            log.error("could not record the reply to %s: %s", message_id, exc)

    def _with_unrecorded(self, record: LedgerRecord, before: Any = None) -> LedgerRecord:
        """*record* with a reply that is still on its way to the ledger (*before*: what was pending before
        the record was read, in case the write landed between the read and now)."""
        pending = self._unrecorded.get(record.message_id) or before
        if pending is not None and record.reply is None:
            record.status, record.reply, record.reply_type, record.error = pending
            if record.history is not None:
                record.history.append((record.status, now_ms()))
        return record
