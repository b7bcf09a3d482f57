"""Helpers of the warehouse-load tests (``from etltest import ...``): the
ledger fixture class, the official examples, reading the warehouse back with
plain pyarrow."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import sqlalchemy as sa

EXAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "ubl-2.1" / "xml"
NS = "urn:oasis:names:specification:ubl:schema:xsd:{}-2"
_AUTO: Any = object()


def example(name: str) -> bytes:
    return (EXAMPLES / name).read_bytes()


ORDER = "UBL-Order-2.1-Example.xml"
ORDER_CHANGE = "UBL-OrderChange-2.1-Example.xml"
ORDER_CANCELLATION = "UBL-OrderCancellation-2.1-Example.xml"
INVOICE = "UBL-Invoice-2.1-Example.xml"


def with_id(doc: bytes, old: str, new: str, count: int = 1) -> bytes:
    """The document with its first ``<cbc:ID>old</cbc:ID>`` replaced."""
    a, b = f"<cbc:ID>{old}</cbc:ID>".encode(), f"<cbc:ID>{new}</cbc:ID>".encode()
    assert a in doc, old
    return doc.replace(a, b, count)


def gateway_facts(document: bytes, doc_type: str) -> str | None:
    """The facts the gateway stores for *document* at intake: its own parse,
    then :func:`ledger_contract.facts.for_ledger` (None when the gateway's parser
    refuses the document; the gateway would not accept it at all)."""
    from gateway.errors import GatewayError
    from gateway.intake.xmlsafe import IntakeLimits, parse_document
    from ledger_contract import facts

    try:
        root = parse_document(document, IntakeLimits())
    except GatewayError:
        return None
    return facts.for_ledger(root, doc_type)


class Ledger:
    """A tmp SQLite ledger; ``add`` records a document and its events, with
    the facts the gateway extracts at intake when ``facts`` is true (as a
    gateway of this version does), without when false (an older gateway)."""

    facts = True

    def __init__(self, url: str, *, facts: bool = True) -> None:
        from ledger_contract.tables import metadata

        self.url = url
        self.facts = facts
        self.engine = sa.create_engine(url)
        metadata.create_all(self.engine)
        self.at = 1_790_000_000_000

    def add(self, message_id: str, doc_type: str, document: bytes, *, partner: str = "ACME",
            status: str = "delivered", doc_id: str | None = None, facts: Any = _AUTO,
            facts_version: int | None = None) -> None:  # fmt: skip
        """*facts*: the stored facts JSON (default: what the gateway extracts, or
        None when this ledger has none); *facts_version* defaults to the current one."""
        from ledger_contract import facts as ledger_facts
        from ledger_contract.tables import documents, events

        if facts is _AUTO:
            facts = gateway_facts(document, doc_type) if self.facts else None
        if facts is not None and facts_version is None:
            facts_version = ledger_facts.VERSION
        self.at += 1000
        with self.engine.begin() as conn:
            conn.execute(documents.insert().values(
                message_id=message_id, partner=partner, doc_type=doc_type, doc_namespace=NS.format(doc_type),
                doc_id=doc_id or message_id, idempotency_key=f"{partner}:{message_id}", correlation_id=message_id,
                route="r", destination="queue://in", status=status, received_at=self.at, updated_at=self.at,
                document=document, facts=facts, facts_version=facts_version,
            ))  # fmt: skip
            conn.execute(events.insert().values(message_id=message_id, status="accepted", at=self.at))
            if status != "accepted":
                conn.execute(events.insert().values(message_id=message_id, status=status, at=self.at + 5))

    def event(self, message_id: str, status: str) -> None:
        from ledger_contract.tables import documents, events

        self.at += 1000
        with self.engine.begin() as conn:
            conn.execute(events.insert().values(message_id=message_id, status=status, at=self.at))
            conn.execute(documents.update().where(documents.c.message_id == message_id).values(status=status))


def table(settings_or_root, name: str, *, sort: tuple[str, ...] = ("message_id",)) -> list[dict]:
    """A warehouse table read with plain pyarrow (no Spark), rows sorted."""
    root = settings_or_root["warehouse"] if isinstance(settings_or_root, dict) else str(settings_or_root)
    path = Path(root) / name
    if not path.exists():
        return []
    dataset = ds.dataset(path, format="parquet", partitioning="hive")
    rows = dataset.to_table().to_pylist()
    for row in rows:
        if "issue_date" in row and row["issue_date"] is not None:
            row["issue_date"] = str(row["issue_date"])
    return sorted(rows, key=lambda r: tuple("" if r.get(k) is None else str(r.get(k)) for k in sort))


def snapshot(settings: dict) -> dict[str, list[dict]]:
    from spark_etl.warehouse import DIM_TABLES, FACT_TABLES

    sort = {"fact_order_line": ("message_id", "line_no"), "fact_invoice_line": ("message_id", "line_no"),
            "dim_partner": ("partner",), "dim_date": ("date_key",)}  # fmt: skip
    return {t: table(settings, t, sort=sort.get(t, ("message_id",))) for t in (*FACT_TABLES, *DIM_TABLES)}


def data_files(settings: dict, name: str) -> list[Path]:
    return sorted((Path(settings["warehouse"]) / name).rglob("*.parquet"))


def race_worker(url: str, slot: int, start_at: float, out) -> None:
    """A gateway process's nightly trigger firing at *start_at* (child process)."""
    from spark_etl.scheduler import NightlyLoad

    load = NightlyLoad({}, url, runner=lambda s, u, *, lease: time.sleep(0.3))
    time.sleep(max(0.0, start_at - time.time()))
    out.put(load.run_scheduled(slot))
