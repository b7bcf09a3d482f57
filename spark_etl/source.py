"""Reading the ledger: the load window and a PySpark Python Data Source.

A document belongs to the window ``(lo, hi]`` of ``b2b_ledger_events.seq``
when its *first* ``delivered`` or ``replied`` event is in that range: decided
by the append-only event log alone, so a document is loaded exactly once over
the incremental runs, and a full rebuild (``(0, max(seq)]``) loads the same
documents as all of them together. ``hi`` is read once at the start of a run;
the gateway serialises its store writers, so ``seq`` grows in commit order and
no event below ``hi`` appears after it was read.

``spark.read.format("b2b_ledger")`` (:class:`LedgerDataSource`, registered by
:func:`register`) reads one seq range per Spark partition, each task on its
own connection, and yields Arrow record batches. With ``mode=parsed`` (the
default) a task turns its documents into fact rows (:mod:`spark_etl.ubl`), so
the XML never enters the JVM: from their stored facts when the extractor
version (:data:`ledger_contract.facts.VERSION`) is current (the XML is not
even fetched), else from the XML. ``reparse=true`` parses every document from
its XML; ``mode=raw`` yields the XML itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import sqlalchemy as sa

from broker_core.sql import make_engine, relative_sqlite_path
from ledger_contract import facts as ledger_facts
from ledger_contract.tables import DELIVERED_STATUSES, LZ4_MAGIC, documents, events, unpack_xml
from ledger_contract.tables import outbound as outbound_table

from . import ubl
from .errors import SparkEtlError

__all__ = [
    "LedgerDataSource",
    "RAW_SCHEMA",
    "RelativeStorePathError",
    "Window",
    "plan_ranges",
    "register",
    "spark_schema",
    "window_counts",
    "window_query",
]

RAW_SCHEMA = pa.schema(
    [
        ("message_id", pa.string()),
        ("partner", pa.string()),
        ("doc_type", pa.string()),
        ("ledger_seq", pa.int64()),
        ("received_ms", pa.int64()),
        ("delivered_ms", pa.int64()),
        ("document", pa.string()),
    ]
)


@dataclass(frozen=True)
class Window:
    """Documents whose first delivered/replied event seq is in ``(lo, hi]``."""

    lo: int
    hi: int

    @property
    def empty(self) -> bool:
        return self.hi <= self.lo


def _first_delivery(lo: Any, hi: Any) -> sa.Select:
    """(message_id, seq, at) of the documents whose first delivered/replied event is in (lo, hi]."""
    e, p = events.alias("e"), events.alias("p")
    earlier = (
        sa.select(sa.literal(1))
        .where(p.c.message_id == e.c.message_id, p.c.status.in_(DELIVERED_STATUSES), p.c.seq < e.c.seq)
        .exists()
    )
    return sa.select(e.c.message_id, e.c.seq, e.c.at).where(
        e.c.seq > lo, e.c.seq <= hi, e.c.status.in_(DELIVERED_STATUSES), ~earlier
    )


def window_query(lo: int, hi: int, *, content: str = "facts", outbound: bool = False) -> sa.Select:
    """The window's documents by seq: ``(message_id, partner, doc_type, seq,
    received_at, delivered_at, ...)`` and, by *content*:

    * ``facts``: ``document, facts``: the facts when they are current (then
      no document), else the document when its type is loaded (else neither);
    * ``reparse``: ``document, facts``: the document of every loaded type, no facts;
    * ``raw``: ``document``: every document as it is;

    then ``direction``: ``inbound`` for the ledger's documents and, with *outbound*
    (the database has the gateway's deliveries), ``outbound`` for the deliveries
    delivered in the window (their partner the receiving one, their facts never stored).
    """
    first = _first_delivery(lo, hi).subquery("f")
    cols: list[Any] = [documents.c.message_id, documents.c.partner, documents.c.doc_type, first.c.seq,
                       documents.c.received_at, first.c.at]  # fmt: skip
    loaded = documents.c.doc_type.in_(list(ledger_facts.LOADED_TYPES))
    null = sa.null()
    if content == "raw":
        cols.append(documents.c.document)
    elif content == "reparse":
        cols += [sa.case((loaded, documents.c.document), else_=null), null]
    elif content == "facts":
        current = sa.and_(documents.c.facts_version == ledger_facts.VERSION, documents.c.facts.is_not(None))
        cols += [sa.case((current, null), (loaded, documents.c.document), else_=null),
                 sa.case((current, documents.c.facts), else_=null)]  # fmt: skip
    else:
        raise ValueError(f"unknown content {content!r}")
    inbound = sa.select(*cols, sa.literal("inbound").label("direction")).join_from(
        first, documents, documents.c.message_id == first.c.message_id
    )
    if not outbound:
        return inbound.order_by(first.c.seq)
    out_cols: list[Any] = [outbound_table.c.message_id, outbound_table.c.partner, outbound_table.c.doc_type, first.c.seq,
                           outbound_table.c.created_at, first.c.at]  # fmt: skip
    if content == "raw":
        out_cols.append(outbound_table.c.document)
    else:
        out_loaded = outbound_table.c.doc_type.in_(list(ledger_facts.LOADED_TYPES))
        out_cols += [sa.case((out_loaded, outbound_table.c.document), else_=null), null]
    sent = (
        sa.select(*out_cols, sa.literal("outbound").label("direction"))
        .join_from(first, outbound_table, outbound_table.c.message_id == first.c.message_id)
        .where(outbound_table.c.doc_type.is_not(None))  # a handler's delivery of no known type
    )
    both = sa.union_all(inbound, sent).subquery("w")
    return sa.select(*both.c).order_by(both.c.seq)


def has_outbound(conn: sa.Connection) -> bool:
    """Whether the database holds the gateway's deliveries (the outbound documents)."""
    return sa.inspect(conn).has_table(outbound_table.name)


def window_counts(conn: sa.Connection, window: Window) -> dict[str, int]:
    """The ledger's side of reconciliation: documents in the window by doc_type (inbound and outbound)."""
    if window.empty:
        return {}
    out: dict[str, int] = {}
    tables = [documents, outbound_table] if has_outbound(conn) else [documents]
    for table in tables:
        first = _first_delivery(window.lo, window.hi).subquery("f")
        q = (
            sa.select(table.c.doc_type, sa.func.count())
            .select_from(first.join(table, table.c.message_id == first.c.message_id))
            .where(table.c.doc_type.is_not(None))
            .group_by(table.c.doc_type)
        )
        for doc_type, n in conn.execute(q):
            out[doc_type] = out.get(doc_type, 0) + int(n)
    return out


def window_size(conn: sa.Connection, window: Window) -> int:
    """How many documents the window has (the event log alone: cheap, unlike
    :func:`window_counts`, whose document types are on the wide ledger rows)."""
    if window.empty:
        return 0
    first = _first_delivery(window.lo, window.hi).subquery("f")
    return int(conn.execute(sa.select(sa.func.count()).select_from(first)).scalar_one())


def max_seq(conn: sa.Connection) -> int:
    return int(conn.execute(sa.select(sa.func.coalesce(sa.func.max(events.c.seq), 0))).scalar_one())


def seq_at(conn: sa.Connection, epoch_ms: int) -> int:
    """The window lower bound for "delivered since *epoch_ms*": the last seq before it."""
    first = conn.execute(sa.select(sa.func.min(events.c.seq)).where(events.c.at >= epoch_ms)).scalar_one()
    if first is None:
        return max_seq(conn)
    return int(first) - 1


def plan_ranges(lo: int, hi: int, n: int) -> list[tuple[int, int]]:
    """Split (lo, hi] into at most *n* contiguous seq ranges."""
    if hi <= lo:
        return []
    n = max(1, min(n, hi - lo))
    step = (hi - lo) / n
    bounds = [lo + round(step * i) for i in range(n)] + [hi]
    return [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def spark_schema(schema: pa.Schema):
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def _rows(url: str, lo: int, hi: int, *, content: str = "facts", fetch: int = 500) -> Iterator[tuple]:
    """The window's rows (:func:`window_query`) through the raw DB-API
    cursor: SQLAlchemy Core wraps every value of every row, which costs
    several times the driver's own tuples. PostgreSQL streams with a
    server-side cursor."""
    engine = make_engine(url, read_only=True)
    try:
        with engine.connect() as conn:
            query = window_query(int(lo), int(hi), content=content, outbound=has_outbound(conn))
            sql = str(query.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
            raw = conn.connection.driver_connection
            if engine.dialect.name == "postgresql":
                cur = raw.cursor(name=f"b2b_etl_{lo}_{hi}")
            else:
                cur = raw.cursor()
            try:
                cur.execute(sql)
                while True:
                    rows = cur.fetchmany(fetch)
                    if not rows:
                        break
                    for row in rows:  # the document (column 6) as XML: the ledger may store it compressed
                        document = row[6]
                        if document is not None and bytes(document[:4]) == LZ4_MAGIC:
                            row = (*row[:6], unpack_xml(document), *row[7:])
                        yield row
            finally:
                cur.close()
            conn.rollback()
    finally:
        engine.dispose()


def _documents(url: str, message_ids: list[str]) -> dict[str, bytes]:
    """The stored XML of these documents (when their facts would not read)."""
    engine = make_engine(url, read_only=True)
    try:
        out: dict[str, bytes] = {}
        with engine.connect() as conn:
            for i in range(0, len(message_ids), 500):
                chunk = message_ids[i : i + 500]
                q = sa.select(documents.c.message_id, documents.c.document).where(documents.c.message_id.in_(chunk))
                out.update({m: unpack_xml(d) for m, d in conn.execute(q)})
            conn.rollback()
        return out
    finally:
        engine.dispose()


def read_range(
    url: str, lo: int, hi: int, *, mode: str = "parsed", batch_size: int = 1000, reparse: bool = False
) -> Iterator[pa.RecordBatch]:
    """The documents of the window (lo, hi] as Arrow record batches."""
    if mode == "parsed":
        rows = _rows(url, lo, hi, content="reparse" if reparse else "facts")
        yield from ubl.batches(rows, batch_size, documents=lambda ids: _documents(url, ids))
        return
    rows = _rows(url, lo, hi, content="raw")
    buf: list[tuple] = []

    def flush() -> pa.RecordBatch:
        cols = list(zip(*buf, strict=False))
        arrays = [pa.array(cols[i], RAW_SCHEMA.field(i).type) for i in range(6)]
        arrays.append(pa.array([bytes(d).decode("utf-8") for d in cols[6]], pa.string()))
        buf.clear()
        return pa.RecordBatch.from_arrays(arrays, schema=RAW_SCHEMA)

    for row in rows:
        buf.append(row)
        if len(buf) >= batch_size:
            yield flush()
    if buf:
        yield flush()


try:  # the Data Source API needs PySpark; the module stays importable without it
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
except ImportError:  # pragma: no cover
    DataSource = DataSourceReader = object  # type: ignore[misc,assignment]
    InputPartition = object  # type: ignore[misc,assignment]


class SeqRange(InputPartition):  # type: ignore[misc]
    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi


class LedgerDataSource(DataSource):  # type: ignore[misc]
    """``spark.read.format("b2b_ledger").option("url", ...).option("ranges", json).load()``

    Options: ``url`` (the store URL; a SQLite file by its absolute path),
    ``ranges`` (JSON list of ``[lo, hi]`` seq ranges, one partition each),
    ``mode`` (``parsed`` or ``raw``),
    ``reparse`` (``true``: parse every document's XML, ignore stored facts),
    ``batch_size`` (documents per Arrow batch, 1000).
    """

    @classmethod
    def name(cls) -> str:
        return "b2b_ledger"

    def schema(self):
        return spark_schema(RAW_SCHEMA if self.options.get("mode", "parsed") == "raw" else ubl.DOC_SCHEMA)

    def reader(self, schema):
        return LedgerReader(dict(self.options))


class RelativeStorePathError(SparkEtlError, ValueError):
    """Raised when the reader is planned (on the driver) with a SQLite URL
    whose path is relative: every executor would resolve it against its own
    working directory and open another file, or none."""

    def __init__(self, url: str, path: str) -> None:
        super().__init__(
            f"the store URL {url!r} names the SQLite file {path!r} relative to the current directory, which "
            f"Spark's executors do not share: give the b2b_ledger reader an absolute path (four slashes: "
            f"'sqlite:////srv/b2bgw/var/b2bgw.db'); b2bgw etl run makes store.url and --db-url absolute itself"
        )
        self.url, self.path = url, path


class LedgerReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, options: dict[str, str]) -> None:
        self.url = options["url"]
        relative = relative_sqlite_path(self.url)
        if relative is not None:
            raise RelativeStorePathError(self.url, relative)
        self.ranges = [tuple(r) for r in json.loads(options.get("ranges", "[]"))]
        self.mode = options.get("mode", "parsed")
        self.reparse = options.get("reparse", "false").lower() == "true"
        self.batch_size = int(options.get("batch_size", "1000"))

    def partitions(self):
        return [SeqRange(lo, hi) for lo, hi in self.ranges] or [SeqRange(0, 0)]

    def read(self, partition):
        if partition.hi <= partition.lo:
            return iter(())
        return read_range(
            self.url, partition.lo, partition.hi, mode=self.mode, batch_size=self.batch_size, reparse=self.reparse
        )


def register(spark) -> None:
    spark.dataSource.register(LedgerDataSource)
