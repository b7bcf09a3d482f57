"""The audit trail: every operator action, who did it and how many messages it touched (``b2b_audit``)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from broker_core import Broker
from gateway.admin.tables import audit

__all__ = ["Audit", "AuditEntry"]


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at: int
    operator: str
    role: str
    action: str
    target: str | None
    selector: str | None
    message_ids: list[str] | None
    count: int | None
    outcome: str
    detail: str | None
    client: str | None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Audit:
    """Writes through the store's writer (one transaction each, like the ledger's); reads on the engine."""

    def __init__(self, engine: sa.Engine, broker: Broker) -> None:
        self.engine = engine
        self.broker = broker

    def record(
        self,
        *,
        operator: str,
        role: str,
        action: str,
        target: str | None = None,
        selector: str | None = None,
        message_ids: Sequence[str] | None = None,
        count: int | None = None,
        outcome: str = "done",
        detail: str | None = None,
        client: str | None = None,
    ) -> None:
        row = {
            "at": int(time.time() * 1000),
            "operator": operator[:64],
            "role": role[:20],
            "action": action[:40],
            "target": target[:600] if target else None,
            "selector": selector[:4000] if selector else None,
            "message_ids": json.dumps(list(message_ids)[:1000]) if message_ids else None,
            "count": count,
            "outcome": outcome[:20],
            "detail": detail[:2000] if detail else None,
            "client": client[:100] if client else None,
        }
        self.broker.write(lambda conn: conn.execute(audit.insert(), row))

    def recent(
        self, *, limit: int = 50, before: int | None = None, operator: str | None = None, action: str | None = None
    ) -> list[AuditEntry]:
        """The latest entries (newest first), those with an id under *before* when given."""
        query = sa.select(audit)
        if before is not None:
            query = query.where(audit.c.id < before)
        if operator:
            query = query.where(audit.c.operator == operator)
        if action:
            query = query.where(audit.c.action == action)
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(audit.c.id.desc()).limit(limit)).all()
            conn.rollback()
        return [
            AuditEntry(
                r.id,
                r.at,
                r.operator,
                r.role,
                r.action,
                r.target,
                r.selector,
                json.loads(r.message_ids) if r.message_ids else None,
                r.count,
                r.outcome,
                r.detail,
                r.client,
            )
            for r in rows
        ]
