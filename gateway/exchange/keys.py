"""A document's idempotency key: what makes two posts the same document for the ledger's unique key."""

from __future__ import annotations

import hashlib

from gateway.exchange.ids import uuid7_str
from gateway.routing.routes import Route

__all__ = ["idempotency_key"]


def idempotency_key(
    partner_id: str,
    route: Route,
    doc_id: str | None,
    header: str | None,
    party: str | None = None,
    values: list[str] | None = None,
) -> str:
    """The ledger's idempotency key, per partner: from the header; else from the route's own key XPaths'
    *values*; else document type + id, with the sender *party* when there is one (a key without it is
    the one every document had before parties were part of it). A document that has none of these gets
    a key of its own: it is never a replay."""
    if header is not None:
        key = f"{partner_id}|key|{header}"
    elif values is not None:
        if not any(values):
            return f"{partner_id}|unique|{uuid7_str()}"
        key = f"{partner_id}|{route.root}|xpath|" + "|".join(f"{len(v)}:{v}" for v in values)
    elif doc_id is not None:
        key = (
            f"{partner_id}|{route.root}|{doc_id}"
            if party is None
            else f"{partner_id}|{route.root}|{doc_id}|party={party}"
        )
    else:
        return f"{partner_id}|unique|{uuid7_str()}"
    if len(key) > 500:
        key = f"{partner_id}|sha256|{hashlib.sha256(key.encode('utf-8')).hexdigest()}"
    return key
