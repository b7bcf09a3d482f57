"""Outbound documents in the warehouse: a UBL document the gateway delivered to a partner (through the real
delivery engine, to a real HTTPS receiver) is loaded as a fact with ``direction`` outbound, its partner the
receiving one; the ledger's own documents say inbound, and so do rows written before the column existed."""

from __future__ import annotations

import base64
import os
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from etltest import INVOICE, ORDER, example, table, with_id

from broker_core import Broker
from spark_etl import job, stage
from spark_etl.warehouse import Storage

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway" / "delivery"))
from delivery_receiver import Receiver

SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()


@pytest.fixture
def receiver(tmp_path):
    r = Receiver(tmp_path)
    yield r
    r.close()


def deliver(ledger, receiver, documents: list[tuple[str, bytes]]) -> list[str]:
    """Deliver *documents* (doc type, XML) to the partner ``RETAILER`` with the gateway's engine, in the
    ledger's database; their delivery ids once all are delivered."""
    from gateway.delivery.config import parse_partner_delivery
    from gateway.delivery.engine import DeliveryEngine
    from gateway.delivery.outbox import queue_delivery
    from gateway.delivery.records import DeliveryLedger, upgrade_deliveries
    from gateway.marked import load_yaml

    broker = Broker.open(ledger.url)
    try:
        upgrade_deliveries(broker.engine)
        text = (
            f"endpoints:\n  main:\n    url: {receiver.url('/ok')}\n    ca_bundle: {receiver.ca_file}\n"
            f"    secrets: [{SECRET}]\n    allow_addresses: [127.0.0.1/32]\n"
        )
        config = parse_partner_delivery(load_yaml(text=text), "RETAILER").endpoints["main"]
        ids = [queue_delivery(broker, config, body, source="test", doc_type=t) for t, body in documents]
        engine = DeliveryEngine(broker, [config])
        engine.start()
        try:
            records = DeliveryLedger(broker.engine)
            deadline = time.monotonic() + 60
            while not all((r := records.get(i)) is not None and r.status == "delivered" for i in ids):
                assert time.monotonic() < deadline, "not delivered in 60 s"
                time.sleep(0.05)
        finally:
            engine.stop()
        return ids
    finally:
        broker.close()


@pytest.mark.parametrize("arrow", [True, False], ids=["arrow-staging", "spark-data-source"])
def test_an_outbound_invoice_is_a_fact_with_its_direction(spark, ledger, settings, receiver, arrow):
    settings["arrow_staging"] = arrow
    ledger.add("m-in", "Invoice", example(INVOICE), partner="SUPPLIER")
    [sent, sent_order] = deliver(
        ledger,
        receiver,
        [("Invoice", with_id(example(INVOICE), "TOSL108", "OUT-1")), ("Order", with_id(example(ORDER), "34", "O-9"))],
    )
    assert len(receiver.requests["/ok"]) == 2

    r = job.run(settings, ledger.url, spark=spark)
    assert (r.status, r.docs_read, r.loaded) == ("succeeded", 3, 3)

    invoices = {row["message_id"]: row for row in table(settings, "fact_invoice")}
    assert {m: (row["direction"], row["partner"], row["invoice_id"]) for m, row in invoices.items()} == {
        "m-in": ("inbound", "SUPPLIER", "TOSL108"),
        sent: ("outbound", "RETAILER", "OUT-1"),
    }
    assert invoices[sent]["payable_amount"] == invoices["m-in"]["payable_amount"]
    lines = table(settings, "fact_invoice_line")
    assert {row["direction"] for row in lines if row["message_id"] == sent} == {"outbound"}
    assert {row["direction"] for row in lines if row["message_id"] == "m-in"} == {"inbound"}
    [order] = table(settings, "fact_order")
    assert (order["message_id"], order["direction"], order["partner"], order["order_id"]) == (
        sent_order,
        "outbound",
        "RETAILER",
        "O-9",
    )
    # the retailer is the party it was sent to: the order's seller
    partners = {row["partner"]: row for row in table(settings, "dim_partner")}
    assert partners["RETAILER"]["party_id"] == order["seller_id"]
    assert (partners["RETAILER"]["orders"], partners["RETAILER"]["invoices"]) == (1, 1)

    again = job.run(settings, ledger.url, spark=spark)  # loaded once: nothing new
    assert again.docs_read == 0
    assert len(table(settings, "fact_invoice")) == 2


def test_rows_written_before_the_column_read_as_inbound(spark, ledger, settings):
    ledger.add("m-in", "Invoice", example(INVOICE), partner="SUPPLIER")
    assert job.run(settings, ledger.url, spark=spark).loaded == 1
    for f in Path(settings["warehouse"], "fact_invoice").rglob("*.parquet"):  # as an older load wrote it
        pq.write_table(pq.read_table(f).drop_columns(["direction"]), f, **stage._write_options())

    storage = Storage(spark, settings["warehouse"])
    assert [r["direction"] for r in storage.read("fact_invoice").collect()] == ["inbound"]
    assert stage._read(str(Path(settings["warehouse"], "fact_invoice")), ["message_id", "direction"]).to_pylist() == [
        {"message_id": "m-in", "direction": "inbound"}
    ]


@pytest.mark.parametrize("arrow", [True, False], ids=["arrow-staging", "spark-data-source"])
def test_an_order_sent_and_one_received_under_one_id_never_correct_each_other(spark, ledger, settings, receiver, arrow):
    """The correction rule's key holds the direction: the partner's own order 7 and our order 7 to it are two
    orders, each current; a second Order 7 from the partner replaces only the partner's."""
    settings["arrow_staging"] = arrow
    ledger.add("m-in-1", "Order", with_id(example(ORDER), "34", "7"), partner="RETAILER")
    ledger.add("m-in-2", "Order", with_id(example(ORDER), "34", "7"), partner="RETAILER")
    [sent] = deliver(ledger, receiver, [("Order", with_id(example(ORDER), "34", "7"))])

    assert job.run(settings, ledger.url, spark=spark).status == "succeeded"
    orders = {row["message_id"]: row for row in table(settings, "fact_order")}
    assert {m: (row["direction"], row["partner"], row["order_id"]) for m, row in orders.items()} == {
        "m-in-1": ("inbound", "RETAILER", "7"),
        "m-in-2": ("inbound", "RETAILER", "7"),
        sent: ("outbound", "RETAILER", "7"),
    }
    assert orders["m-in-1"]["status"] == "replaced" and orders["m-in-2"]["status"] != "replaced"
    assert orders[sent]["status"] != "replaced"
    current = {(r["message_id"], r["direction"]) for r in table(settings, "fact_order_line") if r["is_current"]}
    assert ("m-in-1", "inbound") not in current
    assert {"m-in-2", sent} <= {m for m, _ in current}
