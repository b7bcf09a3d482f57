"""Replies on their way to the ledger: recorded without waiting for the commit, kept in memory until it lands.

The HTTP answer does not wait for a reply's ledger write (it would add a commit to every round trip). Until
the write lands, the reply is held here, so that a replay or a GET of the document already sees it; the
request-reply exchange, the idempotency replays and the document reads share one :class:`PendingReplies`.
"""

from __future__ import annotations

import logging
from typing import Any

from broker_core import Broker, Message
from gateway.ledger.records import Ledger, LedgerRecord, now_ms

__all__ = ["ERROR_PROPERTY", "PendingReplies", "reply_parts"]

log = logging.getLogger(__name__)

#: The property a back end sets on a reply to say it failed (its value: why).
ERROR_PROPERTY = "B2BError"


def reply_parts(reply: Message) -> tuple[bytes, str | None, str | None]:
    """A reply's text (UTF-8), its type, and the error it carries (None for a success)."""
    text = getattr(reply, "text", None)
    error = reply.get_string_property(ERROR_PROPERTY) if reply.property_exists(ERROR_PROPERTY) else None
    if text is None:
        text = ""
        error = error or "the reply has no text body"
    return text.encode("utf-8"), (reply.jms_type or None), error


class PendingReplies:
    """The replies whose ledger write is under way, by message id: (status, reply, reply type, error)."""

    def __init__(self, ledger: Ledger, broker: Broker) -> None:
        self.ledger = ledger
        self.broker = broker
        self._pending: dict[str, tuple[str, bytes, str | None, str | None]] = {}

    def get(self, message_id: str) -> tuple[str, bytes, str | None, str | None] | None:
        return self._pending.get(message_id)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._pending

    def record(
        self, message_id: str, reply: bytes, reply_type: str | None, error: str | None, from_statuses: tuple[str, ...]
    ) -> None:
        """Record a reply in the ledger without waiting for the commit (any thread)."""
        status = "failed" if error is not None else "replied"
        ledger = self.ledger
        self._pending[message_id] = (status, reply, reply_type, error)

        def done(err: BaseException | None) -> None:
            self._pending.pop(message_id, None)
            if err is not None:
                log.error("could not record the reply to %s: %s", message_id, err)

        try:
            self.broker.write(
                lambda conn: ledger.transition(
                    conn,
                    message_id,
                    status,
                    from_statuses=from_statuses,
                    reply=reply,
                    reply_type=reply_type,
                    error=error,
                ),
                callback=done,
            )
        except Exception as exc:  # the store is closing: the reply is only in memory now
            self._pending.pop(message_id, None)
            log.error("could not record the reply to %s: %s", message_id, exc)

    def merged(self, record: LedgerRecord, before: Any = None) -> LedgerRecord:
        """*record* with a reply that is still on its way to the ledger (*before*: what was pending before
        the record was read, in case the write landed between the read and now)."""
        pending = self._pending.get(record.message_id) or before
        if pending is not None and record.reply is None:
            record.status, record.reply, record.reply_type, record.error = pending
            if record.history is not None:
                record.history.append((record.status, now_ms()))
        return record
