"""UBL 2.1 documents to warehouse rows, as Arrow record batches (no Spark here).

Every document of a loaded type is read by ONE extractor,
:mod:`ledger_contract.facts` (pure lxml), wherever it runs:

* at intake, by the gateway, on the tree it has just validated; it stores the
  result in ``b2b_ledger.facts`` (JSON) with the extractor's version.
  :func:`from_facts` turns the facts of many documents into one record batch
  of :data:`DOC_SCHEMA` with a single ``pyarrow.json`` read (C++), a few
  Arrow casts and no per-document Python beyond joining the strings;
* here, when a document has no facts or facts of an older extractor version
  (or when a rebuild asks to reparse everything): :func:`extract` parses the
  stored XML with a hardened parser and calls the same extractor;
  :class:`BatchBuilder` gathers those :class:`Doc` objects into batches.

Both give the same rows (the tests check it, document by document and
warehouse against warehouse). :func:`batches` mixes the two for a stream of
ledger rows. Amounts and quantities become ``decimal(18,6)`` with one Arrow
cast per batch (a value that does not fit, or is not a number, sends its
document to quarantine), dates ``date32``.
"""

from __future__ import annotations

import datetime as _dt
import io
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json
from lxml import etree

from ledger_contract import facts
from ledger_contract.facts import KINDS, LOADED_TYPES, BadDocumentError

from .errors import SparkEtlError

log = logging.getLogger(__name__)

__all__ = [
    "AMOUNT_TYPE",
    "BatchBuilder",
    "DOC_SCHEMA",
    "Doc",
    "KINDS",
    "LINE_TYPE",
    "LOADED_TYPES",
    "batches",
    "extract",
    "from_facts",
]

#: Amounts, prices and quantities: 12 integer digits, 6 decimals.
AMOUNT_TYPE = pa.decimal128(18, 6)

LINE_TYPE = pa.struct(
    [
        ("line_no", pa.int32()),  # position in the document, from 1
        ("line_id", pa.string()),
        ("line_status", pa.string()),  # OrderChange: LineStatusCode (Added, Revised, Cancelled...)
        ("ref_line_id", pa.string()),  # Invoice: OrderLineReference/LineID
        ("item_id", pa.string()),  # SellersItemIdentification, else Buyers..., else Standard...
        ("item_std_id", pa.string()),  # StandardItemIdentification (GTIN...)
        ("item_name", pa.string()),  # Item/Name, else Item/Description
        ("quantity", AMOUNT_TYPE),
        ("unit_code", pa.string()),
        ("price_amount", AMOUNT_TYPE),
        ("line_amount", AMOUNT_TYPE),  # LineExtensionAmount
        ("tax_amount", AMOUNT_TYPE),  # line TaxTotal/TaxAmount (Invoice) or TotalTaxAmount (Order)
        ("currency", pa.string()),  # currencyID of the line amount
    ]
)
_LINE_FIELDS = [f.name for f in LINE_TYPE]

_HEADER = [
    ("message_id", pa.string()),
    ("partner", pa.string()),
    ("doc_type", pa.string()),  # as recorded in the ledger
    ("ledger_seq", pa.int64()),  # seq of the document's first delivered/replied event
    ("received_ms", pa.int64()),
    ("delivered_ms", pa.int64()),
    ("direction", pa.string()),  # inbound (the ledger's) | outbound (a delivery to the partner)
    ("outcome", pa.string()),  # ok | quarantined | skipped
    ("reason", pa.string()),  # why quarantined or skipped
    ("kind", pa.string()),  # order | change | cancellation | invoice
    ("doc_id", pa.string()),
    ("order_ref", pa.string()),  # OrderReference/ID
    ("type_code", pa.string()),  # InvoiceTypeCode
    ("sequence_number", pa.int64()),  # OrderChange SequenceNumberID (numeric)
    ("party_a_id", pa.string()),  # buyer (Order*), supplier (Invoice)
    ("party_a_name", pa.string()),
    ("party_b_id", pa.string()),  # seller (Order*), customer (Invoice)
    ("party_b_name", pa.string()),
    ("issue_date", pa.date32()),
    ("currency", pa.string()),
    ("note", pa.string()),  # CancellationNote
    ("line_extension_amount", AMOUNT_TYPE),
    ("tax_amount", AMOUNT_TYPE),
    ("allowance_total_amount", AMOUNT_TYPE),
    ("charge_total_amount", AMOUNT_TYPE),
    ("tax_exclusive_amount", AMOUNT_TYPE),
    ("tax_inclusive_amount", AMOUNT_TYPE),
    ("prepaid_amount", AMOUNT_TYPE),
    ("payable_amount", AMOUNT_TYPE),
    # Control totals for reconciliation, computed here with Python's Decimal
    # (independently of the Arrow casts, the Spark transforms and the write).
    ("ctl_lines", pa.int32()),
    ("ctl_line_amount", AMOUNT_TYPE),
    ("ctl_payable_amount", AMOUNT_TYPE),
]
_HEADER_FIELDS = [name for name, _ in _HEADER]
#: One row per ledger document; ``lines`` holds its order or invoice lines.
DOC_SCHEMA = pa.schema([*_HEADER, ("lines", pa.list_(LINE_TYPE))])


_local = threading.local()


def _parser() -> etree.XMLParser:
    """A per-thread hardened parser: no DTD, no entities, no network; the
    ledger stores documents as UTF-8, so that encoding is imposed."""
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = etree.XMLParser(
            encoding="utf-8",
            resolve_entities=False,
            no_network=True,
            load_dtd=False,
            huge_tree=False,
            remove_blank_text=True,
            remove_comments=True,
            remove_pis=True,
        )
        _local.parser = parser
    return parser


@dataclass(slots=True)
class Doc:
    """One ledger document, extracted."""

    message_id: str
    partner: str
    doc_type: str
    ledger_seq: int
    received_ms: int
    delivered_ms: int
    direction: str = "inbound"
    outcome: str = "ok"
    reason: str | None = None
    header: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, list[Any]] = field(default_factory=dict)  # LINE_TYPE field -> one value per line
    n_lines: int = 0


def extract(
    document: bytes,
    *,
    message_id: str,
    partner: str,
    doc_type: str,
    ledger_seq: int = 0,
    received_ms: int = 0,
    delivered_ms: int = 0,
    direction: str = "inbound",
) -> Doc:
    """One ledger document to a :class:`Doc` (``outcome`` ok, skipped or
    quarantined with a reason). Never raises for bad content."""
    doc = Doc(message_id, partner, doc_type, ledger_seq, received_ms, delivered_ms, direction)
    if doc_type not in KINDS:
        doc.outcome, doc.reason = "skipped", f"{doc_type} is not loaded into the warehouse"
        return doc
    try:
        try:
            root = etree.fromstring(document, _parser())
        except etree.XMLSyntaxError as exc:
            raise BadDocumentError(f"not well-formed XML: {str(exc)[:200]}") from None
        header, n, lines = facts.extract(root, doc_type)
        header["issue_date"] = _dt.date.fromisoformat(header["issue_date"])
        doc.header, doc.lines, doc.n_lines = header, lines, n
    except BadDocumentError as exc:
        doc.outcome, doc.reason = "quarantined", str(exc)
    except (ValueError, TypeError, AttributeError) as exc:  # anything else the content provokes
        doc.outcome, doc.reason = "quarantined", f"{type(exc).__name__}: {str(exc)[:200]}"
    return doc


class BatchBuilder:
    """Accumulates :class:`Doc` objects into Arrow record batches of :data:`DOC_SCHEMA`.

    The extractor has checked every decimal against ``decimal(18,6)``, so
    the casts here cannot fail for a document that came out ``ok``."""

    def __init__(self) -> None:
        self.docs: list[Doc] = []

    def __len__(self) -> int:
        return len(self.docs)

    def add(self, doc: Doc) -> None:
        self.docs.append(doc)

    def flush(self) -> pa.RecordBatch:
        docs, self.docs = self.docs, []
        return _build(docs)


def _build(docs: list[Doc]) -> pa.RecordBatch:
    n = len(docs)
    cols: dict[str, list[Any]] = {name: [None] * n for name in _HEADER_FIELDS}
    line_cols: dict[str, list[Any]] = {name: [] for name in _LINE_FIELDS}
    offsets = [0] * (n + 1)
    pos = 0
    for i, doc in enumerate(docs):
        cols["message_id"][i] = doc.message_id
        cols["partner"][i] = doc.partner
        cols["doc_type"][i] = doc.doc_type
        cols["ledger_seq"][i] = doc.ledger_seq
        cols["received_ms"][i] = doc.received_ms
        cols["delivered_ms"][i] = doc.delivered_ms
        cols["direction"][i] = doc.direction
        cols["outcome"][i] = doc.outcome
        cols["reason"][i] = doc.reason
        if doc.outcome == "ok":
            for key, value in doc.header.items():
                cols[key][i] = value
            if doc.n_lines:
                for key, values in doc.lines.items():
                    line_cols[key].extend(values)
                pos += doc.n_lines
        offsets[i + 1] = pos
    arrays = []
    for name, typ in _HEADER:
        values = cols[name]
        if typ == AMOUNT_TYPE:
            arrays.append(pa.array(values, pa.string()).cast(AMOUNT_TYPE))
        else:
            arrays.append(pa.array(values, typ))
    children = []
    for f in LINE_TYPE:
        values = line_cols[f.name]
        if f.type == AMOUNT_TYPE:
            children.append(pa.array(values, pa.string()).cast(AMOUNT_TYPE))
        else:
            children.append(pa.array(values, f.type))
    struct = pa.StructArray.from_arrays(children, fields=list(LINE_TYPE))
    arrays.append(pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), struct))
    return pa.RecordBatch.from_arrays(arrays, schema=DOC_SCHEMA)


# --------------------------------------------------------------------------- facts extracted at the edge

_EXTRACTED = _HEADER[9:]  # kind ... ctl_payable_amount: what the facts hold
assert [name for name, _ in _EXTRACTED] == list(facts.HEADER_FIELDS)
assert _LINE_FIELDS == list(facts.LINE_FIELDS)


def _json_type(t: pa.DataType) -> pa.DataType:
    return pa.string() if t in (AMOUNT_TYPE, pa.date32()) else t  # decimals and dates travel as strings


#: How ``pyarrow.json`` reads ``b2b_ledger.facts`` (see :mod:`ledger_contract.facts`): lines column-oriented.
FACTS_SCHEMA = pa.schema(
    [(name, _json_type(t)) for name, t in _EXTRACTED]
    + [("lines", pa.struct([(f.name, pa.list_(_json_type(f.type))) for f in LINE_TYPE]))]
)
_FACTS_PARSE = pa_json.ParseOptions(explicit_schema=FACTS_SCHEMA, unexpected_field_behavior="error")


class BadFactsError(SparkEtlError, ValueError):
    """Stored facts that do not read as :data:`FACTS_SCHEMA` says."""


_FACTS_ERRORS = (BadFactsError, pa.ArrowException, ValueError, TypeError)


def from_facts(rows: list[tuple]) -> pa.RecordBatch:
    """``(message_id, partner, doc_type, ledger_seq, received_ms, delivered_ms,
    facts[, direction])`` tuples (facts: the JSON the gateway stored; direction
    inbound unless given) to one record batch of :data:`DOC_SCHEMA`, every
    document ``ok``. Raises :class:`BadFactsError` (or an Arrow error) when a
    facts value does not read or cast."""
    n = len(rows)
    mid, partner, doc_type, seq, received, delivered, fact = zip(*(r[:7] for r in rows), strict=False)
    direction = [r[7] if len(r) > 7 else "inbound" for r in rows]
    data = "\n".join(fact).encode("utf-8")
    table = pa_json.read_json(
        io.BytesIO(data),
        read_options=pa_json.ReadOptions(use_threads=False, block_size=len(data) + 1),
        parse_options=_FACTS_PARSE,
    )
    if table.num_rows != n:
        raise BadFactsError(f"{n} facts values gave {table.num_rows} rows")
    arrays = [
        pa.array(mid, pa.string()), pa.array(partner, pa.string()), pa.array(doc_type, pa.string()),
        pa.array(seq, pa.int64()), pa.array(received, pa.int64()), pa.array(delivered, pa.int64()),
        pa.array(direction, pa.string()), pa.array(["ok"] * n, pa.string()), pa.nulls(n, pa.string()),
    ]  # fmt: skip
    for name, typ in _EXTRACTED:
        col = table.column(name).combine_chunks()
        arrays.append(col if col.type == typ else col.cast(typ))
    lines = table.column("lines").combine_chunks().flatten()  # struct of lists -> the lists (nulls kept)
    lengths = pc.fill_null(pc.list_value_length(lines[_LINE_FIELDS.index("line_id")]), 0)
    children = []
    for f, values in zip(LINE_TYPE, lines, strict=False):
        if not pc.all(pc.equal(pc.fill_null(pc.list_value_length(values), 0), lengths)).as_py():
            raise BadFactsError(f"the line column {f.name} does not have one value per line")
        flat = values.flatten()
        children.append(flat if flat.type == f.type else flat.cast(f.type))
    offsets = pa.array(pc.cumulative_sum(pa.concat_arrays([pa.array([0], pa.int64()), lengths.cast(pa.int64())])),
                       pa.int64()).cast(pa.int32())  # fmt: skip
    struct = pa.StructArray.from_arrays(children, fields=list(LINE_TYPE))
    arrays.append(pa.ListArray.from_arrays(offsets, struct))
    return pa.RecordBatch.from_arrays(arrays, schema=DOC_SCHEMA)


def batches(
    rows: Iterable[tuple],
    batch_size: int = 1000,
    *,
    documents: Callable[[list[str]], dict[str, bytes]] | None = None,
) -> Iterator[pa.RecordBatch]:
    """Ledger rows ``(message_id, partner, doc_type, ledger_seq, received_ms,
    delivered_ms, document, facts[, direction])`` to record batches of at most
    *batch_size* documents. A row with *facts* (current, as the reader
    selected them) is read from them, in bulk; any other row is parsed from
    its *document* (None for a type that is not loaded: it is skipped).
    Should a batch of facts not read, its documents are parsed instead: their
    XML comes from ``documents(message_ids)``."""
    builder = BatchBuilder()
    with_facts: list[tuple] = []

    def parse(row: tuple, document: Any, direction: str) -> None:
        message_id, partner, doc_type, seq, received, delivered = row[:6]
        if document is not None and not isinstance(document, bytes):
            document = bytes(document)
        builder.add(extract(document, message_id=message_id, partner=partner, doc_type=doc_type, ledger_seq=seq,
                            received_ms=received, delivered_ms=delivered, direction=direction))  # fmt: skip

    def flush_facts() -> Iterator[pa.RecordBatch]:
        chunk = with_facts[:]
        with_facts.clear()
        try:
            yield from_facts(chunk)
            return
        except _FACTS_ERRORS as exc:
            if documents is None:
                raise
            error = exc
        # Some facts do not read: find them, parse their documents' XML instead.
        good, bad = [], []
        for row in chunk:
            try:
                from_facts([row])
                good.append(row)
            except _FACTS_ERRORS:
                bad.append(row)
        log.warning("the stored facts of %d documents do not read (%s, e.g. %s); parsing their XML", len(bad),
                    error, bad[0][0] if bad else "?")  # fmt: skip
        if good:
            yield from_facts(good)
        xml = documents([r[0] for r in bad])
        for row in bad:
            parse(row, xml.get(row[0]), row[7])
            if len(builder) >= batch_size:
                yield builder.flush()

    for row in rows:
        direction = row[8] if len(row) > 8 else "inbound"
        if row[7] is not None:
            with_facts.append((*row[:6], row[7], direction))
            if len(with_facts) >= batch_size:
                yield from flush_facts()
        else:
            parse(row, row[6], direction)
            if len(builder) >= batch_size:
                yield builder.flush()
    if with_facts:
        yield from flush_facts()
    if len(builder):
        yield builder.flush()


def extract_many(rows: Iterable[tuple], batch_size: int = 1000) -> Iterator[pa.RecordBatch]:
    """``(message_id, partner, doc_type, ledger_seq, received_ms, delivered_ms,
    document)`` tuples to record batches, every document parsed from its XML."""
    return batches(((*row, None) for row in rows), batch_size)
