"""The load end to end on small fixtures from the official UBL examples:
warehouse contents row by row, incremental and idempotent reruns, --full
equals the incremental history, the correction rule, quarantine,
reconciliation failure, crash recovery."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path

import pyarrow.compute as pc
import pytest
import sqlalchemy as sa
from etltest import (
    INVOICE,
    ORDER,
    ORDER_CANCELLATION,
    ORDER_CHANGE,
    data_files,
    example,
    snapshot,
    table,
    with_id,
)

from spark_etl import job, stage, state, warehouse

D = Decimal


def run(spark, ledger, settings, **kw) -> job.RunResult:
    return job.run(settings, ledger.url, spark=spark, **kw)


def runs(ledger) -> list[state.RunRecord]:
    with ledger.engine.connect() as conn:
        return list(reversed(state.list_runs(conn, 100)))


def watermark(ledger) -> int:
    with ledger.engine.connect() as conn:
        return state.watermark(conn)


def quarantine(ledger) -> list[dict]:
    with ledger.engine.connect() as conn:
        return state.list_quarantine(conn)


def ts(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).replace(tzinfo=None)


# --------------------------------------------------------------------------- contents


def test_warehouse_contents_row_by_row(spark, ledger, settings):
    ledger.add("m-order", "Order", example(ORDER))
    order_at = ledger.at
    ledger.add("m-invoice", "Invoice", example(INVOICE), partner="SUPPLIER")
    ledger.add("m-despatch", "DespatchAdvice", b"<DespatchAdvice/>")
    ledger.add("m-broken", "Order", b"<Order><cbc:ID>1</Order>")
    ledger.add("m-pending", "Order", example(ORDER), status="accepted")  # not delivered: not loaded

    r = run(spark, ledger, settings)
    assert (r.status, r.docs_read, r.loaded, r.quarantined, r.skipped) == ("succeeded", 4, 2, 1, 1)
    assert r.rows_written == 1 + 2 + 1 + 5

    orders = table(settings, "fact_order")
    assert orders == [{
        "message_id": "m-order", "partner": "ACME", "direction": "inbound", "order_id": "34",
        "buyer_id": "7300070011115",
        "buyer_name": "Johnssons byggvaror", "seller_id": "SellerPartyID123", "seller_name": "Moderna Produkter AB",
        "currency": "SEK", "line_count": 2, "line_extension_amount": D("6225"), "tax_amount": D("100"),
        "allowance_total_amount": D("100"), "charge_total_amount": D("100"), "payable_amount": D("6225"),
        "received_at": ts(order_at), "delivered_at": ts(order_at + 5), "ledger_seq": 2, "status": "open",
        "revision": 0, "last_change_message_id": None, "cancel_message_id": None, "current_line_count": 2,
        "current_line_extension_amount": D("6225"), "current_payable_amount": D("6225"), "issue_date": "2010-01-20",
    }]  # fmt: skip
    lines = table(settings, "fact_order_line", sort=("message_id", "line_no"))
    assert lines == [
        {"message_id": "m-order", "partner": "ACME", "direction": "inbound", "order_id": "34",
         "source_doc_type": "Order", "line_no": 1,
         "line_id": "1", "line_status": None, "item_id": "SItemNo001", "item_std_id": "1234567890123",
         "item_name": "Falu Rödfärg", "quantity": D("120"), "unit_code": "LTR", "price_amount": D("50"),
         "line_amount": D("6000"), "tax_amount": D("10"), "currency": "SEK", "ledger_seq": 2, "is_current": True,
         "superseded_by": None, "issue_date": "2010-01-20"},
        {"message_id": "m-order", "partner": "ACME", "direction": "inbound", "order_id": "34",
         "source_doc_type": "Order", "line_no": 2,
         "line_id": "2", "line_status": None, "item_id": "SItemNo011", "item_std_id": "123452340123",
         "item_name": "Pensel 20 mm", "quantity": D("15"), "unit_code": "C62", "price_amount": D("15"),
         "line_amount": D("225"), "tax_amount": D("10"), "currency": "SEK", "ledger_seq": 2, "is_current": True,
         "superseded_by": None, "issue_date": "2010-01-20"},
    ]  # fmt: skip
    invoices = table(settings, "fact_invoice")
    assert len(invoices) == 1
    inv = invoices[0]
    assert {k: inv[k] for k in ("message_id", "partner", "direction", "invoice_id", "type_code", "order_ref",
                                "supplier_id", "supplier_name", "customer_id", "customer_name", "currency",
                                "line_count", "issue_date")} == {
        "message_id": "m-invoice", "partner": "SUPPLIER", "direction": "inbound", "invoice_id": "TOSL108",
        "type_code": "380",
        "order_ref": "123", "supplier_id": "Supp123", "supplier_name": "Salescompany ltd.",
        "customer_id": "345KS5324", "customer_name": "Buyercompany ltd", "currency": "EUR", "line_count": 5,
        "issue_date": "2009-12-15"}  # fmt: skip
    assert [inv[k] for k in ("line_extension_amount", "tax_exclusive_amount", "tax_inclusive_amount", "tax_amount",
                             "allowance_total_amount", "charge_total_amount", "prepaid_amount", "payable_amount")] == [
        D("1436.5"), D("1436.5"), D("1729"), D("292.2"), D("100"), D("100"), D("1000"), D("729")]  # fmt: skip
    ilines = table(settings, "fact_invoice_line", sort=("message_id", "line_no"))
    assert [(ln["line_id"], ln["order_line_ref"], ln["item_id"], ln["quantity"], ln["unit_code"], ln["price_amount"],
             ln["line_amount"], ln["tax_amount"]) for ln in ilines] == [
        ("1", "1", "JB007", D("1"), "C62", D("1273"), D("1273"), D("254.6")),
        ("2", "5", "JB008", D("-1"), "C62", D("3.96"), D("-3.96"), D("-0.396")),
        ("3", "3", "JB009", D("2"), "C62", D("2.48"), D("4.96"), D("0.496")),
        ("4", "2", "JB010", D("-1"), "C62", D("25"), D("-25"), D("0")),
        ("5", "4", "JB011", D("250"), "C62", D("0.75"), D("187.5"), D("37.5")),
    ]  # fmt: skip
    assert all(ln["message_id"] == "m-invoice" and ln["issue_date"] == "2009-12-15" for ln in ilines)
    assert table(settings, "fact_order_change") == []

    partners = table(settings, "dim_partner", sort=("partner",))
    assert [(p["partner"], p["party_id"], p["party_name"], str(p["first_issue_date"]), p["orders"], p["invoices"])
            for p in partners] == [
        ("ACME", "7300070011115", "Johnssons byggvaror", "2010-01-20", 1, 0),
        ("SUPPLIER", "Supp123", "Salescompany ltd.", "2009-12-15", 0, 1),
    ]  # fmt: skip
    dates = table(settings, "dim_date", sort=("date_key",))
    assert (dates[0]["date_key"], dates[-1]["date_key"], len(dates)) == (20091215, 20100120, 37)
    first = dates[0]
    assert (first["year"], first["quarter"], first["month"], first["month_name"], first["day_of_week"],
            first["day_name"], first["iso_week"], first["is_weekend"]) == (2009, 4, 12, "December", 2, "Tuesday", 51,
                                                                           False)  # fmt: skip

    q = quarantine(ledger)
    assert [(x["message_id"], x["doc_type"], x["partner"], x["run_id"]) for x in q] == [
        ("m-broken", "Order", "ACME", r.run_id)
    ]
    assert "not well-formed" in q[0]["reason"]

    (rec,) = runs(ledger)
    assert (rec.status, rec.mode, rec.seq_from, rec.docs_read, rec.rows_written, rec.loaded, rec.quarantined,
            rec.skipped, rec.error) == ("succeeded", "incremental", 0, 4, 9, 2, 1, 1, None)  # fmt: skip
    assert rec.seq_to == watermark(ledger) == 9  # the newest event, although m-pending was not loaded
    assert rec.stats["reconciliation"]["ok"] is True
    # one file per touched partition, nothing left in staging
    assert [p.parent.name for p in data_files(settings, "fact_order_line")] == ["issue_date=2010-01-20"]
    assert not list((Path(settings["warehouse"]) / "_staging").rglob("*.parquet"))


def test_spark_sql_reads_the_warehouse(spark, ledger, settings):
    ledger.add("o1", "Order", example(ORDER))
    run(spark, ledger, settings)
    spark.read.parquet(f"{settings['warehouse']}/fact_order").createOrReplaceTempView("fact_order")
    spark.read.parquet(f"{settings['warehouse']}/fact_order_line").createOrReplaceTempView("fact_order_line")
    row = spark.sql("""
        SELECT o.partner, o.issue_date, o.currency, count(*) AS lines, sum(l.line_amount) AS amount
        FROM fact_order o JOIN fact_order_line l USING (message_id)
        WHERE l.is_current GROUP BY o.partner, o.issue_date, o.currency""").collect()
    assert [(r.partner, str(r.issue_date), r.currency, r.lines, r.amount) for r in row] == [
        ("ACME", "2010-01-20", "SEK", 2, D("6225"))
    ]


# --------------------------------------------------------------------------- incremental, idempotent


def test_incremental_and_idempotent_reruns(spark, ledger, settings):
    ledger.add("o1", "Order", example(ORDER))
    r1 = run(spark, ledger, settings)
    wm1 = watermark(ledger)
    assert (r1.docs_read, wm1) == (1, r1.seq_to)

    ledger.add("i1", "Invoice", example(INVOICE))
    ledger.add("o2", "Order", with_id(example(ORDER), "34", "35"))
    r2 = run(spark, ledger, settings)
    assert (r2.seq_from, r2.docs_read, r2.loaded) == (wm1, 2, 2)  # only what is new
    after2 = snapshot(settings)
    assert [o["order_id"] for o in after2["fact_order"]] == ["34", "35"]
    assert len(after2["fact_order_line"]) == 4 and len(after2["fact_invoice_line"]) == 5

    r3 = run(spark, ledger, settings)  # nothing new
    assert (r3.status, r3.docs_read, r3.rows_written) == ("succeeded", 0, 0)
    assert snapshot(settings) == after2

    # a replied after a delivered does not bring the document back
    ledger.event("o2", "replied")
    assert run(spark, ledger, settings).docs_read == 0

    # reloading the same windows (--since the beginning) loads nothing twice
    r5 = run(spark, ledger, settings, since=dt.datetime(2000, 1, 1, tzinfo=dt.UTC))
    assert (r5.mode, r5.seq_from, r5.docs_read) == ("since", 0, 3)
    assert snapshot(settings) == after2
    assert [p.parent.name for p in data_files(settings, "fact_order_line")] == ["issue_date=2010-01-20"]
    assert [r.status for r in runs(ledger)] == ["succeeded"] * 5


def test_full_rebuild_equals_the_incremental_history(spark, ledger, settings):
    ledger.add("c0", "OrderChange", with_id(example(ORDER_CHANGE), "34", "36"))  # before its order
    ledger.add("o1", "Order", example(ORDER))
    ledger.add("i1", "Invoice", example(INVOICE))
    run(spark, ledger, settings)
    ledger.add("c1", "OrderChange", example(ORDER_CHANGE))
    ledger.add("o2", "Order", with_id(example(ORDER), "34", "35"))
    ledger.add("o3", "Order", with_id(example(ORDER), "34", "36"))  # the order c0 was waiting for
    ledger.add("bad", "Invoice", b"<Invoice/>")
    run(spark, ledger, settings)
    ledger.add("x2", "OrderCancellation", with_id(example(ORDER_CANCELLATION), "34", "35"))
    run(spark, ledger, settings)
    incremental = snapshot(settings)
    assert [(o["order_id"], o["status"]) for o in incremental["fact_order"]] == [
        ("34", "changed"),
        ("35", "cancelled"),
        ("36", "changed"),
    ]

    r = run(spark, ledger, settings, full=True)  # over the existing warehouse
    assert (r.mode, r.seq_from, r.docs_read) == ("full", 0, 8)
    assert snapshot(settings) == incremental
    for t in warehouse.FACT_TABLES:  # every partition rewritten as one file, the old ones gone
        parts = [p.parent.name for p in data_files(settings, t)]
        assert len(parts) == len(set(parts)), t


def _order_on(day: str, order_id: str) -> bytes:
    doc = with_id(example(ORDER), "34", order_id)
    return doc.replace(b"<cbc:IssueDate>2010-01-20<", f"<cbc:IssueDate>{day}<".encode())


def test_one_file_per_partition_whatever_the_read_ranges(spark, ledger, settings):
    # six orders on three days, interleaved: both read ranges hold every day
    for i in range(6):
        ledger.add(f"o{i}", "Order", _order_on(f"2010-01-2{i % 3}", str(40 + i)))
    r = run(spark, ledger, settings)
    assert (r.status, r.loaded) == ("succeeded", 6)
    days = ["issue_date=2010-01-20", "issue_date=2010-01-21", "issue_date=2010-01-22"]
    for t in ("fact_order", "fact_order_line"):
        assert [p.parent.name for p in data_files(settings, t)] == days, t
    assert r.stats["reconciliation"]["written"]["fact_order_line"]["files"] == 3

    # a later night: new rows in an existing partition (kept + new) and in a new one
    ledger.add("o6", "Order", _order_on("2010-01-21", "46"))
    ledger.add("o7", "Order", _order_on("2010-01-23", "47"))
    run(spark, ledger, settings)
    for t in ("fact_order", "fact_order_line"):
        assert [p.parent.name for p in data_files(settings, t)] == [*days, "issue_date=2010-01-23"], t
    orders = table(settings, "fact_order")
    assert [(o["message_id"], o["issue_date"]) for o in orders] == [
        (f"o{i}", f"2010-01-2{i % 3}") for i in range(6)
    ] + [("o6", "2010-01-21"), ("o7", "2010-01-23")]
    assert len(table(settings, "fact_order_line")) == 16


# --------------------------------------------------------------------------- correction rule


def _change(lines: list[tuple[str, str, str]], *, ref: str = "34", change_id: str = "7") -> bytes:
    """An OrderChange from the example with the given (line id, status, amount) lines."""
    doc = with_id(example(ORDER_CHANGE), "34", ref)
    doc = with_id(doc, "7", change_id)
    start = doc.index(b"<cac:OrderLine>")
    end = doc.index(b"</cac:OrderLine>") + len(b"</cac:OrderLine>")
    template = doc[start:end]
    out = b""
    for line_id, status, amount in lines:
        line = template.replace(b"<cbc:ID>1</cbc:ID>", f"<cbc:ID>{line_id}</cbc:ID>".encode(), 1)
        line = line.replace(b">Revised<", f">{status}<".encode())
        line = line.replace(b">12000<", f">{amount}<".encode())
        out += line
    return doc[:start] + out + doc[end:]


def test_correction_rule(spark, ledger, settings):
    # the official change revises line 1 of the official order (120 -> 240 litres, 6000 -> 12000)
    ledger.add("o1", "Order", example(ORDER))
    ledger.add("c1", "OrderChange", example(ORDER_CHANGE))
    run(spark, ledger, settings)
    (o,) = table(settings, "fact_order")
    assert (o["status"], o["revision"], o["last_change_message_id"], o["cancel_message_id"]) == (
        "changed",
        1,
        "c1",
        None,
    )
    assert (o["line_count"], o["payable_amount"]) == (2, D("6225"))  # as issued: never changes
    assert (o["current_line_count"], o["current_line_extension_amount"], o["current_payable_amount"]) == (
        2,
        D("12225"),
        D("6225"),
    )
    lines = table(settings, "fact_order_line", sort=("ledger_seq", "line_no"))
    assert [(ln["message_id"], ln["line_id"], ln["quantity"], ln["line_amount"], ln["is_current"], ln["superseded_by"],
             ln["issue_date"]) for ln in lines] == [
        ("o1", "1", D("120"), D("6000"), False, "c1", "2010-01-20"),
        ("o1", "2", D("15"), D("225"), True, None, "2010-01-20"),
        ("c1", "1", D("240"), D("12000"), True, None, "2010-01-21"),
    ]  # fmt: skip
    (c,) = table(settings, "fact_order_change")
    assert (c["message_id"], c["order_id"], c["change_id"], c["kind"], c["sequence_number"], c["applied"],
            c["applied_to_message_id"], c["line_count"], c["issue_date"]) == (
        "c1", "34", "7", "change", 1, True, "o1", 1, "2010-01-21")  # fmt: skip

    # a second change adds line 3 and cancels line 2
    ledger.add("c2", "OrderChange", _change([("3", "Added", "300"), ("2", "Cancelled", "0")], change_id="8"))
    run(spark, ledger, settings)
    (o,) = table(settings, "fact_order")
    assert (o["status"], o["revision"], o["last_change_message_id"], o["current_line_count"],
            o["current_line_extension_amount"]) == ("changed", 2, "c2", 2, D("12300"))  # fmt: skip
    current = {(ln["line_id"], ln["message_id"]) for ln in table(settings, "fact_order_line") if ln["is_current"]}
    assert current == {("1", "c1"), ("3", "c2")}
    by_key = {(ln["message_id"], ln["line_id"]): ln for ln in table(settings, "fact_order_line")}
    assert by_key[("o1", "2")]["superseded_by"] == "c2"
    assert (by_key[("c2", "2")]["is_current"], by_key[("c2", "2")]["line_status"]) == (False, "Cancelled")

    # the cancellation voids the order
    ledger.add("x1", "OrderCancellation", example(ORDER_CANCELLATION))
    run(spark, ledger, settings)
    (o,) = table(settings, "fact_order")
    assert (
        o["status"],
        o["cancel_message_id"],
        o["current_line_count"],
        o["current_line_extension_amount"],
        o["current_payable_amount"],
        o["payable_amount"],
    ) == ("cancelled", "x1", 0, D("0"), D("0"), D("6225"))
    assert not any(ln["is_current"] for ln in table(settings, "fact_order_line"))
    assert by_key[("c2", "3")]["message_id"] == "c2"
    assert {
        ln["superseded_by"]
        for ln in table(settings, "fact_order_line")
        if ln["message_id"] == "c2" and ln["line_id"] == "3"
    } == {"x1"}
    assert all(c["applied"] for c in table(settings, "fact_order_change"))


def test_change_before_its_order_and_order_sent_again(spark, ledger, settings):
    # the change arrives (and is loaded) before the order it refers to
    ledger.add("c1", "OrderChange", example(ORDER_CHANGE))
    ledger.add("other", "Order", with_id(example(ORDER), "34", "34"), partner="OTHER")  # same id, other partner
    run(spark, ledger, settings)
    (c,) = table(settings, "fact_order_change")
    assert (c["applied"], c["applied_to_message_id"]) == (False, None)
    assert [
        (ln["message_id"], ln["is_current"]) for ln in table(settings, "fact_order_line") if ln["message_id"] == "c1"
    ] == [("c1", False)]
    assert [(o["partner"], o["status"]) for o in table(settings, "fact_order")] == [("OTHER", "open")]

    # then the order: the change applies to it
    ledger.add("o1", "Order", example(ORDER))
    run(spark, ledger, settings)
    orders = {o["message_id"]: o for o in table(settings, "fact_order")}
    assert (orders["o1"]["status"], orders["o1"]["revision"], orders["o1"]["current_line_extension_amount"]) == (
        "changed",
        1,
        D("12225"),
    )
    assert orders["other"]["status"] == "open"  # another partner's order 34 is another order
    (c,) = table(settings, "fact_order_change")
    assert (c["applied"], c["applied_to_message_id"]) == (True, "o1")

    # the order is sent again under the same id: the last one is the effective order
    ledger.add("o1bis", "Order", example(ORDER))
    run(spark, ledger, settings)
    orders = {o["message_id"]: o for o in table(settings, "fact_order")}
    assert (orders["o1"]["status"], orders["o1"]["current_line_count"]) == ("replaced", 0)
    assert (orders["o1bis"]["status"], orders["o1bis"]["revision"]) == ("changed", 1)
    lines = table(settings, "fact_order_line")
    assert {(ln["message_id"], ln["superseded_by"]) for ln in lines if ln["message_id"] == "o1"} == {("o1", "o1bis")}
    assert {(ln["message_id"], ln["line_id"]) for ln in lines if ln["is_current"] and ln["partner"] == "ACME"} == {
        ("c1", "1"),
        ("o1bis", "2"),
    }


# --------------------------------------------------------------------------- quarantine, reconciliation, crashes


def test_bad_data_is_quarantined_and_the_night_goes_on(spark, ledger, settings):
    ledger.add("o1", "Order", example(ORDER))
    ledger.add("bad-xml", "Order", b"<Order>\x00</Order>")
    ledger.add(
        "bad-amount", "Invoice", example(INVOICE).replace(b">729</cbc:PayableAmount>", b">seven</cbc:PayableAmount>")
    )
    ledger.add("bad-ref", "OrderCancellation", example(ORDER_CANCELLATION).replace(b"OrderReference", b"OrderRef"))
    r = run(spark, ledger, settings)
    assert (r.status, r.loaded, r.quarantined) == ("succeeded", 1, 3)
    q = {x["message_id"]: x["reason"] for x in quarantine(ledger)}
    assert set(q) == {"bad-xml", "bad-amount", "bad-ref"}
    assert "not well-formed" in q["bad-xml"]
    assert "seven" in q["bad-amount"]
    assert "OrderReference" in q["bad-ref"]
    assert [o["message_id"] for o in table(settings, "fact_order")] == ["o1"]
    assert table(settings, "fact_invoice") == []
    # reloading a quarantined document after a fix (here: --full) clears its row only when it loads
    r2 = run(spark, ledger, settings, full=True)
    assert r2.quarantined == 3 and len(quarantine(ledger)) == 3


@pytest.mark.parametrize("arrow", [True, False], ids=["arrow-staging", "spark-data-source"])
def test_reconciliation_failure_fails_loudly_and_leaves_the_watermark(spark, ledger, settings, monkeypatch, arrow):
    settings["arrow_staging"] = arrow
    ledger.add("o1", "Order", example(ORDER))
    run(spark, ledger, settings)
    wm, before = watermark(ledger), snapshot(settings)

    ledger.add("o2", "Order", with_id(example(ORDER), "34", "35"))
    if arrow:  # a transform bug: one order line is lost on the way

        def losing_a_line(tables):
            lines = tables["fact_order_line"]
            keep = pc.invert(pc.and_(pc.equal(lines["message_id"], "o2"), pc.equal(lines["line_no"], 2)))
            return {**tables, "fact_order_line": lines.filter(keep)}

        monkeypatch.setattr(stage, "transform", losing_a_line)
    else:
        real = warehouse.fact_rows

        def losing_a_line(docs):
            out = real(docs)
            out["fact_order_line"] = out["fact_order_line"].where("NOT (message_id = 'o2' AND line_no = 2)")
            return out

        monkeypatch.setattr(warehouse, "fact_rows", losing_a_line)
    with pytest.raises(job.ReconciliationError) as err:
        run(spark, ledger, settings)
    assert any("fact_order_line: 1 rows for the window, the ledger documents give 2" in m for m in err.value.mismatches)
    assert any("line amounts sum to 6000" in m for m in err.value.mismatches)
    failed = runs(ledger)[-1]
    assert failed.status == "failed" and "ReconciliationError" in failed.error and failed.finished_at
    assert failed.stats["reconciliation"]["ok"] is False
    assert watermark(ledger) == wm
    assert snapshot(settings) == before  # nothing was published
    assert not list((Path(settings["warehouse"]) / "_staging").rglob("*.parquet"))

    monkeypatch.undo()
    r = run(spark, ledger, settings)  # fixed: the same window loads
    assert (r.status, r.seq_from, r.docs_read) == ("succeeded", wm, 1)
    assert len(table(settings, "fact_order_line")) == 4


class _Crash(Exception):
    pass


def test_a_run_that_dies_after_publishing_is_completed_by_the_next(spark, ledger, settings, monkeypatch):
    ledger.add("o1", "Order", example(ORDER))
    run(spark, ledger, settings)
    wm = watermark(ledger)
    ledger.add("c1", "OrderChange", example(ORDER_CHANGE))

    def die(job_):
        raise _Crash("killed after the Parquet files moved, before the watermark")

    monkeypatch.setattr(job, "_after_publish", die)
    with pytest.raises(_Crash):
        run(spark, ledger, settings)
    crashed = runs(ledger)[-1]
    assert crashed.status == "publishing" and watermark(ledger) == wm
    monkeypatch.setattr(job, "_after_publish", lambda job_: None)

    r = run(spark, ledger, settings)  # rolls the crashed run forward first
    assert r.docs_read == 0
    rec = {x.run_id: x for x in runs(ledger)}[crashed.run_id]
    assert rec.status == "succeeded" and rec.stats["recovered"] is True
    assert watermark(ledger) == r.seq_to
    (o,) = table(settings, "fact_order")
    assert (o["status"], o["revision"]) == ("changed", 1)
    assert len(table(settings, "fact_order_line")) == 3


def test_a_run_that_dies_half_way_through_publishing_converges(spark, ledger, settings, monkeypatch):
    ledger.add("o1", "Order", example(ORDER))
    run(spark, ledger, settings)
    ledger.add("c1", "OrderChange", example(ORDER_CHANGE))
    expected_rows = 3

    calls = {"n": 0}
    real_delete = warehouse.Storage.delete

    def flaky_delete(self, path, recursive=False):  # the first replaced file cannot be deleted: crash
        if path.endswith(".parquet") and "_staging" not in path and calls["n"] == 0:
            calls["n"] += 1
            raise _Crash(f"died deleting {path}")
        return real_delete(self, path, recursive)

    monkeypatch.setattr(warehouse.Storage, "delete", flaky_delete)
    with pytest.raises(_Crash):
        run(spark, ledger, settings)
    assert runs(ledger)[-1].status == "publishing"
    monkeypatch.setattr(warehouse.Storage, "delete", real_delete)

    run(spark, ledger, settings)
    assert len(table(settings, "fact_order_line")) == expected_rows  # no duplicated rows left behind
    assert len(table(settings, "fact_order")) == 1
    for t in warehouse.FACT_TABLES:
        parts = [p.parent.name for p in data_files(settings, t)]
        assert len(parts) == len(set(parts)), t


def test_a_crash_between_staging_and_commit_leaves_nothing_behind(spark, ledger, settings, monkeypatch):
    """The Arrow staging wrote the window's files (``_staging/run-<id>/new``),
    then the run dies before its journal: the watermark and the warehouse are
    unchanged; a failure the process survives removes the staging at once, a
    process that died leaves it to the next run, which removes it, marks the
    dead run failed and loads the window again."""
    ledger.add("o1", "Order", example(ORDER))
    run(spark, ledger, settings)
    wm, before = watermark(ledger), snapshot(settings)
    ledger.add("o2", "Order", with_id(example(ORDER), "34", "35"))
    staging = Path(settings["warehouse"]) / "_staging"
    real_stage, real_delete = stage.stage_window, warehouse.Storage.delete
    seen = []

    def staged_then_crash(*args, **kw):
        real_stage(*args, **kw)
        seen.extend(staging.rglob("*.parquet"))
        raise _Crash("killed after staging")

    # 1. the run fails, the process lives on: the staging is removed at once
    monkeypatch.setattr(stage, "stage_window", staged_then_crash)
    with pytest.raises(_Crash):
        run(spark, ledger, settings)
    assert seen and all("/new/" in str(p) for p in seen)  # the window had been staged
    assert runs(ledger)[-1].status == "failed" and watermark(ledger) == wm
    assert snapshot(settings) == before
    assert not staging.exists()

    # 2. the process dies (nothing cleans up): the files stay until the next run
    seen.clear()
    monkeypatch.setattr(warehouse.Storage, "delete", lambda self, path, recursive=False: False)
    with pytest.raises(_Crash):
        run(spark, ledger, settings)
    dead = runs(ledger)[-1]
    state.update_run(ledger.engine, dead.run_id, status="running", finished_at=None)  # as a process that died leaves it
    assert seen and list(staging.rglob("*.parquet"))
    assert watermark(ledger) == wm and snapshot(settings) == before
    monkeypatch.setattr(warehouse.Storage, "delete", real_delete)
    monkeypatch.setattr(stage, "stage_window", real_stage)

    r = run(spark, ledger, settings)
    assert (r.status, r.seq_from, r.docs_read) == ("succeeded", wm, 1)
    assert {x.run_id: x for x in runs(ledger)}[dead.run_id].status == "failed"
    assert not staging.exists()
    assert sorted(o["message_id"] for o in table(settings, "fact_order")) == ["o1", "o2"]


def test_staged_files_are_spark_parquet_one_per_date(spark, ledger, settings):
    """The Arrow-staged files carry Spark's physical types (INT96 timestamps,
    decimal(18,6) as INT64) and Spark's row schema, so a warehouse mixing
    them with files Spark wrote reads as one, with pyarrow as with Spark."""
    import pyarrow.parquet as pq

    ledger.add("o1", "Order", example(ORDER))
    ledger.add("o2", "Order", _order_on("2010-01-21", "35"))
    r = run(spark, ledger, {**settings, "arrow_staging": True})
    assert r.stats["staging"] == "arrow"
    arrow_files = data_files(settings, "fact_order_line")
    assert [f.parent.name for f in arrow_files] == ["issue_date=2010-01-20", "issue_date=2010-01-21"]
    # the next night by the Data Source: a new date written by Spark, an existing one merged by Spark
    ledger.add("o3", "Order", _order_on("2010-01-22", "36"))
    ledger.add("o4", "Order", _order_on("2010-01-21", "37"))
    assert run(spark, ledger, {**settings, "arrow_staging": False}).stats["staging"] == "spark"
    spark_files = [f for f in data_files(settings, "fact_order_line") if f not in arrow_files]
    assert [f.parent.name for f in spark_files] == ["issue_date=2010-01-21", "issue_date=2010-01-22"]
    (arrow_file,) = [f for f in data_files(settings, "fact_order") if f.parent.name == "issue_date=2010-01-20"]
    (spark_file,) = [f for f in data_files(settings, "fact_order") if f.parent.name == "issue_date=2010-01-22"]
    a, b = pq.ParquetFile(arrow_file), pq.ParquetFile(spark_file)
    assert a.schema.to_arrow_schema() == b.schema.to_arrow_schema()  # same physical and logical types
    phys = lambda f, col: f.schema.column(f.schema.names.index(col)).physical_type
    assert [phys(a, c) for c in ("received_at", "payable_amount")] == ["INT96", "INT64"]
    assert [phys(b, c) for c in ("received_at", "payable_amount")] == ["INT96", "INT64"]
    assert json.loads(a.metadata.metadata[b"org.apache.spark.sql.parquet.row.metadata"]) == json.loads(
        b.metadata.metadata[b"org.apache.spark.sql.parquet.row.metadata"]
    )
    # read as one table, by pyarrow and by Spark without a schema given
    assert [o["message_id"] for o in table(settings, "fact_order")] == ["o1", "o2", "o3", "o4"]
    df = spark.read.parquet(str(Path(settings["warehouse"]) / "fact_order"))
    assert df.schema == warehouse.schema("fact_order")
    assert sorted(r.message_id for r in df.select("message_id").collect()) == ["o1", "o2", "o3", "o4"]


def test_migrations_create_the_tables_with_their_own_version_table(ledger, settings):
    engine = state.open_store(ledger.url)
    names = set(sa.inspect(engine).get_table_names())
    assert {"etl_runs", "etl_quarantine", "etl_lock", "b2b_etl_version"} <= names
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM b2b_etl_version")).scalar_one() == "0001"
    engine.dispose()
