"""The sample receivers of the one-way documents, through gateway.testing."""

from __future__ import annotations

import pytest
from gwtest import DESPATCH_ADVICE, INVOICE, ORDER, ORDER_CANCELLATION, ORDER_CHANGE

from broker_core import TextMessage
from gateway.samples.document_receiver import (
    RECEIVED,
    receive_despatch_advice,
    receive_invoice,
    receive_order_change,
)
from gateway.testing import HandlerHarness


@pytest.mark.parametrize(
    "receiver, document, doc_type, doc_id",
    [
        (receive_invoice, INVOICE, "Invoice", "TOSL108"),
        (receive_despatch_advice, DESPATCH_ADVICE, "DespatchAdvice", None),
        (receive_order_change, ORDER_CHANGE, "OrderChange", None),
        (receive_order_change, ORDER_CANCELLATION, "OrderCancellation", None),
    ],
    ids=["Invoice", "DespatchAdvice", "OrderChange", "OrderCancellation"],
)
def test_each_document_is_taken_and_recorded(receiver, document, doc_type, doc_id):
    with HandlerHarness(receiver) as harness:
        result = harness.request(document, reply=False, properties={"JMSXUserID": "globex"})
    assert result.committed and result.reply is None and result.sent == []
    receipt = RECEIVED[-1]
    assert receipt.message_id == result.request.jms_message_id
    assert (receipt.doc_type, receipt.partner) == (doc_type, "globex")
    if doc_id is not None:
        assert receipt.doc_id == doc_id


def test_a_document_of_another_type_is_rejected_at_once():
    with HandlerHarness(receive_invoice) as harness:
        result = harness.request(ORDER)
    assert result.rejected
    assert result.reason.startswith("invoices.inbound carries UBL Invoice documents, not {urn:oasis")


def test_a_body_that_is_not_xml_is_rejected_at_once():
    with HandlerHarness(receive_order_change) as harness:
        plain = harness.request(TextMessage("not a document"))
        assert plain.rejected and "not well-formed" in plain.reason
        binary = harness.request(harness.broker.connect().create_session().create_bytes_message(b"\x00"))
        assert binary.rejected and "expected an XML document" in binary.reason
