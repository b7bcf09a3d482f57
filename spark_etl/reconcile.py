"""Reconciliation: a load publishes only when what it staged adds up to what
it read. The control totals are computed while parsing (Python Decimal);
the staged files are read back and compared with them, and the documents
read with the ledger's count of delivered ones, per type."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from spark_etl import stage, warehouse
from spark_etl.warehouse import PARTITION, Storage

__all__ = ["HEADER_TABLES", "compare", "control_totals"]

#: The fact tables with one row per document.
HEADER_TABLES = ("fact_order", "fact_invoice", "fact_order_change")


def _dec(value: Any) -> Decimal:
    return Decimal(value) if value is not None else Decimal(0)


def control_totals(summary: list) -> dict[str, Any]:
    """The control totals of a window, from the rows of its parse summary (one per document type, outcome, kind
    and date: ``n``, ``lines``, ``line_amount``, ``payable``): documents read per type and outcome, and per fact
    table the rows, amounts and line counts the staged files must add up to (Python Decimal), and the dates."""
    c: dict[str, Any] = {"docs": 0, "ok": 0, "quarantined": 0, "skipped": 0, "read_by_type": {}, "dates": {}}
    totals = {t: {"rows": 0, "amount": Decimal(0), "payable": Decimal(0), "lines": 0} for t in warehouse.FACT_TABLES}
    for r in summary:
        c["docs"] += r["n"]
        c[r["outcome"]] += r["n"]
        c["read_by_type"][r["doc_type"]] = c["read_by_type"].get(r["doc_type"], 0) + r["n"]
        if r["outcome"] != "ok":
            continue
        day = str(r[PARTITION])
        kind = r["kind"]
        header = {"order": "fact_order", "change": "fact_order_change", "cancellation": "fact_order_change",
                  "invoice": "fact_invoice"}[kind]  # fmt: skip
        line_table = {"order": "fact_order_line", "change": "fact_order_line", "invoice": "fact_invoice_line"}.get(kind)
        totals[header]["rows"] += r["n"]
        totals[header]["payable"] += _dec(r["payable"])
        totals[header]["lines"] += int(r["lines"] or 0)
        c["dates"].setdefault(header, set()).add(day)
        if line_table and (r["lines"] or 0) > 0:
            totals[line_table]["rows"] += int(r["lines"])
            totals[line_table]["amount"] += _dec(r["line_amount"])
            c["dates"].setdefault(line_table, set()).add(day)
    c["totals"] = totals
    return c


def compare(
    control: dict[str, Any],
    staged: dict[str, str],
    in_win: Any,
    *,
    ledger_counts: dict[str, int],
    window: tuple[int, int],
    storage: Storage,
    arrow: bool,
) -> tuple[dict[str, Any], int, list[str]]:
    """The staged files of the window (*staged*: table -> directory; *in_win*: the Spark condition of a row of
    the window) read back and compared with the *control* totals and the ledger's count of delivered documents
    per type: (the report kept in the run's stats, the rows written, the mismatches). Read back with pyarrow
    when the window was staged with *arrow*, else in one Spark job."""
    from pyspark.sql import functions as F

    mismatches: list[str] = []
    for doc_type in sorted(set(ledger_counts) | set(control["read_by_type"])):
        want, got = ledger_counts.get(doc_type, 0), control["read_by_type"].get(doc_type, 0)
        if want != got:
            mismatches.append(f"{doc_type}: the ledger has {want} delivered documents, the load read {got}")
    wrote: dict[str, dict[str, Any]] = {}
    rows_written = 0
    # The staged files of every table read back in ONE Spark job (a union of per-table aggregates).
    total = "decimal(38,6)"
    null = F.lit(None)
    per_table = []
    for t in warehouse.FACT_TABLES:
        if t not in staged or arrow:
            continue
        df = storage.read(t, staged[t]).where(in_win)
        header, amounts = t in HEADER_TABLES, t in ("fact_order", "fact_invoice")
        lines = t in ("fact_order_line", "fact_invoice_line")
        per_table.append(df.agg(
            F.lit(t).alias("table"), F.count(F.lit(1)).alias("rows"),
            # one row per document: count the documents too (duplicates?)
            (F.countDistinct("message_id") if header else null.cast("bigint")).alias("docs"),
            (F.sum("payable_amount") if amounts else null).cast(total).alias("payable"),
            (F.sum("line_count") if amounts else null).cast("bigint").alias("lines"),
            (F.sum("line_amount") if lines else null).cast(total).alias("amount"),
        ))  # fmt: skip
    read_back = {}
    if arrow:  # local files: read back with pyarrow (no Spark job)
        read_back = {t: stage.read_back(stage.local_path(staged[t]), t, window[0], window[1])
                     for t in warehouse.FACT_TABLES if t in staged}  # fmt: skip
    if per_table:
        union = per_table[0]
        for df in per_table[1:]:
            union = union.unionByName(df)
        read_back = {r["table"]: r.asDict() for r in union.collect()}
    for t in warehouse.FACT_TABLES:
        want = control["totals"][t]
        if t in staged:
            got = {k: v for k, v in read_back[t].items() if k != "table" and (v is not None or k == "docs")}
            if t not in HEADER_TABLES:
                got.pop("docs", None)
            got["files"] = sum(len(storage.data_files(f"{staged[t]}/{p}")) for p, d in storage.list(staged[t]) if d)
        else:
            got = {"rows": 0, "docs": 0, "payable": None, "lines": None, "amount": None, "files": 0}
        wrote[t] = {k: (str(v) if isinstance(v, Decimal) else v) for k, v in got.items()}
        rows_written += got["rows"]
        if got["rows"] != want["rows"]:
            mismatches.append(f"{t}: {got['rows']} rows for the window, the ledger documents give {want['rows']}")
        if t in HEADER_TABLES and got["docs"] != got["rows"]:
            mismatches.append(f"{t}: {got['rows'] - got['docs']} duplicate rows for the window")
        if t in ("fact_order", "fact_invoice"):
            if _dec(got.get("payable")) != want["payable"]:
                mismatches.append(
                    f"{t}: payable amounts sum to {_dec(got.get('payable'))}, the ledger documents to {want['payable']}"
                )
            if int(got.get("lines") or 0) != want["lines"]:
                mismatches.append(
                    f"{t}: line counts sum to {got.get('lines') or 0}, the ledger documents have {want['lines']} lines"
                )
        if t in ("fact_order_line", "fact_invoice_line") and _dec(got.get("amount")) != want["amount"]:
            mismatches.append(
                f"{t}: line amounts sum to {_dec(got.get('amount'))}, the ledger documents to {want['amount']}"
            )
    report = {
        "window": list(window),
        "ledger": ledger_counts,
        "expected": {t: {k: str(v) for k, v in d.items()} for t, d in control["totals"].items()},
        "written": wrote,
        "ok": not mismatches,
    }
    return report, rows_written, mismatches
