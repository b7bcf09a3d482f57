"""The ledger and the warehouse load as operators read them (read-only, bounded work per request).

* :func:`search` pages through documents newest first by ``(received_at, message_id)`` (keyset). A search
  by message id, document id or correlation id uses that column's index; any other filter (partner, type,
  status, route, time range) walks the ``received_at`` index at most :data:`SCAN_LIMIT` rows per page and
  says where to continue, so a rare partner's page costs no more than a common one's.
* :func:`lineage` tells whether the nightly load took a document into the warehouse: the first
  delivered/replied event of the document has a ledger ``seq``; the succeeded ``etl_runs`` row whose window
  ``(seq_from, seq_to]`` holds it loaded it, unless ``etl_quarantine`` names the document. Its rows are then
  read from the Parquet files of its issue date's partition (with pyarrow, when installed).
* :class:`Counts` keeps the documents by partner, route and status over the last hour and day, read at most
  every ``ttl`` seconds in the background: a page never waits for that count.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from ledger_contract.tables import DELIVERED_STATUSES, STATUSES, documents, events, unpack_xml

__all__ = ["Counts", "LedgerQuery", "lineage", "search"]

log = logging.getLogger(__name__)

SCAN_LIMIT = 5000
_SUMMARY = [
    documents.c.message_id,
    documents.c.partner,
    documents.c.doc_type,
    documents.c.doc_id,
    documents.c.correlation_id,
    documents.c.route,
    documents.c.destination,
    documents.c.status,
    documents.c.received_at,
    documents.c.updated_at,
    documents.c.reply_type,
    documents.c.error,
]


@dataclass
class LedgerQuery:
    partner: str | None = None
    doc_type: str | None = None
    status: str | None = None
    doc_id: str | None = None
    correlation_id: str | None = None
    message_id: str | None = None
    route: str | None = None
    since: int | None = None  # epoch ms, inclusive
    until: int | None = None  # epoch ms, exclusive
    cursor: tuple[int, str] | None = None  # (received_at, message_id) of the last row seen
    limit: int = 50


@dataclass
class SearchPage:
    documents: list[dict[str, Any]]
    cursor: str | None
    scanned: int = 0


def _summary(row: Any) -> dict[str, Any]:
    return {c.name: row._mapping[c.name] for c in _SUMMARY}


def encode_cursor(received_at: int, message_id: str) -> str:
    return f"{received_at}~{message_id}"


def decode_cursor(text: str | None) -> tuple[int, str] | None:
    if not text:
        return None
    at, sep, message_id = text.partition("~")
    if not sep or not at.isdigit() or not message_id or len(text) > 200:
        raise ValueError("cursor is not one a search page gave; search again without it")
    return int(at), message_id


def search(engine: sa.Engine, q: LedgerQuery) -> SearchPage:
    """One page of documents matching *q*, newest first (see the module docstring)."""
    filters = []
    for column, value in (
        (documents.c.partner, q.partner),
        (documents.c.doc_type, q.doc_type),
        (documents.c.status, q.status),
        (documents.c.route, q.route),
    ):
        if value:
            filters.append(column == value)
    exact = [
        (documents.c.message_id, q.message_id),
        (documents.c.doc_id, q.doc_id),
        (documents.c.correlation_id, q.correlation_id),
    ]
    keyed = [column == value for column, value in exact if value]
    order = (documents.c.received_at.desc(), documents.c.message_id.desc())
    window = []
    if q.since is not None:
        window.append(documents.c.received_at >= q.since)
    if q.until is not None:
        window.append(documents.c.received_at < q.until)
    if q.cursor is not None:
        window.append(sa.tuple_(documents.c.received_at, documents.c.message_id) < sa.tuple_(*q.cursor))
    with engine.connect() as conn:
        if keyed:  # an index names the few rows: no scan bound needed beyond the page
            rows = conn.execute(
                sa.select(*_SUMMARY).where(*keyed, *filters, *window).order_by(*order).limit(q.limit + 1)
            ).all()
            conn.rollback()
            more = len(rows) > q.limit
            rows = rows[: q.limit]
            cursor = encode_cursor(rows[-1].received_at, rows[-1].message_id) if more and rows else None
            return SearchPage([_summary(r) for r in rows], cursor, len(rows))
        # the next SCAN_LIMIT rows by time, then the filters on those alone
        span = (
            sa.select(documents.c.received_at, documents.c.message_id)
            .where(*window)
            .order_by(*order)
            .limit(SCAN_LIMIT)
            .subquery("span")
        )
        last = conn.execute(
            sa.select(span.c.received_at, span.c.message_id, sa.func.count().over())
            .order_by(span.c.received_at, span.c.message_id)
            .limit(1)
        ).first()
        rows = conn.execute(
            sa.select(*_SUMMARY)
            .join(
                span,
                sa.and_(span.c.received_at == documents.c.received_at, span.c.message_id == documents.c.message_id),
            )
            .where(*filters)
            .order_by(*order)
            .limit(q.limit + 1)
        ).all()
        conn.rollback()
    scanned = last[2] if last is not None else 0
    if len(rows) > q.limit:
        rows = rows[: q.limit]
        return SearchPage(
            [_summary(r) for r in rows], encode_cursor(rows[-1].received_at, rows[-1].message_id), scanned
        )
    if scanned >= SCAN_LIMIT and last is not None:  # looked at a whole span: more may match further back
        return SearchPage([_summary(r) for r in rows], encode_cursor(last[0], last[1]), scanned)
    return SearchPage([_summary(r) for r in rows], None, scanned)


def document(engine: sa.Engine, message_id: str) -> dict[str, Any] | None:
    """Everything the ledger holds of one document: the row, its events (with their seqs), request and reply."""
    with engine.connect() as conn:
        row = conn.execute(sa.select(documents).where(documents.c.message_id == message_id)).first()
        if row is None:
            conn.rollback()
            return None
        history = [
            {"seq": r.seq, "status": r.status, "at": r.at}
            for r in conn.execute(
                sa.select(events.c.seq, events.c.status, events.c.at)
                .where(events.c.message_id == message_id)
                .order_by(events.c.seq)
                .limit(1000)
            )
        ]
        conn.rollback()
    out = _summary(row)
    out.update(
        {
            "doc_namespace": row.doc_namespace,
            "idempotency_key": row.idempotency_key,
            "auth": row.auth,
            "receipt": json.loads(row.receipt) if row.receipt else None,
            "document": unpack_xml(row.document),
            "reply": unpack_xml(row.reply),
            "history": history,
            "facts": json.loads(row.facts) if row.facts else None,
        }
    )
    return out


# --------------------------------------------------------------------------- the warehouse load


def _etl_tables(engine: sa.Engine) -> Any:
    """spark_etl.state's tables, or None when the load never ran on this store (or is not installed)."""
    try:
        from spark_etl import state
    except ImportError:
        return None
    try:
        names = set(sa.inspect(engine).get_table_names())
    except sa.exc.SQLAlchemyError:
        return None
    return state if {"etl_runs", "etl_quarantine"} <= names else None


def etl_runs(engine: sa.Engine, limit: int = 20) -> list[dict[str, Any]]:
    """The latest runs of the warehouse load, newest first."""
    state = _etl_tables(engine)
    if state is None:
        return []
    runs = state.runs
    with engine.connect() as conn:
        rows = conn.execute(sa.select(runs).order_by(runs.c.run_id.desc()).limit(limit)).all()
        conn.rollback()
    out = []
    for r in rows:
        item = {k: v for k, v in r._mapping.items() if k not in ("manifest", "stats")}
        item["duration_s"] = (r.finished_at - r.started_at) / 1000 if r.finished_at else None
        out.append(item)
    return out


def lineage(engine: sa.Engine, doc: dict[str, Any], warehouse: str | None) -> dict[str, Any]:
    """Whether (and by which run) the warehouse load took *doc* (a :func:`document`), and its rows."""
    from ledger_contract.facts import LOADED_TYPES

    out: dict[str, Any] = {
        "loaded_type": doc["doc_type"] in LOADED_TYPES,
        "state": "not-loaded-type",
        "run": None,
        "quarantine": None,
        "rows": {},
    }
    if not out["loaded_type"]:
        return out
    first = next((e["seq"] for e in doc["history"] if e["status"] in DELIVERED_STATUSES), None)
    if first is None:
        out["state"] = "waiting-for-delivery"
        return out
    state = _etl_tables(engine)
    if state is None:
        out["state"] = "no-load-yet"
        return out
    with engine.connect() as conn:
        run = conn.execute(
            sa.select(state.runs)
            .where(state.runs.c.status == "succeeded", state.runs.c.seq_from < first, state.runs.c.seq_to >= first)
            .order_by(state.runs.c.run_id)
            .limit(1)
        ).first()
        quarantined = conn.execute(
            sa.select(state.quarantine).where(state.quarantine.c.message_id == doc["message_id"])
        ).first()
        conn.rollback()
    if quarantined is not None:
        out["state"] = "quarantined"
        out["quarantine"] = {k: v for k, v in quarantined._mapping.items()}
        return out
    if run is None:
        out["state"] = "waiting-for-load"
        return out
    out["state"] = "loaded"
    out["run"] = {"run_id": run.run_id, "mode": run.mode, "finished_at": run.finished_at}
    if warehouse:
        out["rows"] = warehouse_rows(warehouse, doc)
    return out


_FACT_TABLES = ("fact_order", "fact_order_line", "fact_order_change", "fact_invoice", "fact_invoice_line")
_MAX_ROWS = 200


def _issue_date(doc: dict[str, Any]) -> str | None:
    facts = doc.get("facts") or {}
    header = facts.get("header") if isinstance(facts, dict) else None
    found = (header or {}).get("issue_date") if isinstance(header, dict) else None
    found = found or (facts.get("issue_date") if isinstance(facts, dict) else None)
    if found:
        return str(found)[:10]
    try:
        from lxml import etree

        parser = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False)
        root = etree.fromstring(doc["document"], parser)
        for child in root:
            if isinstance(child.tag, str) and child.tag.endswith("}IssueDate"):
                return (child.text or "").strip()[:10] or None
    except Exception:  # no date: no rows shown
        return None
    return None


def warehouse_rows(warehouse: str, doc: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The fact rows of *doc* in a local warehouse: one partition per table (its issue date), at most
    :data:`_MAX_ROWS` rows each; empty when pyarrow is not installed or the warehouse is not local."""
    day = _issue_date(doc)
    if not day or "://" in warehouse and not warehouse.startswith("file://"):
        return {}
    try:
        _dt.date.fromisoformat(day)
        import pyarrow.compute as pc
        import pyarrow.parquet as pq
    except (ImportError, ValueError):
        return {}
    root = warehouse[len("file://") :] if warehouse.startswith("file://") else warehouse
    out: dict[str, list[dict[str, Any]]] = {}
    for table in _FACT_TABLES:
        folder = os.path.join(root, table, f"issue_date={day}")
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".parquet") or name.startswith(("_", ".")):
                continue
            try:
                data = pq.read_table(os.path.join(folder, name), filters=[("message_id", "=", doc["message_id"])])
            except Exception as exc:  # a file being replaced by a load, say
                log.info("could not read %s: %s", name, exc)
                continue
            if data.num_rows:
                data = data.filter(pc.equal(data["message_id"], doc["message_id"]))
                rows = out.setdefault(table, [])
                rows.extend(data.slice(0, _MAX_ROWS - len(rows)).to_pylist())
    return out


# --------------------------------------------------------------------------- counts over the last hour and day


@dataclass
class CountsSnapshot:
    taken_at: float = 0.0
    #: {"hour"|"day": {"partner"|"route": {name: {status: n}}}}
    counts: dict[str, dict[str, dict[str, dict[str, int]]]] = field(default_factory=dict)


class Counts:
    """Documents by partner and by route and status over the last hour and day (cached, see module doc)."""

    def __init__(self, engine: sa.Engine, ttl: float = 30.0) -> None:
        self.engine = engine
        self.ttl = ttl
        self._snapshot: CountsSnapshot | None = None
        self._lock = threading.Lock()
        self._refreshing = False

    def get(self) -> CountsSnapshot:
        snapshot = self._snapshot
        if snapshot is None:
            return self._refresh()
        if time.monotonic() - snapshot.taken_at > self.ttl:
            with self._lock:
                start = not self._refreshing
                self._refreshing = True
            if start:
                threading.Thread(target=self._refresh, name="b2bgw-admin-counts", daemon=True).start()
        return snapshot

    def _refresh(self) -> CountsSnapshot:
        try:
            now = int(time.time() * 1000)
            out: dict[str, dict[str, dict[str, dict[str, int]]]] = {}
            with self.engine.connect() as conn:
                for span, ms in (("hour", 3_600_000), ("day", 86_400_000)):
                    rows = conn.execute(
                        sa.select(documents.c.partner, documents.c.route, documents.c.status, sa.func.count())
                        .where(documents.c.received_at >= now - ms)
                        .group_by(documents.c.partner, documents.c.route, documents.c.status)
                    ).all()
                    by: dict[str, dict[str, dict[str, int]]] = {"partner": {}, "route": {}}
                    for partner, route, status, n in rows:
                        for kind, name in (("partner", partner), ("route", route)):
                            slot = by[kind].setdefault(name, dict.fromkeys(STATUSES, 0))
                            slot[status] = slot.get(status, 0) + n
                    out[span] = by
                conn.rollback()
            snapshot = CountsSnapshot(time.monotonic(), out)
            self._snapshot = snapshot
            return snapshot
        finally:
            with self._lock:
                self._refreshing = False
