"""What the gateway answers for an accepted document: its receipt, the :class:`Outcome` of a submission,
and the ledger row that keeps the receipt for replays."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from broker_core import XMLMessage
from gateway.exchange.ids import iso_ms
from gateway.ledger.records import NewDocument
from gateway.routing.partners import Partner
from gateway.routing.routes import Route
from ledger_contract import facts as warehouse_facts

__all__ = ["DOCUMENTS_PATH", "Accepted", "Outcome", "make_receipt", "new_document"]

#: Where a document's status lives (``DOCUMENTS_PATH + message_id``).
DOCUMENTS_PATH = "/v1/documents/"


def _receipt_json(receipt: dict[str, Any]) -> str:
    """Compact JSON (values are str or None)."""
    return orjson.dumps(receipt).decode("utf-8")


@dataclass
class Outcome:
    """What :meth:`Gateway.submit` answers: a receipt (one-way, 202) or a reply (request-reply, 200)."""

    message_id: str
    correlation_id: str
    route: str
    receipt: dict[str, Any]
    reply: bytes | None = None
    reply_type: str | None = None
    replayed: bool = False
    #: the receipt as JSON text, as the ledger holds it, when it is at hand (the HTTP answer's body)
    receipt_json: str | None = None

    @property
    def status_url(self) -> str:
        return DOCUMENTS_PATH + self.message_id


def make_receipt(
    route: Route,
    message_id: str,
    correlation: str,
    doc_id: str | None,
    received_at: int,
    warnings: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    receipt = {
        "message_id": message_id,
        "correlation_id": correlation,
        "route": route.id,
        "document_type": route.doc_type,
        "document_id": doc_id,
        "status": "accepted",
        "received_at": iso_ms(received_at),
        "status_url": DOCUMENTS_PATH + message_id,
    }
    if warnings:  # business rule warnings (flag warning / information): accepted, but told
        receipt["warnings"] = warnings
    return receipt


def new_document(
    route: Route,
    partner: Partner,
    message_id: str,
    correlation: str,
    key: str,
    doc_id: str | None,
    document: bytes,
    received_at: int,
    receipt: dict[str, Any],
    digest: str,
    facts: str | None = None,
    auth: str | None = None,
) -> NewDocument:
    """The ledger row of an accepted document, with its receipt."""
    return NewDocument(
        message_id=message_id,
        partner=partner.id,
        doc_type=route.doc_type,
        doc_namespace=route.doc_namespace,
        doc_id=doc_id,
        idempotency_key=key,
        correlation_id=correlation,
        route=route.id,
        destination=str(route.destination),
        received_at=received_at,
        document=document,
        receipt=_receipt_json(receipt),
        facts=facts,
        facts_version=warehouse_facts.VERSION if facts is not None else None,
        digest=digest,
        auth=auth,
    )


@dataclass(slots=True)
class Accepted:
    """A document through intake and rules, on its way to the store (one-way or request-reply): what its
    receipt and ledger row are made of once the store has given its message an id."""

    route: Route
    partner: Partner
    message: XMLMessage
    correlation: str
    key: str
    doc_id: str | None
    document: bytes
    received_at: int
    digest: str
    facts: str | None = None
    warnings: list[dict[str, Any]] | None = None
    auth: str | None = None

    def receipt(self, message_id: str) -> dict[str, Any]:
        return make_receipt(self.route, message_id, self.correlation, self.doc_id, self.received_at, self.warnings)

    def row(self, message_id: str, receipt: dict[str, Any]) -> NewDocument:
        return new_document(
            self.route,
            self.partner,
            message_id,
            self.correlation,
            self.key,
            self.doc_id,
            self.document,
            self.received_at,
            receipt,
            self.digest,
            self.facts,
            self.auth,
        )
