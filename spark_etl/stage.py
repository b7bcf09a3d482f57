"""Staging the window with Arrow on the driver (the local-mode path).

With a local master the driver can read the window itself, without the Python
Data Source (whose Arrow batches the JVM turns into rows one by one).
:func:`stage_window` reads the ledger in seq ranges on a few threads (the
stored facts with one ``pyarrow.json`` read per batch, the XML of documents
without current facts with the same extractor: :func:`spark_etl.ubl.batches`),
computes what the driver needs to know of the window (control totals, the
order keys sent twice, the quarantined documents), and writes the new fact
rows as Parquet, one file per table and issue date, under
``<staging>/new/<table>/issue_date=<day>/``, with the columns of
:func:`spark_etl.warehouse.fact_rows` and the physical types Spark writes
(INT96 timestamps, decimals as INT64, Spark's schema in the footer).

The job publishes those files as they are where a table's new content is the
new rows alone, and reads them with Spark where they combine with live rows or
the correction rule. They are written on the driver's file system: a local
warehouse and a local master only; on a cluster the executors read the ledger
(:mod:`spark_etl.source`).
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import re
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import source, ubl, warehouse
from .warehouse import PARTITION

__all__ = ["Staged", "arrow_schema", "fact_tables", "stage_window", "usable"]

#: Threads that read the ledger (each its own connection) and write the files.
THREADS = 2
_TOTAL = pa.decimal128(38, 6)


def usable(spark: Any, storage_root: str) -> bool:
    """Whether the driver may stage with Arrow: local master, local warehouse."""
    return spark.sparkContext.master.startswith("local") and storage_root.startswith("file:")


_ARROW_SCHEMAS: dict[str, pa.Schema] = {}
_SPARK_TO_ARROW = {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(), "boolean": pa.bool_(),
                   "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC")}  # fmt: skip
_SPARK_JSON = {"int": "integer", "bigint": "long"}


def arrow_schema(table: str) -> pa.Schema:
    """*table*'s schema (:data:`spark_etl.warehouse._DDL`) as Arrow, without
    the partition column, with Spark's own description of the row in the
    footer metadata, as Spark writes it (no JVM needed)."""
    if table not in _ARROW_SCHEMAS:
        import json

        fields, spark_fields = [], []
        for name, typ in re.findall(r"(\w+) (decimal\(\d+,\d+\)|\w+)", warehouse._DDL[table]):
            if name == PARTITION:
                continue
            dec = re.fullmatch(r"decimal\((\d+),(\d+)\)", typ)
            fields.append(pa.field(name, pa.decimal128(int(dec[1]), int(dec[2])) if dec else _SPARK_TO_ARROW[typ]))
            spark_fields.append({"name": name, "type": _SPARK_JSON.get(typ, typ), "nullable": True, "metadata": {}})
        row = json.dumps({"type": "struct", "fields": spark_fields}, separators=(",", ":"))
        _ARROW_SCHEMAS[table] = pa.schema(fields, metadata={"org.apache.spark.sql.parquet.row.metadata": row})
    return _ARROW_SCHEMAS[table]


@dataclass
class Staged:
    """What staging the window produced."""

    path: str  # <staging>/new (a local directory)
    summary: list[dict[str, Any]]  # doc_type, outcome, kind, issue_date, n, lines, line_amount, payable
    repeated_keys: list[tuple[str, str, str]]
    quarantined: list[dict[str, Any]]
    rows: dict[str, int] = field(default_factory=dict)  # table -> rows staged
    dates: dict[str, list[str]] = field(default_factory=dict)  # table -> issue dates staged
    seconds: dict[str, float] = field(default_factory=dict)

    def table_path(self, table: str) -> str:
        return os.path.join(self.path, table)


# --------------------------------------------------------------------------- documents -> fact rows


def _ts(col: pa.ChunkedArray) -> pa.ChunkedArray:
    return pc.cast(pc.cast(col, pa.timestamp("ms")), pa.timestamp("us", tz="UTC"))


def _conform(cols: dict[str, Any], table: str, n: int) -> pa.Table:
    schema = arrow_schema(table)
    arrays = []
    for f in schema:
        value = cols[f.name]
        if value is None:
            arrays.append(pa.nulls(n, f.type))
        elif isinstance(value, (bool, int, str)):
            arrays.append(pa.array([value] * n, f.type) if n else pa.array([], f.type))
        else:
            arrays.append(value if value.type == f.type else pc.cast(value, f.type))
    out = pa.Table.from_arrays(arrays, schema=schema)
    return out.append_column(PARTITION, cols[PARTITION])


def _array(col: Any) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def fact_tables(docs: pa.Table) -> dict[str, pa.Table]:
    """The new fact rows of the window's documents (:data:`spark_etl.ubl.DOC_SCHEMA`),
    as :func:`spark_etl.warehouse.fact_rows` builds them in Spark, plus the
    ``issue_date`` column; only the tables the documents have rows for. (The
    job calls it batch by batch: the nested lines are flattened once and never
    copied by a filter of the whole documents.)"""
    head = docs.drop_columns(["lines"])
    ok = pc.fill_null(pc.equal(head["outcome"], "ok"), False)
    kind = head["kind"]
    out: dict[str, pa.Table] = {}

    def rows(*kinds: str) -> pa.Table:
        mask = pc.and_(ok, pc.fill_null(pc.is_in(kind, pa.array(kinds)), False))
        return head if pc.all(mask).as_py() else head.filter(mask)

    o = rows("order")
    if o.num_rows:
        out["fact_order"] = _conform({
            "message_id": o["message_id"], "partner": o["partner"], "direction": o["direction"], "order_id": o["doc_id"],
            "buyer_id": o["party_a_id"], "buyer_name": o["party_a_name"], "seller_id": o["party_b_id"],
            "seller_name": o["party_b_name"], "currency": o["currency"], "line_count": o["ctl_lines"],
            "line_extension_amount": o["line_extension_amount"], "tax_amount": o["tax_amount"],
            "allowance_total_amount": o["allowance_total_amount"], "charge_total_amount": o["charge_total_amount"],
            "payable_amount": o["payable_amount"], "received_at": _ts(o["received_ms"]),
            "delivered_at": _ts(o["delivered_ms"]), "ledger_seq": o["ledger_seq"], "status": "open", "revision": 0,
            "last_change_message_id": None, "cancel_message_id": None, "current_line_count": o["ctl_lines"],
            "current_line_extension_amount": o["ctl_line_amount"], "current_payable_amount": o["payable_amount"],
            PARTITION: o["issue_date"],
        }, "fact_order", o.num_rows)  # fmt: skip
    c = rows("change", "cancellation")
    if c.num_rows:
        out["fact_order_change"] = _conform({
            "message_id": c["message_id"], "partner": c["partner"], "direction": c["direction"], "order_id": c["order_ref"],
            "change_id": c["doc_id"], "kind": c["kind"], "sequence_number": c["sequence_number"],
            "currency": c["currency"], "line_count": c["ctl_lines"], "line_extension_amount": c["line_extension_amount"],
            "payable_amount": c["payable_amount"], "note": c["note"], "received_at": _ts(c["received_ms"]),
            "delivered_at": _ts(c["delivered_ms"]), "ledger_seq": c["ledger_seq"], "applied": False,
            "applied_to_message_id": None, PARTITION: c["issue_date"],
        }, "fact_order_change", c.num_rows)  # fmt: skip
    i = rows("invoice")
    if i.num_rows:
        out["fact_invoice"] = _conform({
            "message_id": i["message_id"], "partner": i["partner"], "direction": i["direction"], "invoice_id": i["doc_id"],
            "type_code": i["type_code"], "order_ref": i["order_ref"], "supplier_id": i["party_a_id"],
            "supplier_name": i["party_a_name"], "customer_id": i["party_b_id"], "customer_name": i["party_b_name"],
            "currency": i["currency"], "line_count": i["ctl_lines"],
            "line_extension_amount": i["line_extension_amount"], "tax_exclusive_amount": i["tax_exclusive_amount"],
            "tax_inclusive_amount": i["tax_inclusive_amount"], "tax_amount": i["tax_amount"],
            "allowance_total_amount": i["allowance_total_amount"], "charge_total_amount": i["charge_total_amount"],
            "prepaid_amount": i["prepaid_amount"], "payable_amount": i["payable_amount"],
            "received_at": _ts(i["received_ms"]), "delivered_at": _ts(i["delivered_ms"]),
            "ledger_seq": i["ledger_seq"], PARTITION: i["issue_date"],
        }, "fact_invoice", i.num_rows)  # fmt: skip

    lists = docs["lines"].combine_chunks()
    all_parent, all_flat = pc.list_parent_indices(lists), pc.list_flatten(lists)
    if not len(all_flat):
        return out
    line_ok, line_kind = pc.take(_array(ok), all_parent), pc.take(_array(kind), all_parent)
    for table, kinds in (("fact_order_line", ("order", "change")), ("fact_invoice_line", ("invoice",))):
        mask = pc.and_(line_ok, pc.fill_null(pc.is_in(line_kind, pa.array(kinds)), False))
        if pc.all(mask).as_py():
            parent, flat = all_parent, all_flat
        elif pc.any(mask).as_py():
            parent, flat = pc.filter(all_parent, mask), pc.filter(all_flat, mask)
        else:
            continue
        take = lambda col, parent=parent: pc.take(head[col], parent)
        lf = {f: flat.field(f) for f in ("line_no", "line_id", "item_id", "item_std_id", "item_name", "quantity",
                                         "unit_code", "price_amount", "line_amount", "tax_amount", "currency")}  # fmt: skip
        if table == "fact_order_line":
            is_order = pc.equal(take("kind"), "order")
            cols = {
                "message_id": take("message_id"), "partner": take("partner"), "direction": take("direction"),
                "order_id": pc.if_else(is_order, take("doc_id"), take("order_ref")),
                "source_doc_type": pc.if_else(is_order, "Order", "OrderChange"),
                "line_status": flat.field("line_status"), **lf, "is_current": True, "superseded_by": None,
            }  # fmt: skip
        else:
            cols = {"message_id": take("message_id"), "partner": take("partner"), "direction": take("direction"),
                    "invoice_id": take("doc_id"),
                    "order_line_ref": flat.field("ref_line_id"), **lf}  # fmt: skip
        cols.update({"ledger_seq": take("ledger_seq"), PARTITION: take("issue_date")})
        out[table] = _conform(cols, table, len(flat))
    return out


# --------------------------------------------------------------------------- what the driver needs to know


_SUMMARY_COLUMNS = ["message_id", "partner", "direction", "doc_type", "ledger_seq", "outcome", "reason", "kind", "doc_id",
                    PARTITION, "ctl_lines", "ctl_line_amount", "ctl_payable_amount"]  # fmt: skip


def _summary(docs: pa.Table | None) -> tuple[list[dict[str, Any]], list[tuple[str, str, str]], list[dict[str, Any]]]:
    """(control totals per doc_type/outcome/kind/date, order keys sent more
    than once, quarantined documents): what the Spark path's summary query gives."""
    if docs is None or not docs.num_rows:
        return [], [], []
    t = pa.table({
        "doc_type": docs["doc_type"], "outcome": docs["outcome"], "kind": docs["kind"], PARTITION: docs[PARTITION],
        "lines": pc.cast(docs["ctl_lines"], pa.int64()), "line_amount": pc.cast(docs["ctl_line_amount"], _TOTAL),
        "payable": pc.cast(docs["ctl_payable_amount"], _TOTAL),
    })  # fmt: skip
    g = t.group_by(["doc_type", "outcome", "kind", PARTITION], use_threads=False).aggregate(
        [("doc_type", "count", pc.CountOptions("all")), ("lines", "sum"), ("line_amount", "sum"), ("payable", "sum")]
    )
    summary = [
        {"doc_type": r["doc_type"], "outcome": r["outcome"], "kind": r["kind"], PARTITION: r[PARTITION],
         "n": r["doc_type_count"], "lines": r["lines_sum"], "line_amount": r["line_amount_sum"],
         "payable": r["payable_sum"]}
        for r in g.to_pylist()
    ]  # fmt: skip
    is_order = pc.and_(pc.equal(docs["outcome"], "ok"), pc.equal(docs["kind"], "order"))
    keys = docs.select(["partner", "direction", "doc_id"]).filter(is_order)
    counted = keys.group_by(["partner", "direction", "doc_id"], use_threads=False).aggregate([("partner", "count")])
    repeated = counted.filter(pc.greater(counted["partner_count"], 1))
    repeated_keys = list(
        zip(
            repeated["partner"].to_pylist(),
            repeated["direction"].to_pylist(),
            repeated["doc_id"].to_pylist(),
            strict=True,
        )
    )
    q = docs.select(["message_id", "partner", "doc_type", "ledger_seq", "reason"])
    quarantined = q.filter(pc.equal(docs["outcome"], "quarantined")).to_pylist()
    return summary, repeated_keys, quarantined


# --------------------------------------------------------------------------- the files


def _write_options() -> dict[str, Any]:
    # As Spark writes: snappy, INT96 timestamps, decimal(18,6) as INT64; no
    # Arrow schema in the footer (pyarrow would restore timestamp[us, UTC]
    # from it, while Spark's files read back as timestamp[ns]).
    return {"compression": "snappy", "use_deprecated_int96_timestamps": True, "store_decimal_as_integer": True,
            "store_schema": False, "row_group_size": 1 << 20}  # fmt: skip


def _write(path: str, tbl: pa.Table) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    opts = _write_options()
    rows = opts.pop("row_group_size")
    with pq.ParquetWriter(path, tbl.schema, **opts) as writer:
        writer.write_table(tbl, row_group_size=rows)
        writer.add_key_value_metadata({k.decode(): v.decode() for k, v in (tbl.schema.metadata or {}).items()})


# --------------------------------------------------------------------------- the window


#: Test hook: applied to the new fact rows of every batch before they are
#: written (a test makes it lose a row to check that reconciliation notices).
transform: Callable[[dict[str, pa.Table]], dict[str, pa.Table]] = lambda tables: tables


def stage_window(url: str, ranges: list[tuple[int, int]], staging_dir: str, *, reparse: bool = False,
                 batch_size: int = 1000, threads: int = THREADS) -> Staged:  # fmt: skip
    """Read the window's documents (*ranges* of ledger seqs) and stage their
    new fact rows under ``staging_dir/new``; see the module docstring."""
    import time

    t0 = time.perf_counter()
    content = "reparse" if reparse else "facts"

    # Documents parsed from their XML (a rebuild from the raw documents) are
    # Python work: processes then, or the GIL would make it one core's work.
    # Facts are read by pyarrow's C++ with the GIL released: threads suffice.
    procs = _reparse_pool(threads) if reparse and threads > 1 and len(ranges) > 1 else None
    read = functools.partial(_read_range, url, content=content, batch_size=batch_size, combine=procs is not None)
    try:
        return _stage(read, ranges, staging_dir, threads, procs, t0)
    finally:
        if procs is not None:
            procs.shutdown(cancel_futures=True)


def _reparse_pool(workers: int) -> ProcessPoolExecutor:
    """Processes that parse XML, started by a fork server rather than forked from this one: the driver
    has threads (the job lease's renewal, the ledger's count per type, Py4J's, pyarrow's), and a child
    forked while one of them held a lock never gets it (a rebuild hung for good here, its worker stopped
    in SQLite's allocator mutex at its first connection). The server forks from a clean, single-threaded
    process that has imported this module once."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return ProcessPoolExecutor(workers, mp_context=context)


def _stage(read, ranges, staging_dir, threads, procs, t0) -> Staged:
    import time

    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="etl-stage") as pool:
        heads: list[pa.Table] = []
        pieces: dict[str, dict[_dt.date, list[pa.Table]]] = {}
        for h, p in (procs or pool).map(read, ranges):  # in ledger order
            heads += h
            for t, days in p.items():
                for day, parts in days.items():
                    pieces.setdefault(t, {}).setdefault(day, []).extend(parts)
        t1 = time.perf_counter()
        summary, repeated, quarantined = _summary(pa.concat_tables(heads) if heads else None)
        del heads
        new_dir = os.path.join(staging_dir, "new")
        tag = uuid.uuid4().hex[:12]
        jobs, rows, dates = [], {}, {}
        for t, days in pieces.items():
            rows[t] = sum(p.num_rows for parts in days.values() for p in parts)
            dates[t] = sorted(d.isoformat() for d in days)
            for day, parts in days.items():
                path = os.path.join(new_dir, t, warehouse.partition_name(day), f"part-00000-{tag}.c000.snappy.parquet")
                jobs.append((sum(p.num_rows for p in parts), path, parts))
        t2 = time.perf_counter()
        # one file per table and date, the biggest first (so the threads end together)
        jobs.sort(key=lambda j: -j[0])
        list(pool.map(lambda j: _write(j[1], pa.concat_tables(j[2])), jobs))
    t3 = time.perf_counter()
    return Staged(
        new_dir,
        summary,
        repeated,
        quarantined,
        rows,
        dates,
        {"read": round(t1 - t0, 3), "transform": round(t2 - t1, 3), "write": round(t3 - t2, 3)},
    )


def _read_range(url: str, r: tuple[int, int], *, content: str, batch_size: int, combine: bool = False
                ) -> tuple[list[pa.Table], dict[str, dict[_dt.date, list[pa.Table]]]]:  # fmt: skip
    """One range of ledger seqs: the documents' header columns (for the
    summary) and their new fact rows split by table and issue date."""
    lo, hi = r
    rows = source._rows(url, lo, hi, content=content)
    heads: list[pa.Table] = []
    pieces: dict[str, dict[_dt.date, list[pa.Table]]] = {}
    for batch in ubl.batches(rows, batch_size, documents=lambda ids: source._documents(url, ids)):
        docs = pa.Table.from_batches([batch])
        heads.append(docs.select(_SUMMARY_COLUMNS))
        for t, tbl in transform(fact_tables(docs)).items():
            for day, part in _by_date(tbl):
                pieces.setdefault(t, {}).setdefault(day, []).append(part)
    if combine:  # one table per date to send back to the parent process, not hundreds of small ones
        heads = [pa.concat_tables(heads).combine_chunks()] if heads else []
        pieces = {t: {d: [pa.concat_tables(p).combine_chunks()] for d, p in days.items()} for t, days in pieces.items()}
    return heads, pieces


def _by_date(tbl: pa.Table) -> list[tuple[_dt.date, pa.Table]]:
    """(issue date, its rows in ledger order without the partition column) of a batch's rows."""
    if not tbl.num_rows:
        return []
    tbl = tbl.take(pc.sort_indices(tbl, [(PARTITION, "ascending"), ("ledger_seq", "ascending")]))
    body, out, start = tbl.drop_columns([PARTITION]), [], 0
    for item in pc.value_counts(tbl[PARTITION]).to_pylist():  # in order of appearance: sorted
        out.append((item["values"], body.slice(start, item["counts"])))
        start += item["counts"]
    return out


def local_path(uri: str) -> str:
    """A ``file:`` URI of the warehouse as a local path."""
    return warehouse.Storage.local_path(uri)


# --------------------------------------------------------------------------- read-back and dimensions (local files)


def _files(path: str) -> list[str]:
    """The data files under a local table directory (Spark's and pyarrow's
    rule: names starting with ``_`` or ``.`` are not data)."""
    out = []
    for base, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
        out += [os.path.join(base, n) for n in sorted(names) if n.endswith(".parquet") and not n.startswith(("_", "."))]
    return out


def _read(path: str, columns: list[str]) -> pa.Table | None:
    """*columns* of every data file under a local table directory (the
    partition column from the directory names), None when there is none."""
    parts = []
    for f in _files(path):
        present = set(pq.read_schema(f).names)
        tbl = pq.read_table(f, columns=[c for c in columns if c != PARTITION and c in present])
        for c in columns:  # a column added since the file was written (direction: inbound before it)
            if c != PARTITION and c not in present:
                value = "inbound" if c == "direction" else None
                tbl = tbl.append_column(c, pa.array([value] * tbl.num_rows, pa.string()))
        if PARTITION in columns:
            day = os.path.basename(os.path.dirname(f)).split("=", 1)[1]
            tbl = tbl.append_column(PARTITION, pa.array([_dt.date.fromisoformat(day)] * tbl.num_rows, pa.date32()))
        parts.append(tbl.select(columns))
    return pa.concat_tables(parts, promote_options="permissive") if parts else None


def read_back(path: str, table: str, lo: int, hi: int) -> dict[str, Any]:
    """Reconciliation figures of the staged files of *table* for the ledger
    window (lo, hi], read with pyarrow: rows, distinct documents (header
    tables), sums of ``payable_amount`` and ``line_count`` (orders, invoices),
    of ``line_amount`` (lines); what the Spark read-back query computes."""
    header = table in ("fact_order", "fact_invoice", "fact_order_change")
    amounts = table in ("fact_order", "fact_invoice")
    lines = table in ("fact_order_line", "fact_invoice_line")
    cols = (
        ["ledger_seq"] + ["message_id"] * header + ["payable_amount", "line_count"] * amounts + ["line_amount"] * lines
    )
    tbl = _read(path, cols)
    out: dict[str, Any] = {"rows": 0, "docs": 0 if header else None, "payable": None, "lines": None, "amount": None}
    if tbl is None:
        return out
    seq = tbl["ledger_seq"]
    tbl = tbl.filter(pc.and_(pc.greater(seq, lo), pc.less_equal(seq, hi)))
    out["rows"] = tbl.num_rows
    if header:
        out["docs"] = pc.count_distinct(tbl["message_id"]).as_py()
    if amounts:
        out["payable"] = pc.sum(pc.cast(tbl["payable_amount"], _TOTAL)).as_py()
        out["lines"] = pc.sum(pc.cast(tbl["line_count"], pa.int64())).as_py()
    if lines:
        out["amount"] = pc.sum(pc.cast(tbl["line_amount"], _TOTAL)).as_py()
    return out


def _party_rows(paths: list[str], table: str) -> pa.Table | None:
    a, name = ("buyer_id", "buyer_name") if table == "fact_order" else ("supplier_id", "supplier_name")
    b, b_name = ("seller_id", "seller_name") if table == "fact_order" else ("customer_id", "customer_name")
    cols = ["partner", "direction", a, name, b, b_name, PARTITION, "delivered_at", "ledger_seq"]
    parts = [t for t in (_read(p, cols) for p in paths) if t is not None]
    if not parts:
        return None
    t = pa.concat_tables(parts, promote_options="permissive")
    n = t.num_rows
    is_order = table == "fact_order"
    sent = pc.equal(t["direction"], "outbound")  # the partner is the other party of what it was sent
    return pa.table({
        "partner": t["partner"], "party_id": pc.if_else(sent, t[b], t[a]),
        "party_name": pc.if_else(sent, t[b_name], t[name]), PARTITION: t[PARTITION],
        "delivered_at": pc.cast(t["delivered_at"], pa.timestamp("us", tz="UTC")), "ledger_seq": t["ledger_seq"],
        "o": pa.array([int(is_order)] * n, pa.int64()), "i": pa.array([int(not is_order)] * n, pa.int64()),
    })  # fmt: skip


def dim_partner(orders: list[str], invoices: list[str]) -> pa.Table:
    """``dim_partner`` (see :func:`spark_etl.warehouse.dim_partner`) from the
    local directories holding the fact rows of orders and invoices."""
    parts = [t for t in (_party_rows(orders, "fact_order"), _party_rows(invoices, "fact_invoice")) if t is not None]
    schema = arrow_schema("dim_partner")
    if not parts:
        return schema.empty_table()
    both = pa.concat_tables(parts)
    # the party of the latest document of each partner (ledger seqs are unique per document)
    both = both.take(pc.sort_indices(both, [("partner", "ascending"), ("ledger_seq", "descending")]))
    g = both.group_by("partner", use_threads=False).aggregate([
        ("party_id", "first", pc.ScalarAggregateOptions(skip_nulls=False)),
        ("party_name", "first", pc.ScalarAggregateOptions(skip_nulls=False)),
        (PARTITION, "min"), (PARTITION, "max"), ("delivered_at", "min"), ("delivered_at", "max"),
        ("o", "sum"), ("i", "sum"),
    ])  # fmt: skip
    return pa.table({
        "partner": g["partner"], "party_id": g["party_id_first"], "party_name": g["party_name_first"],
        "first_issue_date": g[f"{PARTITION}_min"], "last_issue_date": g[f"{PARTITION}_max"],
        "first_delivered_at": g["delivered_at_min"], "last_delivered_at": g["delivered_at_max"],
        "orders": g["o_sum"], "invoices": g["i_sum"],
    }).cast(schema)  # fmt: skip


def dim_date(rows: list[tuple]) -> pa.Table:
    schema = arrow_schema("dim_date")
    return pa.Table.from_pylist([dict(zip(schema.names, r, strict=False)) for r in rows], schema=schema)


def write_table(directory: str, tbl: pa.Table) -> str:
    """*tbl* as one Parquet file in a local *directory* (Spark's physical types)."""
    path = os.path.join(directory, f"part-00000-{uuid.uuid4().hex[:12]}.c000.snappy.parquet")
    _write(path, tbl)
    return path
