"""Facts extracted at the edge (ledger_contract.facts, stored in b2b_ledger.facts) against
parsing the XML in the load: the same warehouse row by row, current facts are
used (the XML is not even read), stale or unreadable ones are not, and
``--full --reparse`` rebuilds from the raw XML alone."""

from __future__ import annotations

import json

import sqlalchemy as sa
from etltest import (
    INVOICE,
    ORDER,
    ORDER_CANCELLATION,
    ORDER_CHANGE,
    Ledger,
    example,
    gateway_facts,
    snapshot,
    table,
    with_id,
)
from test_load import _change

from ledger_contract import facts
from ledger_contract.tables import documents
from spark_etl import job, state


def run(spark, ledger, settings, **kw) -> job.RunResult:
    return job.run(settings, ledger.url, spark=spark, **kw)


def quarantine(ledger) -> list[tuple[str, str]]:
    with ledger.engine.connect() as conn:
        return sorted((q["message_id"], q["reason"]) for q in state.list_quarantine(conn))


def stored_facts(ledger) -> dict[str, tuple[str | None, int | None]]:
    with ledger.engine.connect() as conn:
        rows = conn.execute(sa.select(documents.c.message_id, documents.c.facts, documents.c.facts_version))
        return {m: (f, v) for m, f, v in rows}


def _history(ledger: Ledger) -> list[list[tuple]]:
    """Three nights of documents: orders, an order sent again, changes (one
    before its order, one adding and cancelling lines), a cancellation,
    invoices, a type that is not loaded, and documents to quarantine."""
    return [
        [
            ("c0", "OrderChange", with_id(example(ORDER_CHANGE), "34", "36"), "ACME"),  # before its order
            ("o1", "Order", example(ORDER), "ACME"),
            ("i1", "Invoice", example(INVOICE), "SUPPLIER"),
            ("d1", "DespatchAdvice", b"<DespatchAdvice/>", "ACME"),
            ("bad-xml", "Order", b"<Order><cbc:ID>1</Order>", "ACME"),
        ],
        [
            ("c1", "OrderChange", example(ORDER_CHANGE), "ACME"),
            ("o2", "Order", with_id(example(ORDER), "34", "35"), "ACME"),
            ("o3", "Order", with_id(example(ORDER), "34", "36"), "ACME"),  # the order c0 was waiting for
            ("o1bis", "Order", example(ORDER), "ACME"),  # order 34 sent again
            ("c2", "OrderChange", _change([("3", "Added", "300"), ("2", "Cancelled", "0")], change_id="8"), "ACME"),
            ("bad-amount", "Invoice",
             example(INVOICE).replace(b">729</cbc:PayableAmount>", b">7.1234567</cbc:PayableAmount>"), "SUPPLIER"),
        ],
        [
            ("x2", "OrderCancellation", with_id(example(ORDER_CANCELLATION), "34", "35"), "ACME"),
            ("i2", "Invoice", with_id(example(INVOICE), "TOSL108", "TOSL109"), "SUPPLIER"),
            ("bad-ref", "OrderCancellation", example(ORDER_CANCELLATION).replace(b"OrderReference", b"OrderRef"),
             "ACME"),
        ],
    ]  # fmt: skip


def test_warehouse_from_facts_equals_the_warehouse_parsed_from_the_xml(spark, ledger, settings, tmp_path):
    nights = _history(ledger)
    for night in nights:
        for message_id, doc_type, document, partner in night:
            ledger.add(message_id, doc_type, document, partner=partner)
        assert run(spark, ledger, settings).status == "succeeded"
    from_facts = snapshot(settings)
    quarantined = quarantine(ledger)

    # the gateway stored current facts for every good document of a loaded type, none for the others
    stored = stored_facts(ledger)
    no_facts = {"d1", "bad-xml", "bad-amount", "bad-ref"}
    assert {m for m, (f, v) in stored.items() if f is not None and v == facts.VERSION} == set(stored) - no_facts
    assert all(stored[m] == (None, None) for m in no_facts)

    # the same warehouse rebuilt from the raw XML alone, into another directory
    xml_settings = {**settings, "warehouse": str(tmp_path / "from-xml")}
    r = run(spark, ledger, xml_settings, full=True, reparse=True)
    assert (r.status, r.mode, r.docs_read, r.quarantined, r.skipped) == ("succeeded", "full", 14, 3, 1)
    from_xml = snapshot(xml_settings)
    assert from_xml == from_facts  # every table, row by row: lines, invoices, corrections, dimensions
    assert quarantine(ledger) == quarantined
    assert {m for m, _ in quarantined} == {"bad-xml", "bad-amount", "bad-ref"}
    assert "7.1234567" in dict(quarantined)["bad-amount"]

    # what that warehouse holds (so the equality above is not between two empty ones)
    orders = {o["message_id"]: (o["order_id"], o["status"]) for o in from_xml["fact_order"]}
    assert orders == {"o1": ("34", "replaced"), "o1bis": ("34", "changed"), "o2": ("35", "cancelled"),
                      "o3": ("36", "changed")}  # fmt: skip
    assert len(from_xml["fact_invoice_line"]) == 10 and len(from_xml["fact_order_change"]) == 4
    assert {(ln["message_id"], ln["line_id"]) for ln in from_xml["fact_order_line"] if ln["is_current"]} == {
        ("c1", "1"),
        ("c2", "3"),
        ("c0", "1"),
        ("o3", "2"),
    }

    # and a ledger written by an older gateway (no facts at all) gives the same warehouse too
    old = Ledger(f"sqlite:///{tmp_path / 'old.db'}", facts=False)
    old_settings = {**settings, "warehouse": str(tmp_path / "old-gateway")}
    for night in nights:
        for message_id, doc_type, document, partner in night:
            old.add(message_id, doc_type, document, partner=partner)
        run(spark, old, old_settings)
    assert all(f is None for f, _ in stored_facts(old).values())
    assert snapshot(old_settings) == from_facts
    old.engine.dispose()


def test_arrow_staging_and_the_data_source_give_the_same_warehouse(spark, settings, tmp_path):
    """The local fast path (the driver stages with Arrow, reads back and builds
    the dimensions with pyarrow) and the cluster path (the executors read with
    the Data Source, everything in Spark) give the same warehouse, night by
    night, also when the nights alternate between them; so does --full."""
    names = ("arrow", "spark", "mixed")
    ledgers = {n: Ledger(f"sqlite:///{tmp_path / (n + '.db')}") for n in names}  # the same documents, seqs, times
    conf = {n: {**settings, "warehouse": str(tmp_path / n)} for n in names}
    for i, night in enumerate(_history(ledgers["arrow"])):
        flags = {"arrow": True, "spark": False, "mixed": i % 2 == 1}
        results = {}
        for n in names:
            for message_id, doc_type, document, partner in night:
                ledgers[n].add(message_id, doc_type, document, partner=partner)
            results[n] = run(spark, ledgers[n], {**conf[n], "arrow_staging": flags[n]})
            assert results[n].stats["staging"] == ("arrow" if flags[n] else "spark")
        counts = {n: (r.docs_read, r.loaded, r.quarantined, r.skipped, r.rows_written) for n, r in results.items()}
        assert counts["arrow"] == counts["spark"] == counts["mixed"]
        assert snapshot(conf["arrow"]) == snapshot(conf["spark"]) == snapshot(conf["mixed"])
    result = snapshot(conf["arrow"])
    assert len(result["fact_order"]) == 4 and len(result["fact_invoice_line"]) == 10 and result["dim_partner"]
    assert quarantine(ledgers["arrow"]) == quarantine(ledgers["spark"]) and len(quarantine(ledgers["spark"])) == 3
    for n, flag in (("arrow", True), ("spark", False)):
        run(spark, ledgers[n], {**conf[n], "arrow_staging": flag}, full=True)
        assert snapshot(conf[n]) == result, n
    for led in ledgers.values():
        led.engine.dispose()


def test_current_facts_are_used_stale_and_unreadable_ones_are_not(spark, ledger, settings, tmp_path):
    order = example(ORDER)
    good = gateway_facts(order, "Order")
    # current facts: the load takes them and never needs the XML (here damaged after intake)
    ledger.add("o1", "Order", b"<Order>damaged", facts=good)
    # facts of an older extractor version (here deliberately wrong): ignored, the XML is parsed
    stale = json.loads(good)
    stale["doc_id"], stale["payable_amount"] = "999", "1"
    ledger.add("o2", "Order", with_id(order, "34", "35"), facts=json.dumps(stale), facts_version=facts.VERSION - 1)
    # current version but unreadable: the XML is parsed, the other documents still come from their facts
    ledger.add("o3", "Order", with_id(order, "34", "37"), facts="{not json")
    ledger.add("o4", "Order", with_id(order, "34", "38"), facts=good.replace('"doc_id":"34"', '"doc_id":"38"'))

    r = run(spark, ledger, settings)
    assert (r.status, r.loaded, r.quarantined) == ("succeeded", 4, 0)
    orders = {o["message_id"]: o for o in table(settings, "fact_order")}
    assert {m: (o["order_id"], str(o["payable_amount"])) for m, o in orders.items()} == {
        "o1": ("34", "6225.000000"), "o2": ("35", "6225.000000"), "o3": ("37", "6225.000000"),
        "o4": ("38", "6225.000000")}  # fmt: skip
    assert len(table(settings, "fact_order_line")) == 8

    # a rebuild from the raw XML alone does read o1's XML, and quarantines it
    xml_settings = {**settings, "warehouse": str(tmp_path / "from-xml")}
    r = run(spark, ledger, xml_settings, full=True, reparse=True)
    assert (r.status, r.loaded, r.quarantined) == ("succeeded", 3, 1)
    assert [m for m, _ in quarantine(ledger)] == ["o1"] and "not well-formed" in quarantine(ledger)[0][1]
    assert sorted(o["message_id"] for o in table(xml_settings, "fact_order")) == ["o2", "o3", "o4"]


def test_a_rebuild_from_xml_parses_in_processes_that_share_no_locks_with_the_driver(tmp_path):
    """``--reparse`` over several ledger ranges parses in two processes. They must not be forked from the
    driver, whose other threads (the job lease's renewal, the ledger count, Py4J's) may hold a lock at that
    instant: a benchmark rebuild hung for good with its worker stuck in SQLite's allocator mutex. Here a
    thread keeps SQLite busy while the window is staged (several times, with a time limit), the staged rows
    equal those of the single-threaded path, and the workers' parent is not this process."""
    import concurrent.futures
    import os
    import sqlite3
    import threading

    import pyarrow.parquet as pq

    from spark_etl import stage

    ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", facts=False)
    for n in range(12):
        ledger.add(f"o{n}", "Order", with_id(example(ORDER), "34", f"x{n}"))
    ranges = [(0, 8), (8, 16), (16, 24)]  # ledger seqs: two events per document

    def rows(staged):
        return sorted(
            (t, tuple(sorted(r.items()))) for t in staged.rows for r in pq.read_table(staged.table_path(t)).to_pylist()
        )

    single = stage.stage_window(ledger.url, ranges, str(tmp_path / "single"), reparse=True, threads=1)
    assert single.rows["fact_order"] == 12

    stop = threading.Event()

    def hammer():  # SQLite's allocator mutex, taken and released all the time
        while not stop.is_set():
            conn = sqlite3.connect(":memory:")
            conn.execute("SELECT zeroblob(1000)").fetchone()
            conn.close()

    busy = threading.Thread(target=hammer, daemon=True)
    busy.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as runner:
            for attempt in range(3):
                staged = runner.submit(
                    stage.stage_window, ledger.url, ranges, str(tmp_path / f"procs{attempt}"), reparse=True, threads=2
                ).result(timeout=120)
                assert rows(staged) == rows(single)
        pool = stage._reparse_pool(2)
        try:
            assert os.getpid() not in set(pool.map(_parent_pid, range(2)))
        finally:
            pool.shutdown()
    finally:
        stop.set()
        busy.join()


def _parent_pid(_: int) -> int:
    import os

    return os.getppid()
