"""Partners told what happened to their documents: late replies and status notifications, as deliveries.

A reply that came after the partner's request timed out goes to the partner's ``notify.late_replies``
endpoint (queued off the replier's thread, which must not wait for a commit). Status notifications follow
the ledger's events (``b2b_ledger_events``, whose ``seq`` only grows) from a cursor of their own: each
batch's notifications are queued in the same commit that moves the cursor, so none is lost or queued twice
by this process; one process at a time follows them (a store lease).
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
from typing import Any

import sqlalchemy as sa

from broker_core import Broker, DeliveryMode, Queue
from gateway.delivery.outbox import delivery_message
from gateway.delivery.records import DeliveryLedger
from gateway.delivery.tables import cursors
from ledger_contract.tables import documents, events

__all__ = ["StatusNotifier", "push_late_reply"]

log = logging.getLogger(__name__)
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="b2b-late-replies")
_CURSOR = "status"
_LEASE = "b2b-delivery-status-notifier"
STATUS_CONTENT_TYPE = "application/json"


def push_late_reply(gateway: Any, message_id: str, reply: bytes, reply_type: str | None, error: str | None) -> None:
    """Queue a late reply for the requesting partner's ``notify.late_replies`` endpoint, if it has one."""
    partners = getattr(gateway, "partners", None)
    if partners is None or not any(p.delivery.late_replies for p in partners.partners.values()) or error:
        return

    def run() -> None:
        from gateway.delivery.outbox import queue_delivery

        try:
            record = gateway.ledger.get(message_id)
            partner = partners.get(record.partner) if record is not None else None
            if partner is None or partner.delivery.late_replies is None:
                return
            endpoint = partner.delivery.endpoints[partner.delivery.late_replies]
            queue_delivery(gateway.broker, endpoint, reply, source=f"late-reply:{message_id}", doc_type=reply_type)
        except Exception:  # the reply is in the ledger; GET still shows it
            log.exception("could not queue the late reply to %s for delivery", message_id)

    _POOL.submit(run)


class StatusNotifier:
    """Follows the ledger's events and queues a JSON notification per event for partners who asked."""

    def __init__(self, broker: Broker, partners: Any, *, interval: float = 1.0, batch: int = 500) -> None:
        self.broker = broker
        self.interval = interval
        self.batch = batch
        self.targets = {
            p.id: (p.delivery.endpoints[p.delivery.status_notifications], frozenset(p.delivery.statuses))
            for p in partners.partners.values()
            if p.enabled and p.delivery.status_notifications
        }
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self.targets:
            return
        self._thread = threading.Thread(target=self._loop, name="b2b-status-notifier", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        try:
            self.broker.release_lease(_LEASE)
        except Exception:  # the store is closing
            pass

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if self.broker.acquire_lease(_LEASE, max(10.0, self.interval * 10)):
                    while self.run_once() == self.batch and not self._stop.is_set():
                        pass
            except Exception:  # the store is away: try again later
                log.exception("status notifications: following the ledger failed")

    def run_once(self) -> int:
        """Queue the notifications of the next batch of events; returns how many events it read."""
        engine = self.broker.engine
        with engine.connect() as conn:
            row = conn.execute(sa.select(cursors.c.seq).where(cursors.c.name == _CURSOR)).first()
            start = row[0] if row is not None else None
            if start is None:  # the first run starts from now: no flood of the past
                last = conn.execute(sa.select(sa.func.max(events.c.seq))).scalar() or 0
                self.broker.write(lambda c: c.execute(cursors.insert().values(name=_CURSOR, seq=last)))
                return 0
            rows = conn.execute(
                sa.select(
                    events.c.seq,
                    events.c.message_id,
                    events.c.status,
                    events.c.at,
                    documents.c.partner,
                    documents.c.doc_type,
                    documents.c.doc_id,
                    documents.c.correlation_id,
                )
                .join(documents, documents.c.message_id == events.c.message_id)
                .where(events.c.seq > start)
                .order_by(events.c.seq)
                .limit(self.batch)
            ).all()
        if not rows:
            return 0
        with self.broker.connect() as connection:
            session = connection.create_session(transacted=True)
            producer = session.create_producer(None)
            inserts = []
            for r in rows:
                target = self.targets.get(r.partner)
                if target is None or r.status not in target[1]:
                    continue
                endpoint = target[0]
                body = json.dumps(
                    {
                        "type": "document.status",
                        "message_id": r.message_id,
                        "status": r.status,
                        "at": r.at,
                        "doc_type": r.doc_type,
                        "doc_id": r.doc_id,
                        "correlation_id": r.correlation_id,
                    },
                    separators=(",", ":"),
                ).encode()
                message = delivery_message(endpoint, body, STATUS_CONTENT_TYPE, f"status:{r.message_id}")
                producer.send(Queue(endpoint.queue), message, delivery_mode=DeliveryMode.PERSISTENT)
                inserts.append(
                    DeliveryLedger.insert(
                        message.jms_message_id,
                        endpoint.partner,
                        endpoint.name,
                        endpoint.kind,
                        f"status:{r.message_id}",
                        "status",
                        STATUS_CONTENT_TYPE,
                        body,
                    )
                )
            last = rows[-1].seq

            def move(conn: Any) -> None:
                result = conn.execute(
                    cursors.update().where(cursors.c.name == _CURSOR, cursors.c.seq == start).values(seq=last)
                )
                if result.rowcount != 1:
                    raise RuntimeError("another process moved the status notifications' cursor")

            session.commit(in_transaction=[*inserts, move])
        return len(rows)
