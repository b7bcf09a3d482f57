"""Helpers of the archive job's tests (``from archivetest import ...``): a ledger filled through the gateway's
own ledger code on a broker store, the documents being the official UBL examples with ids of their own."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from broker_core import Broker
from gateway.exchange.submission import document_digest
from gateway.ledger.records import Ledger, NewDocument, upgrade_ledger
from ledger_contract.retention import RetentionPolicy, Rule

EXAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "ubl-2.1" / "xml"
ORDER = (EXAMPLES / "UBL-Order-2.1-Example.xml").read_bytes()
REPLY = (EXAMPLES / "UBL-OrderResponse-2.1-Example.xml").read_bytes()
NS = "urn:oasis:names:specification:ubl:schema:xsd:Order-2"
DAY_MS = 86_400_000


def order(n: int) -> bytes:
    return ORDER.replace(b"<cbc:ID>34</cbc:ID>", f"<cbc:ID>PO-{n}</cbc:ID>".encode(), 1)


def open_store(url: str) -> Broker:
    broker = Broker.open(url, sweep_interval=0)
    upgrade_ledger(broker.engine)
    return broker


def fill(
    broker: Broker, count: int, *, days_ago: float = 100, start: int = 0, status: str = "replied", spread_days: int = 2
) -> list[str]:
    """*count* documents accepted *days_ago* days ago (over *spread_days* received dates) and moved to
    *status* (with a reply when ``replied``); their message ids."""
    ledger = Ledger(broker.engine)
    base = int(time.time() * 1000 - days_ago * DAY_MS)
    ids = []
    docs = []
    for k in range(start, start + count):
        body = order(k)
        at = base + (k % spread_days) * DAY_MS + k
        mid = f"ID:test-{k:06d}"
        ids.append(mid)
        docs.append(
            (
                NewDocument(
                    message_id=mid,
                    partner="acme" if k % 3 else "globex",
                    doc_type="Order",
                    doc_namespace=NS,
                    doc_id=f"PO-{k}",
                    idempotency_key=f"key-{k}",
                    correlation_id=f"c-{k}",
                    route="ubl-order",
                    destination="queue://orders.inbound",
                    received_at=at,
                    document=body,
                    receipt='{"status":"accepted"}',
                    digest=document_digest(body),
                ),
                at,
            )
        )

    for i in range(0, len(docs), 500):
        part = docs[i : i + 500]
        broker.write(lambda conn, part=part: _insert(ledger, conn, part, status))
    return ids


def _insert(ledger: Ledger, conn: Any, docs: list[Any], status: str) -> None:
    for doc, at in docs:
        ledger.insert(conn, doc)
        ledger.transition(
            conn,
            doc.message_id,
            status,
            from_statuses=("accepted",),
            reply=REPLY if status == "replied" else None,
            reply_type="OrderResponse" if status == "replied" else None,
            at=at + 50,
        )


def policy(batch: int = 100, **changes: Any) -> RetentionPolicy:
    values: dict[str, Any] = {"default": Rule(90 * 86400.0, "archive"), "batch": batch}
    values.update(changes)
    return RetentionPolicy(**values)


def online_ids(broker: Broker) -> set[str]:
    from ledger_contract.tables import documents

    with broker.engine.connect() as conn:
        return set(conn.execute(sa.select(documents.c.message_id)).scalars())


def tombstoned_ids(broker: Broker) -> set[str]:
    from ledger_contract.tables import tombstones

    with broker.engine.connect() as conn:
        return set(conn.execute(sa.select(tombstones.c.message_id)).scalars())


def archived_ids(root: Path) -> list[str]:
    """Every message id in the archive's files (with repeats, if any)."""
    import pyarrow.dataset as ds

    base = root / "archive_document"
    if not base.is_dir():
        return []
    dataset = ds.dataset(str(base), format="parquet", partitioning="hive")
    if not dataset.files:
        return []
    return dataset.to_table(columns=["message_id"]).column("message_id").to_pylist()
