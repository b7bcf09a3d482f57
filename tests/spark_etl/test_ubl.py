"""spark_etl.ubl: extraction of the official UBL 2.1 examples (no Spark)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest
from etltest import INVOICE, ORDER, ORDER_CANCELLATION, ORDER_CHANGE, example

from spark_etl import ubl


def _extract(doc: bytes, doc_type: str) -> ubl.Doc:
    return ubl.extract(doc, message_id="m", partner="ACME", doc_type=doc_type, ledger_seq=7, received_ms=1,
                       delivered_ms=2)  # fmt: skip


def _line(d: ubl.Doc, i: int) -> dict:
    return {k: v[i] for k, v in d.lines.items()}


def test_order_example():
    d = _extract(example(ORDER), "Order")
    assert d.outcome == "ok", d.reason
    h = d.header
    assert h["kind"] == "order" and h["doc_id"] == "34" and h["issue_date"] == dt.date(2010, 1, 20)
    assert h["currency"] == "SEK"
    assert (h["party_a_id"], h["party_a_name"]) == ("7300070011115", "Johnssons byggvaror")
    assert (h["party_b_id"], h["party_b_name"]) == ("SellerPartyID123", "Moderna Produkter AB")
    assert (h["line_extension_amount"], h["payable_amount"], h["tax_amount"]) == ("6225", "6225", "100")
    assert (h["allowance_total_amount"], h["charge_total_amount"]) == ("100", "100")
    assert (h["ctl_lines"], h["ctl_line_amount"], h["ctl_payable_amount"]) == (2, "6225.000000", "6225.000000")
    assert d.n_lines == 2
    assert _line(d, 0) == {
        "line_no": 1, "line_id": "1", "line_status": None, "ref_line_id": None, "item_id": "SItemNo001",
        "item_std_id": "1234567890123", "item_name": "Falu Rödfärg", "quantity": "120", "unit_code": "LTR",
        "price_amount": "50", "line_amount": "6000", "tax_amount": "10", "currency": "SEK",
    }  # fmt: skip
    assert _line(d, 1)["item_name"] == "Pensel 20 mm" and _line(d, 1)["quantity"] == "15"


def test_order_change_and_cancellation_examples():
    c = _extract(example(ORDER_CHANGE), "OrderChange")
    assert c.outcome == "ok", c.reason
    assert (c.header["kind"], c.header["doc_id"], c.header["order_ref"], c.header["sequence_number"]) == (
        "change",
        "7",
        "34",
        1,
    )
    assert c.header["payable_amount"] is None and c.n_lines == 1
    assert _line(c, 0)["line_status"] == "Revised" and _line(c, 0)["line_amount"] == "12000"
    x = _extract(example(ORDER_CANCELLATION), "OrderCancellation")
    assert x.outcome == "ok", x.reason
    assert (x.header["kind"], x.header["order_ref"], x.header["note"]) == (
        "cancellation",
        "34",
        "With reference to phone call",
    )
    assert x.n_lines == 0


def test_invoice_example():
    d = _extract(example(INVOICE), "Invoice")
    assert d.outcome == "ok", d.reason
    h = d.header
    assert (h["doc_id"], h["type_code"], h["order_ref"], h["currency"]) == ("TOSL108", "380", "123", "EUR")
    assert (h["party_a_id"], h["party_a_name"]) == ("Supp123", "Salescompany ltd.")
    assert (h["party_b_id"], h["party_b_name"]) == ("345KS5324", "Buyercompany ltd")
    assert (h["payable_amount"], h["prepaid_amount"], h["tax_amount"]) == ("729", "1000", "292.20")
    assert h["ctl_line_amount"] == "1436.500000" and d.n_lines == 5
    assert _line(d, 1) == {
        "line_no": 2, "line_id": "2", "line_status": None, "ref_line_id": "5", "item_id": "JB008",
        "item_std_id": "1234567890125", "item_name": 'Returned "Advanced computing" book', "quantity": "-1",
        "unit_code": "C62", "price_amount": "3.96", "line_amount": "-3.96", "tax_amount": "-0.396",
        "currency": "EUR",
    }  # fmt: skip


@pytest.mark.parametrize(
    "doc, doc_type, reason",
    [
        (b"<Order><broken", "Order", "not well-formed"),
        (example(ORDER), "Invoice", "the root element is Order"),
        (example(ORDER).replace(b"xsd:Order-2", b"xsd:Order-9", 1), "Order", "namespace"),
        (example(ORDER).replace(b"2010-01-20", b"20/01/2010", 1), "Order", "is not a date"),
        (example(ORDER).replace(b"<cbc:ID>34</cbc:ID>", b"<cbc:ID> </cbc:ID>", 1), "Order", "missing cbc:ID"),
        (example(ORDER).replace(b">6000</cbc:LineExtensionAmount>", b">6k</cbc:LineExtensionAmount>"), "Order",
         "is not a number"),
        (example(ORDER_CHANGE).replace(b"<cac:OrderReference>", b"<cac:X>").replace(b"</cac:OrderReference>",
         b"</cac:X>"), "OrderChange", "OrderReference"),
        (b'<?xml version="1.0"?><!DOCTYPE Order []><Order xmlns="urn:oasis:names:specification:ubl:schema:xsd:Order-2"/>',
         "Order", "DOCTYPE"),
    ],
)  # fmt: skip
def test_bad_documents_are_quarantined(doc, doc_type, reason):
    d = _extract(doc, doc_type)
    assert d.outcome == "quarantined"
    assert reason in d.reason


def test_other_types_are_skipped():
    d = _extract(b"<DespatchAdvice/>", "DespatchAdvice")
    assert d.outcome == "skipped" and "not loaded" in d.reason


def test_a_tab_in_a_name_is_normalised_and_changes_nothing_else():
    doc = example(ORDER).replace(b"<cbc:Name>Falu R\xc3\xb6df\xc3\xa4rg</cbc:Name>",
                                 b"<cbc:Name>Falu\tR\xc3\xb6df\xc3\xa4rg</cbc:Name>")  # fmt: skip
    d = _extract(doc, "Order")
    assert d.outcome == "ok"
    assert _line(d, 0)["item_name"] == "Falu Rödfärg"  # normalize-space, as in the fast path
    assert d.header == _extract(example(ORDER), "Order").header


def test_batch_builder_quarantines_a_value_that_does_not_fit():
    big = example(ORDER).replace(b">6225</cbc:PayableAmount>", b">1234567890123.5</cbc:PayableAmount>")
    builder = ubl.BatchBuilder()
    builder.add(_extract(example(ORDER), "Order"))
    builder.add(_extract(big, "Order"))
    batch = builder.flush()
    assert batch.schema == ubl.DOC_SCHEMA
    rows = batch.to_pylist()
    assert [r["outcome"] for r in rows] == ["ok", "quarantined"]
    assert "PayableAmount" in rows[1]["reason"] or "payable_amount" in rows[1]["reason"]
    assert rows[0]["payable_amount"] == Decimal("6225") and len(rows[0]["lines"]) == 2
    assert rows[0]["lines"][0]["quantity"] == Decimal("120")
    assert rows[0]["issue_date"] == dt.date(2010, 1, 20)
    assert isinstance(batch.column("lines").type, pa.ListType)


def _tricky_order() -> bytes:
    """The example with the corners of XPath's string(first node) semantics."""
    doc = example(ORDER).decode("utf-8")
    # a blank first PartyIdentification: the party id is the first non-blank one
    doc = doc.replace(
        '<cbc:ID schemeAgencyID="9" schemeID="GLN">7300070011115</cbc:ID>',
        "<cbc:ID> </cbc:ID></cac:PartyIdentification><cac:PartyIdentification><cbc:ID>7300070011115</cbc:ID>",
        1,
    )
    # a comment inside a value, free text spread over lines
    doc = doc.replace("<cbc:ID>34</cbc:ID>", "<cbc:ID>3<!-- po -->4</cbc:ID>", 1)
    doc = doc.replace("<cbc:Name>Johnssons byggvaror</cbc:Name>", "<cbc:Name>  Johnssons\n\t  byggvaror </cbc:Name>", 1)
    # line 2: no Name (the Description stands in), a blank seller's item id (the buyer's one stands in)
    doc = doc.replace(
        "<cbc:Name>Pensel 20 mm</cbc:Name>",
        "<cac:BuyersItemIdentification><cbc:ID>B-11</cbc:ID></cac:BuyersItemIdentification>",
        1,
    )
    doc = doc.replace("<cbc:ID>SItemNo011</cbc:ID>", "<cbc:ID> </cbc:ID>", 1)
    return doc.encode("utf-8")


def test_fields_follow_xpath_string_semantics_on_any_tree():
    from lxml import etree

    from ledger_contract import facts

    doc = _tricky_order()
    assert doc.count(b"<cac:PartyIdentification>") == example(ORDER).count(b"<cac:PartyIdentification>") + 1
    d = _extract(doc, "Order")
    assert d.outcome == "ok", d.reason
    assert d.header["doc_id"] == "34"
    assert (d.header["party_a_id"], d.header["party_a_name"]) == ("7300070011115", "Johnssons byggvaror")
    assert (_line(d, 1)["item_id"], _line(d, 1)["item_name"]) == ("B-11", "Very good pencils for red paint.")
    # the gateway's tree (comments and indentation kept) gives exactly the same facts as the load's parse
    plain = etree.fromstring(doc)
    assert facts.extract(plain, "Order") == facts.extract(etree.fromstring(doc, ubl._parser()), "Order")
    header, n, lines = facts.extract(plain, "Order")
    assert (header["doc_id"], n, lines["item_id"]) == ("34", 2, ["SItemNo001", "B-11"])
