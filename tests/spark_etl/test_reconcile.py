"""spark_etl.reconcile.control_totals: what a window's parse summary says the staged files must add up to."""

from __future__ import annotations

from decimal import Decimal

from spark_etl.reconcile import control_totals


def _row(doc_type, outcome, kind, day, n, lines=None, line_amount=None, payable=None):
    return {
        "doc_type": doc_type,
        "outcome": outcome,
        "kind": kind,
        "issue_date": day,
        "n": n,
        "lines": lines,
        "line_amount": line_amount,
        "payable": payable,
    }


def test_documents_are_counted_per_type_and_outcome():
    c = control_totals(
        [
            _row("Order", "ok", "order", "2024-03-01", 3, 5, "10.50", "12.00"),
            _row("Order", "quarantined", None, None, 2),
            _row("Invoice", "skipped", None, None, 1),
        ]
    )
    assert (c["docs"], c["ok"], c["quarantined"], c["skipped"]) == (6, 3, 2, 1)
    assert c["read_by_type"] == {"Order": 5, "Invoice": 1}


def test_headers_and_lines_go_to_their_fact_tables_with_exact_sums():
    c = control_totals(
        [
            _row("Order", "ok", "order", "2024-03-01", 2, 3, "0.10", "0.20"),
            _row("Order", "ok", "order", "2024-03-02", 1, 1, "0.20", "0.10"),
            _row("OrderChange", "ok", "change", "2024-03-02", 1, 2, "1.000001", "5"),
            _row("OrderCancellation", "ok", "cancellation", "2024-03-03", 1, None, None, None),
            _row("Invoice", "ok", "invoice", "2024-03-04", 4, 0, None, "100.5"),
        ]
    )
    t = c["totals"]
    assert t["fact_order"] == {"rows": 3, "amount": 0, "payable": Decimal("0.30"), "lines": 4}
    assert t["fact_order_line"] == {"rows": 6, "amount": Decimal("1.300001"), "payable": 0, "lines": 0}
    assert t["fact_order_change"]["rows"] == 2 and t["fact_order_change"]["payable"] == Decimal("5")
    assert t["fact_invoice"] == {"rows": 4, "amount": 0, "payable": Decimal("100.5"), "lines": 0}
    assert t["fact_invoice_line"]["rows"] == 0  # an invoice without lines stages no line rows
    assert c["dates"]["fact_order"] == {"2024-03-01", "2024-03-02"}
    assert c["dates"]["fact_order_line"] == {"2024-03-01", "2024-03-02"}
    assert c["dates"]["fact_order_change"] == {"2024-03-02", "2024-03-03"}
    assert "fact_invoice_line" not in c["dates"]


def test_an_empty_window_expects_nothing():
    c = control_totals([])
    assert c["docs"] == 0 and c["dates"] == {}
    assert all(v == {"rows": 0, "amount": 0, "payable": 0, "lines": 0} for v in c["totals"].values())
