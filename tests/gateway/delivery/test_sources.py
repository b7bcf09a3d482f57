"""Where deliveries come from: a route's ``deliver:`` (committed with the accepted document) and a
handler's ``context.deliver`` (committed with the handler's transaction, not at all when it fails)."""

from __future__ import annotations

import base64
import os
import time

import pytest
from delivery_receiver import Receiver
from gwtest import GLOBEX, INVOICE, sample_data, with_id

from broker_core import Broker, Queue, TextMessage
from gateway.delivery.engine import DeliveryEngine
from gateway.delivery.errors import UnknownEndpointError
from gateway.delivery.records import DeliveryLedger, upgrade_deliveries
from gateway.handlers import HandlerRegistry, Worker, handler
from gateway.marked import load_yaml
from gateway.routing.partners import PartnerRegistry

SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()


@pytest.fixture
def receiver(tmp_path):
    r = Receiver(tmp_path)
    yield r
    r.close()


def acme_endpoint(receiver) -> dict:
    return load_yaml(
        text=f"main:\n  url: {receiver.url('/ok')}\n  ca_bundle: {receiver.ca_file}\n"
        f"  secrets: [{SECRET}]\n  allow_addresses: [127.0.0.1]\n"
    )


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
    import httpx

    from gateway.http.app import create_app
    from gateway.runtime.serving import Runtime

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
        assert body == b"<Invoice><ID>A-1</ID></Invoice>"
        row = wait_for(
            lambda: (r := DeliveryLedger(broker.engine).get(headers["webhook-id"])) and r.status == "delivered" and r
        )
        assert row.source == "handler:invoicer"
        time.sleep(1.0)  # the failing request's redeliveries: its delivery never commits
        assert [b for _, b, _ in receiver.requests["/ok"]] == [body]
        assert len(DeliveryLedger(broker.engine).list()) == 1
    finally:
        worker.stop()
        engine.stop()
        broker.close()


@pytest.mark.anyio
async def test_late_replies_and_status_notifications_go_to_the_partner(receiver, tmp_path, make_assembly):
    import asyncio
    import json

    import httpx
    from gwtest import ACME, ORDER, Responder

    from gateway.http.app import create_app
    from gateway.runtime.serving import Runtime

    data = sample_data(tmp_path)
    data["partners"]["acme"]["endpoints"] = acme_endpoint(receiver)
    data["partners"]["acme"]["notify"] = {"late_replies": "main", "status": "main", "statuses": ["replied"]}
    assembly = make_assembly(data)
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=True)
    runtime.start()
    responder = Responder(runtime.broker, mode="late", delay=1.9).start()
    try:
        await asyncio.sleep(1.5)  # the notifier's first look sets its cursor at the end of the ledger
        app = create_app(assembly, runtime=runtime)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test") as client:
            response = await client.post("/v1/documents", content=ORDER, headers=ACME)
        assert response.status_code == 504
        message_id = response.json()["message_id"]

        def arrived():
            bodies = [(h["content-type"], b) for h, b, _ in receiver.requests["/ok"]]
            return len(bodies) >= 2 and bodies

        bodies = await asyncio.to_thread(wait_for, arrived)
        late = [b for t, b in bodies if t == "application/xml"]
        notes = [json.loads(b) for t, b in bodies if t == "application/json"]
        assert len(late) == 1 and b"<OrderResponse" in late[0]
        assert notes == [
            {
                "type": "document.status",
                "message_id": message_id,
                "status": "replied",
                "at": notes[0]["at"],
                "doc_type": "Order",
                "doc_id": notes[0]["doc_id"],
                "correlation_id": notes[0]["correlation_id"],
            }
        ]
        ledger = DeliveryLedger(runtime.broker.engine)
        sources = sorted(r.source for r in ledger.list(partner="acme"))
        assert sources == [f"late-reply:{message_id}", f"status:{message_id}"]
    finally:
        responder.stop()
        runtime.stop()
