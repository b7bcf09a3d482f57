"""The ledger's view of deliveries: their rows and timelines (tables in :mod:`gateway.delivery.tables`).

Writes are functions of a SQLAlchemy connection so that they run inside the store transaction that
queues, acknowledges or dead-letters the delivery's message: a delivery is recorded if and only if it was
queued, and marked delivered if and only if its message was acknowledged.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from broker_core import sql
from broker_core.clock import now_ms
from gateway.delivery.tables import attempts, deliveries
from ledger_contract.tables import events as ledger_events

__all__ = ["Attempt", "DeliveryLedger", "DeliveryRow", "EndpointSummary", "now_ms", "upgrade_deliveries"]

MIGRATIONS = os.path.join(os.path.dirname(__file__), "migrations")
VERSION_TABLE = "b2b_delivery_version"


def upgrade_deliveries(engine: sa.Engine) -> str:
    """Create or upgrade the deliveries' tables to the head revision; returns it."""
    return sql.migrate(engine, MIGRATIONS, VERSION_TABLE)


def head_revision() -> str:
    return sql.head_revision(MIGRATIONS)


def current_revision(engine: sa.Engine) -> str | None:
    return sql.current_revision(engine, VERSION_TABLE)


@dataclass(frozen=True, slots=True)
class Attempt:
    attempt: int
    at: int
    endpoint: str
    outcome: str
    status: int | None
    detail: str
    duration_ms: int
    evidence: bytes | None = None


@dataclass(frozen=True, slots=True)
class DeliveryRow:
    message_id: str
    partner: str
    endpoint: str
    kind: str
    source: str
    doc_type: str | None
    content_type: str
    status: str
    created_at: int
    queued_at: int
    updated_at: int
    attempts: int
    failing_since: int | None
    last_status: int | None
    last_detail: str | None
    document: bytes | None = None
    timeline: tuple[Attempt, ...] = ()


@dataclass(frozen=True, slots=True)
class EndpointSummary:
    partner: str
    endpoint: str
    pending: int
    failing: int
    failing_since: int | None
    dead: int
    delivered: int


_SUMMARY_COLUMNS = [c for c in deliveries.c if c.name != "document"]


class DeliveryLedger:
    """Reads and writes of the deliveries' rows."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    @functools.cached_property
    def has_events(self) -> bool:
        """Whether the ledger's event log is in this database (always, where a gateway serves)."""
        return sa.inspect(self.engine).has_table(ledger_events.name)

    # ------------------------------------------------------------------ writes (inside a store transaction)

    @staticmethod
    def record_delivered(items: list[tuple[str, Attempt]], events: bool = False) -> Callable[[sa.Connection], None]:
        """The delivered attempts of several deliveries (each its last: the row settles ``delivered``), in a
        few statements; with *events*, each outbound document's ``delivered`` event in the ledger's event
        log, where the warehouse load finds it, ordered like any other by the transaction that writes it."""

        def run(conn: sa.Connection) -> None:
            conn.execute(
                attempts.insert(),
                [
                    {
                        "message_id": message_id,
                        "attempt": a.attempt,
                        "at": a.at,
                        "endpoint": a.endpoint,
                        "outcome": a.outcome,
                        "status": a.status,
                        "detail": a.detail[:1000],
                        "duration_ms": a.duration_ms,
                        "evidence": a.evidence,
                    }
                    for message_id, a in items
                ],
            )
            conn.execute(
                deliveries.update()
                .where(deliveries.c.message_id == sa.bindparam("m"))
                .values(
                    status="delivered",
                    attempts=sa.bindparam("n"),
                    updated_at=now_ms(),
                    last_status=sa.bindparam("s"),
                    last_detail=sa.bindparam("d"),
                    failing_since=None,
                ),
                [{"m": message_id, "n": a.attempt, "s": a.status, "d": a.detail[:1000]} for message_id, a in items],
            )
            if events:
                conn.execute(
                    ledger_events.insert(),
                    [{"message_id": message_id, "status": "delivered", "at": a.at} for message_id, a in items],
                )

        return run

    @staticmethod
    def insert(
        message_id: str,
        partner: str,
        endpoint: str,
        kind: str,
        source: str,
        doc_type: str | None,
        content_type: str,
        document: bytes,
    ) -> Callable[[sa.Connection], None]:
        def run(conn: sa.Connection) -> None:
            at = now_ms()
            conn.execute(
                deliveries.insert().values(
                    message_id=message_id,
                    partner=partner,
                    endpoint=endpoint,
                    kind=kind,
                    source=source[:300],
                    doc_type=doc_type,
                    content_type=content_type,
                    status="pending",
                    created_at=at,
                    queued_at=at,
                    updated_at=at,
                    attempts=0,
                    document=document,
                )
            )

        return run

    @staticmethod
    def record_attempt(
        message_id: str, attempt: Attempt, status: str | None = None, failing: bool = False
    ) -> Callable[[sa.Connection], None]:
        """Append *attempt* to the timeline and bring the row along (*status* when it settles)."""

        def run(conn: sa.Connection) -> None:
            conn.execute(
                attempts.insert().values(
                    message_id=message_id,
                    attempt=attempt.attempt,
                    at=attempt.at,
                    endpoint=attempt.endpoint,
                    outcome=attempt.outcome,
                    status=attempt.status,
                    detail=attempt.detail[:1000],
                    duration_ms=attempt.duration_ms,
                    evidence=attempt.evidence,
                )
            )
            values: dict[str, Any] = {
                "attempts": attempt.attempt,
                "updated_at": now_ms(),
                "last_status": attempt.status,
                "last_detail": attempt.detail[:1000],
            }
            if status is not None:
                values["status"] = status
            if failing:
                values["failing_since"] = sa.func.coalesce(deliveries.c.failing_since, attempt.at)
            else:
                values["failing_since"] = None
            conn.execute(deliveries.update().where(deliveries.c.message_id == message_id).values(**values))

        return run

    @staticmethod
    def set_status(message_ids: list[str], status: str, *, requeue: bool = False) -> Callable[[sa.Connection], int]:
        """Mark deliveries (replayed: back to pending with a fresh count and age; discarded)."""

        def run(conn: sa.Connection) -> int:
            at = now_ms()
            values: dict[str, Any] = {"status": status, "updated_at": at}
            if requeue:
                values.update(queued_at=at, attempts=0, failing_since=None)
            result = conn.execute(deliveries.update().where(deliveries.c.message_id.in_(message_ids)).values(**values))
            return result.rowcount or 0

        return run

    # ------------------------------------------------------------------ reads

    def get(self, message_id: str, *, timeline: bool = True, document: bool = False) -> DeliveryRow | None:
        columns = list(deliveries.c) if document else _SUMMARY_COLUMNS
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(*columns).where(deliveries.c.message_id == message_id)).first()
            if row is None:
                return None
            steps: tuple[Attempt, ...] = ()
            if timeline:
                steps = tuple(
                    Attempt(r.attempt, r.at, r.endpoint, r.outcome, r.status, r.detail or "", r.duration_ms, r.evidence)
                    for r in conn.execute(
                        sa.select(attempts)
                        .where(attempts.c.message_id == message_id)
                        .order_by(attempts.c.id)
                        .limit(1000)
                    )
                )
        return _row(row, steps)

    def progress(self, message_id: str) -> tuple[int, int] | None:
        """(attempts made, queued_at) of a delivery, None when it is not recorded."""
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(deliveries.c.attempts, deliveries.c.queued_at).where(deliveries.c.message_id == message_id)
            ).first()
        return None if row is None else (row[0], row[1])

    def list(
        self, *, partner: str | None = None, endpoint: str | None = None, status: str | None = None, limit: int = 100
    ) -> list[DeliveryRow]:
        query = sa.select(*_SUMMARY_COLUMNS)
        if partner:
            query = query.where(deliveries.c.partner == partner)
        if endpoint:
            query = query.where(deliveries.c.endpoint == endpoint)
        if status:
            query = query.where(deliveries.c.status == status)
        query = query.order_by(deliveries.c.updated_at.desc()).limit(max(1, min(limit, 1000)))
        with self.engine.connect() as conn:
            return [_row(r, ()) for r in conn.execute(query)]

    def summary(self) -> list[EndpointSummary]:
        """Per endpoint: pending, failing (pending with a failed attempt), since when, dead, delivered."""
        d = deliveries.c
        query = (
            sa.select(
                d.partner,
                d.endpoint,
                sa.func.sum(sa.case((d.status == "pending", 1), else_=0)),
                sa.func.sum(sa.case((sa.and_(d.status == "pending", d.failing_since.is_not(None)), 1), else_=0)),
                sa.func.min(sa.case((d.status == "pending", d.failing_since), else_=None)),
                sa.func.sum(sa.case((d.status == "dead", 1), else_=0)),
                sa.func.sum(sa.case((d.status == "delivered", 1), else_=0)),
            )
            .group_by(d.partner, d.endpoint)
            .order_by(d.partner, d.endpoint)
        )
        with self.engine.connect() as conn:
            return [
                EndpointSummary(r[0], r[1], int(r[2] or 0), int(r[3] or 0), r[4], int(r[5] or 0), int(r[6] or 0))
                for r in conn.execute(query)
            ]


def _row(row: Any, steps: tuple[Attempt, ...]) -> DeliveryRow:
    m = row._mapping
    return DeliveryRow(
        m["message_id"],
        m["partner"],
        m["endpoint"],
        m["kind"],
        m["source"],
        m["doc_type"],
        m["content_type"],
        m["status"],
        m["created_at"],
        m["queued_at"],
        m["updated_at"],
        m["attempts"],
        m["failing_since"],
        m["last_status"],
        m["last_detail"],
        m.get("document"),
        steps,
    )
