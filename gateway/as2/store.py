"""The ledger's AS2 records (``b2b_as2_messages``): per message, its MIC, its MDN and the disposition.

A received message's row is written once its MDN is made, after its document was committed: a partner's
resend then gets the very MDN sent before. A negative MDN's row is replaced when the partner sends the message
again and it is accepted; an accepted one is never replaced.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from broker_core.clock import now_ms
from ledger_contract.tables import as2_messages

__all__ = ["As2Record", "As2Store", "stored_id"]

PROCESSED = "processed"


def stored_id(as2_message_id: str) -> str:
    """The Message-ID as the ledger keys it: itself when short enough, else its SHA-256."""
    if len(as2_message_id) <= 200:
        return as2_message_id
    return "sha256:" + hashlib.sha256(as2_message_id.encode("utf-8", "replace")).hexdigest()


@dataclass(frozen=True, slots=True)
class As2Record:
    direction: str
    partner: str
    as2_message_id: str
    message_id: str | None
    mic: str | None
    disposition: str | None
    mdn: bytes | None
    created_at: int
    updated_at: int
    #: how the MDN went to the partner, or why it was not sent (received messages)
    mdn_delivery: str | None = None


class As2Store:
    """Reads ``b2b_as2_messages`` on the engine (blocking: call from a thread); writes through the broker's store
    writer (one writer per process on SQLite, like the ledger's own writes), awaited without blocking."""

    def __init__(self, engine: sa.Engine, broker: Any) -> None:
        self.engine = engine
        self.broker = broker

    def get(self, direction: str, partner: str, as2_message_id: str) -> As2Record | None:
        t = as2_messages
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(t).where(
                    t.c.direction == direction, t.c.partner == partner, t.c.as2_message_id == stored_id(as2_message_id)
                )
            ).first()
        return None if row is None else As2Record(**row._mapping)

    def for_document(self, message_id: str) -> list[As2Record]:
        """The AS2 records of a ledger document (the console's timeline)."""
        t = as2_messages
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(t).where(t.c.message_id == message_id).limit(10)).all()
        return [As2Record(**row._mapping) for row in rows]

    async def record_received(
        self,
        partner: str,
        as2_message_id: str,
        message_id: str | None,
        mic: str | None,
        disposition: str,
        mdn: bytes,
        delivery: str | None = None,
    ) -> As2Record:
        """Keep the MDN sent for a received message; returns the row that holds (an accepted one stays)."""
        t, key, now = as2_messages, stored_id(as2_message_id), now_ms()
        values = {
            "message_id": message_id,
            "mic": mic,
            "disposition": disposition,
            "mdn": mdn,
            "mdn_delivery": delivery[:300] if delivery else None,
            "updated_at": now,
        }

        def write(conn: sa.Connection) -> As2Record:
            where = (t.c.direction == "in", t.c.partner == partner, t.c.as2_message_id == key)
            row = conn.execute(sa.select(t).where(*where)).first()
            if row is None:
                conn.execute(
                    t.insert().values(direction="in", partner=partner, as2_message_id=key, created_at=now, **values)
                )
                return As2Record("in", partner, key, message_id, mic, disposition, mdn, now, now, delivery)
            if row.disposition == PROCESSED:
                return As2Record(**row._mapping)
            conn.execute(t.update().where(*where).values(**values))
            return As2Record("in", partner, key, message_id, mic, disposition, mdn, row.created_at, now, delivery)

        # not durable: a power cut may lose the row, never the document (committed before); the resend then
        # finds the document by its idempotency key and the MDN is made again, with the same disposition and MIC
        (record,) = await self.broker.write_async(write, durable=False)
        return record

    async def mdn_delivered(self, partner: str, as2_message_id: str, how: str) -> None:
        """Note how a received message's MDN went to the partner, or why it was not sent."""
        t = as2_messages
        await self.broker.write_async(
            lambda conn: conn.execute(
                t.update()
                .where(t.c.direction == "in", t.c.partner == partner, t.c.as2_message_id == stored_id(as2_message_id))
                .values(mdn_delivery=how[:300], updated_at=now_ms())
            ),
            durable=False,
        )

    async def record_sent(self, partner: str, as2_message_id: str, message_id: str | None, mic: str) -> None:
        """A message we sent, its MDN awaited."""
        now = now_ms()
        await self.broker.write_async(
            lambda conn: conn.execute(
                as2_messages.insert().values(
                    direction="out",
                    partner=partner,
                    as2_message_id=stored_id(as2_message_id),
                    message_id=message_id,
                    mic=mic,
                    disposition=None,
                    mdn=None,
                    created_at=now,
                    updated_at=now,
                )
            )
        )

    async def mdn_received(self, partner: str, as2_message_id: str, disposition: str, mdn: bytes) -> bool:
        """The MDN of a message we sent; False when we sent no such message to that partner."""
        t = as2_messages
        (result,) = await self.broker.write_async(
            lambda conn: (
                conn.execute(
                    t.update()
                    .where(
                        t.c.direction == "out",
                        t.c.partner == partner,
                        t.c.as2_message_id == stored_id(as2_message_id),
                    )
                    .values(disposition=disposition[:200], mdn=mdn, updated_at=now_ms())
                ).rowcount
            )
        )
        return result == 1
