"""The admin API's deliveries: the per-endpoint view, one delivery's timeline, and replay/discard, which a
viewer is refused and an operator's use is audited."""

from __future__ import annotations

import asyncio
import base64
import os
import time

import httpx
import pytest
from delivery_receiver import Receiver
from gwtest import sample_data

from broker_core import Queue
from gateway.delivery.outbox import queue_delivery
from gateway.http.app import create_app
from gateway.marked import load_yaml
from gateway.routing.partners import hash_key
from gateway.runtime.serving import Runtime

pytestmark = pytest.mark.anyio

API = "/admin/api/v1"
SECRET = "whsec_" + base64.b64encode(os.urandom(32)).decode()
OPERATORS = {
    "alice": {"role": "operator", "hash": hash_key("alice-secret-1", ln=4)},
    "bob": {"role": "viewer", "hash": hash_key("bob-secret-22", ln=4)},
}


def basic(name: str, secret: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{name}:{secret}".encode()).decode()}


ALICE, BOB = basic("alice", "alice-secret-1"), basic("bob", "bob-secret-22")


@pytest.fixture
def receiver(tmp_path):
    r = Receiver(tmp_path)
    yield r
    r.close()


async def eventually(fn, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = await fn()
        if value:
            return value
        await asyncio.sleep(0.1)
    raise AssertionError("timed out")


async def test_operators_see_and_replay_dead_deliveries(receiver, tmp_path, make_assembly):
    data = sample_data(tmp_path, operators=OPERATORS)
    data["partners"]["acme"]["endpoints"] = load_yaml(
        text=(
            f"main:\n  url: {receiver.url('/refuse')}\n  ca_bundle: {receiver.ca_file}\n  secrets: [{SECRET}]\n"
            "  allow_addresses: [127.0.0.1]\n"
        )
    )
    assembly = make_assembly(data)
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    app = create_app(assembly, runtime=runtime)
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, client=("10.1.2.3", 5000)), base_url="http://gw.test"
    )
    try:
        endpoint = assembly.partners.get("acme").delivery.endpoints["main"]
        delivery_id = queue_delivery(runtime.broker, endpoint, b"<Invoice/>", source="test")

        async def dead():
            body = (await client.get(f"{API}/deliveries", headers=BOB)).json()
            return body["endpoints"][0]["dead"] == 1 and body

        summary = await eventually(dead)
        assert summary["endpoints"][0] | {"failing_since": None} == {
            "partner": "acme",
            "endpoint": "main",
            "kind": "https",
            "pending": 0,
            "in_flight": 0,
            "dead": 1,
            "failing": 0,
            "failing_since": None,
            "delivered": 0,
        }

        async def recorded():  # the ledger says dead just after the message moves to the dead-letter queue
            body = (await client.get(f"{API}/deliveries/{delivery_id}", headers=BOB)).json()
            return body["status"] == "dead" and body

        one = await eventually(recorded)
        assert one["status"] == "dead" and [(a["outcome"], a["status"]) for a in one["timeline"]] == [("failed", 400)]
        listed = (
            await client.get(f"{API}/deliveries", params={"partner": "acme", "status": "dead"}, headers=BOB)
        ).json()
        assert [d["message_id"] for d in listed["deliveries"]] == [delivery_id]
        assert (await client.get(f"{API}/deliveries/nope", headers=BOB)).status_code == 404

        spec = {"partner": "acme", "endpoint": "main", "message_ids": [delivery_id]}
        refused = await client.post(f"{API}/deliveries/actions/replay", json=spec, headers=BOB)
        assert refused.status_code == 403
        done = await client.post(f"{API}/deliveries/actions/replay", json=spec, headers=ALICE)
        assert done.status_code == 200, done.text
        assert done.json() == {"action": "replay", "message_ids": [delivery_id], "count": 1}
        await eventually(lambda: asyncio.sleep(0, len(receiver.requests["/refuse"]) >= 2))  # replayed: tried again
        await eventually(dead)
        discarded = await client.post(f"{API}/deliveries/actions/discard", json=spec, headers=ALICE)
        assert discarded.json()["count"] == 1
        audit = (await client.get(f"{API}/audit", headers=BOB)).json()["entries"]
        actions = [(e["operator"], e["action"], e["target"]) for e in audit if e["action"].startswith("delivery")]
        assert actions == [("alice", "delivery-discard", "acme/main"), ("alice", "delivery-replay", "acme/main")]
        assert (await client.get(f"{API}/deliveries/{delivery_id}", headers=BOB)).json()["status"] == "discarded"
    finally:
        await client.aclose()
        app.state.ops.service.close()
        runtime.stop()


async def test_the_console_shows_deliveries_and_replays_with_the_csrf_token(receiver, tmp_path, make_assembly):
    data = sample_data(tmp_path, operators=OPERATORS)
    data["partners"]["acme"]["endpoints"] = load_yaml(
        text=(
            f"main:\n  url: {receiver.url('/refuse')}\n  ca_bundle: {receiver.ca_file}\n  secrets: [{SECRET}]\n"
            "  allow_addresses: [127.0.0.1]\n"
        )
    )
    assembly = make_assembly(data)
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    app = create_app(assembly, runtime=runtime)
    c = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("10.1.2.3", 5000)), base_url="http://gw.test")
    try:
        endpoint = assembly.partners.get("acme").delivery.endpoints["main"]
        delivery_id = queue_delivery(runtime.broker, endpoint, b"<Invoice/>", source="test")
        assert (await c.get("/console/deliveries")).status_code == 303  # a session first
        form = await c.get("/console/login")
        token = form.cookies.get("b2bgw_login") or c.cookies.get("b2bgw_login")
        r = await c.post(
            "/console/login", data={"csrf": token, "name": "alice", "secret": "alice-secret-1", "next": "/console"}
        )
        assert r.status_code == 303

        async def dead_page():
            page = await c.get("/console/deliveries?partner=acme&endpoint=main&status=dead")
            return delivery_id in page.text and "400: bad document" in page.text and page

        page = await eventually(dead_page)
        await eventually(lambda: asyncio.sleep(0, list(runtime.broker.browse(Queue(endpoint.dead_queue)))))
        assert "acme/main" in page.text and "400: bad document" in page.text
        detail = await c.get(f"/console/deliveries/{delivery_id}")
        assert detail.status_code == 200 and "failed" in detail.text and "400" in detail.text
        csrf = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        spec = {
            "partner": "acme",
            "endpoint": "main",
            "message_id": delivery_id,
            "action": "replay",
            "return_to": "/console/deliveries",
        }
        assert (await c.post("/console/deliveries/actions", data={**spec, "csrf": "wrong"})).status_code == 403
        r = await c.post("/console/deliveries/actions", data={**spec, "csrf": csrf})
        assert r.status_code == 303 and "done=Replayed+1+dead+delivery" in r.headers["location"]
        await eventually(lambda: asyncio.sleep(0, len(receiver.requests["/refuse"]) >= 2))
    finally:
        await c.aclose()
        app.state.ops.service.close()
        runtime.stop()
