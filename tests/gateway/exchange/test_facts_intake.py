"""Warehouse facts at intake: the gateway stores, with every accepted document of a
type the warehouse loads, what the warehouse keeps of it (ledger_contract.facts), taken
from the tree it validated; other types get none; a valid document whose facts
cannot be extracted is accepted all the same, without facts."""

from __future__ import annotations

import json

import pytest
from gwtest import ACME, DESPATCH_ADVICE, GLOBEX, INVOICE, ORDER, ORDER_CANCELLATION, ORDER_CHANGE

from ledger_contract import facts

pytestmark = pytest.mark.anyio


async def post(env, document: bytes, headers: dict) -> object:
    return await env.client.post("/v1/documents", content=document, headers=headers)


def rows_by_type(env) -> dict[str, object]:
    return {row.doc_type: row for row in env.ledger_rows()}


async def test_accepted_documents_carry_their_warehouse_facts(gw_env):
    for document, headers in [(ORDER, ACME), (ORDER_CHANGE, ACME), (ORDER_CANCELLATION, ACME), (INVOICE, GLOBEX),
                              (DESPATCH_ADVICE, GLOBEX)]:  # fmt: skip
        response = await post(gw_env, document, headers)
        assert response.status_code in (200, 202), response.text
    rows = rows_by_type(gw_env)

    order = json.loads(rows["Order"].facts)
    assert rows["Order"].facts_version == facts.VERSION
    assert (order["kind"], order["doc_id"], order["issue_date"], order["currency"]) == (
        "order",
        "34",
        "2010-01-20",
        "SEK",
    )
    assert (order["party_a_id"], order["party_b_name"]) == ("7300070011115", "Moderna Produkter AB")
    assert (order["payable_amount"], order["ctl_lines"], order["ctl_line_amount"]) == ("6225", 2, "6225.000000")
    assert order["lines"]["line_id"] == ["1", "2"]
    assert order["lines"]["item_name"] == ["Falu Rödfärg", "Pensel 20 mm"]
    assert order["lines"]["quantity"] == ["120", "15"] and order["lines"]["unit_code"] == ["LTR", "C62"]

    change = json.loads(rows["OrderChange"].facts)
    assert (change["kind"], change["order_ref"], change["sequence_number"], change["lines"]["line_status"]) == (
        "change",
        "34",
        1,
        ["Revised"],
    )
    cancellation = json.loads(rows["OrderCancellation"].facts)
    assert (cancellation["kind"], cancellation["order_ref"], cancellation["note"]) == (
        "cancellation",
        "34",
        "With reference to phone call",
    )
    assert "lines" not in cancellation
    invoice = json.loads(rows["Invoice"].facts)
    assert (invoice["kind"], invoice["doc_id"], invoice["party_a_id"], invoice["payable_amount"]) == (
        "invoice",
        "TOSL108",
        "Supp123",
        "729",
    )
    assert invoice["lines"]["ref_line_id"] == ["1", "5", "3", "2", "4"]

    assert (rows["DespatchAdvice"].facts, rows["DespatchAdvice"].facts_version) == (None, None)  # not loaded


async def test_a_valid_document_without_facts_is_accepted_all_the_same(gw_env, monkeypatch):
    # schema-valid (xsd:decimal) but more decimals than the warehouse keeps: no facts, accepted
    precise = INVOICE.replace(b">729</cbc:PayableAmount>", b">729.1234567</cbc:PayableAmount>")
    response = await post(gw_env, precise, GLOBEX)
    assert response.status_code == 202, response.text
    (row,) = gw_env.ledger_rows()
    assert (row.status, row.facts, row.facts_version, row.document) == ("accepted", None, None, precise)

    # and an extractor that blows up never refuses a document either
    def broken(root, doc_type):
        raise RuntimeError("extractor bug")

    monkeypatch.setattr(facts, "extract", broken)
    response = await post(gw_env, ORDER_CHANGE, ACME)
    assert response.status_code == 202, response.text
    row = rows_by_type(gw_env)["OrderChange"]
    assert (row.status, row.facts, row.facts_version) == ("accepted", None, None)
