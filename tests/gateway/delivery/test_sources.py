"""Where deliveries come from: a route's ``deliver:`` (committed with the accepted document) and a
handler's ``context.deliver`` (committed with the handler's transaction, not at all when it fails)."""

from __future__ import annotations

import base64
import os
import time

import pytest
from broker_core import Broker, Queue, TextMessage

from delivery_receiver import Receiver
from gateway.config.marked import load_yaml
from gateway.delivery.engine import DeliveryEngine
from gateway.delivery.errors import UnknownEndpointError
from gateway.delivery.records import DeliveryLedger, upgrade_deliveries
from gateway.handlers import HandlerRegistry, Worker, handler
from gateway.routing.partners import PartnerRegistry
from gwtest import GLOBEX, INVOICE, sample_data, with_id

SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()


@pytest.fixture
def receiver(tmp_path):
    r = Receiver(tmp_path)
    yield r
    r.close()


def acme_endpoint(receiver) -> dict:
    return load_yaml(text=f"main:\n  url: {receiver.url('/ok')}\n  ca_bundle: {receiver.ca_file}\n"
                          f"  secrets: [{SECRET}]\n  allow_addresses: [127.0.0.1]\n")


def wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out")


@pytest.mark.anyio
async def test_a_route_delivers_what_it_accepts(receiver, tmp_path, make_assembly):
    from gateway.http.app import create_app
    from gateway.runtime.serving import Runtime
    import httpx

    data = sample_data(tmp_path)
    data["partners"]["acme"]["endpoints"] = acme_endpoint(receiver)
    for route in data["routes"]:
        if route["id"] == "ubl-invoice":
            route["deliver"] = {"partner": "acme", "endpoint": "main"}
    assembly = make_assembly(data)
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    try:
        app = create_app(assembly, runtime=runtime)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test") as client:
            document = with_id(INVOICE, "INV-DELIVER-1")
            response = await client.post("/v1/documents", content=document, headers=GLOBEX)
        assert response.status_code == 202, response.text
        message_id = response.json()["message_id"]
        [(headers, body, _)] = wait_for(lambda: receiver.requests["/ok"])
        assert body == document
        ledger = DeliveryLedger(runtime.broker.engine)
        row = wait_for(lambda: (r := ledger.get(headers["webhook-id"])) and r.status == "delivered" and r)
        assert row.partner == "acme" and row.source == f"document:{message_id} route:ubl-invoice"
        assert row.doc_type == "Invoice"
    finally:
        runtime.stop()


def test_a_handler_delivers_in_its_transaction(receiver, tmp_path):
    broker = Broker.open(f"sqlite:///{tmp_path / 'store.db'}")
    upgrade_deliveries(broker.engine)
    section = load_yaml(text="acme:\n  name: ACME\n")
    section["acme"]["endpoints"] = acme_endpoint(receiver)
    partners = PartnerRegistry.from_mapping(section)
    registry = HandlerRegistry()

    @handler("invoices.out", registry=registry, name="invoicer")
    def invoicer(message, context):
        if message.text == "fail":
            context.deliver("acme", b"<Never/>")
            raise RuntimeError("the back end failed")
        if message.text == "nowhere":
            try:
                context.deliver("acme", b"<X/>", endpoint="other")
            except UnknownEndpointError as exc:
                context.logger.info("refused: %s", exc)
                return None
        context.deliver("acme", f"<Invoice><ID>{message.text}</ID></Invoice>")
        return None

    engine = DeliveryEngine(broker, partners.get("acme").delivery.endpoints.values())
    worker = Worker(broker, registry, partners=partners)
    engine.start()
    worker.start()
    try:
        with broker.connect() as connection:
            session = connection.create_session()
            producer = session.create_producer(Queue("invoices.out"))
            for text in ("fail", "nowhere", "A-1"):
                producer.send(TextMessage(text))
        [(headers, body, _)] = wait_for(lambda: receiver.requests["/ok"])
        assert body == "<Invoice><ID>A-1</ID></Invoice>".encode()
        row = wait_for(lambda: (r := DeliveryLedger(broker.engine).get(headers["webhook-id"]))
                       and r.status == "delivered" and r)
        assert row.source == "handler:invoicer"
        time.sleep(1.0)  # the failing request's redeliveries: its delivery never commits
        assert [b for _, b, _ in receiver.requests["/ok"]] == [body]
        assert len(DeliveryLedger(broker.engine).list()) == 1
    finally:
        worker.stop()
        engine.stop()
        broker.close()
