"""The admin API (/admin/api/v1): operators and roles, sessions and CSRF, every endpoint, the audit trail.

A partner's key never opens it; a viewer reads and is refused every change; a session's change needs its
CSRF token and a same-site origin; API clients authenticate with HTTP Basic and send JSON.
"""

from __future__ import annotations

import asyncio
import base64
import time

import httpx
import pytest
from gwtest import GLOBEX, INVOICE, GatewayEnv, Responder, with_id

from broker_core import Queue
from gateway.http.app import create_app
from gateway.routing.partners import hash_key
from gateway.runtime.serving import Runtime

pytestmark = pytest.mark.anyio

API = "/admin/api/v1"
OPERATORS = {
    "alice": {"role": "operator", "hash": hash_key("alice-secret-1", ln=4)},
    "bob": {"role": "viewer", "hash": hash_key("bob-secret-22", ln=4)},
}


def basic(name: str, secret: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{name}:{secret}".encode()).decode()}


ALICE = basic("alice", "alice-secret-1")
BOB = basic("bob", "bob-secret-22")


@pytest.fixture
async def admin_env(make_assembly):
    assembly = make_assembly(
        operators=OPERATORS, admin={"stats_interval": "50ms", "login_attempts": 3, "login_window": "1m"}
    )
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=True)
    runtime.start()
    responder = Responder(runtime.broker).start()
    app = create_app(assembly, runtime=runtime)
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, client=("10.1.2.3", 5000)), base_url="http://gw.test"
    )
    try:
        yield GatewayEnv(assembly, runtime, app, client, responder)
    finally:
        await client.aclose()
        app.state.ops.service.close()
        responder.stop()
        runtime.stop()


async def post_invoices(env: GatewayEnv, *ids: str) -> list[str]:
    out = []
    for doc_id in ids:
        r = await env.client.post("/v1/documents", content=with_id(INVOICE, doc_id), headers=GLOBEX)
        assert r.status_code == 202, r.text
        out.append(r.headers["x-message-id"])
    return out


def fresh(env: GatewayEnv) -> None:
    """Read the counters now (the sampler reads them every stats_interval)."""
    env.app.state.ops.service.sampler.refresh()


async def login(env: GatewayEnv, name: str = "alice", secret: str = "alice-secret-1") -> str:
    r = await env.client.post(f"{API}/session", json={"name": name, "secret": secret})
    assert r.status_code == 200, r.text
    return r.json()["csrf_token"]


def dead_letter(env: GatewayEnv, queue: str, count: int) -> None:
    """Fail *count* messages of *queue* until they are dead-lettered (max_deliveries is 2 in the tests)."""
    conn = env.broker.connect()
    conn.start()
    session = conn.create_session(transacted=True)
    consumer = session.create_consumer(Queue(queue))
    for _ in range(count * 2):
        assert consumer.receive(timeout=2) is not None
        session.rollback()
    conn.close()


async def wait_status(env: GatewayEnv, message_id: str, status: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        record = env.gateway.ledger.get(message_id)
        if record is not None and record.status == status:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{message_id} never became {status}")


# --------------------------------------------------------------------------- who may come in


async def test_nobody_and_no_partner_key_opens_the_admin_side(admin_env):
    c = admin_env.client
    r = await c.get(f"{API}/destinations")
    assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
    assert r.headers["www-authenticate"].startswith("Basic")
    r = await c.get(f"{API}/destinations", headers={"Authorization": GLOBEX["Authorization"]})
    assert r.status_code == 401
    r = await c.get(f"{API}/destinations", headers=basic("alice", "not-the-secret"))
    assert r.status_code == 401
    r = await c.get(f"{API}/destinations", headers=basic("mallory", "alice-secret-1"))
    assert r.status_code == 401


async def test_failed_logins_are_limited_then_even_the_right_secret_waits(admin_env):
    c = admin_env.client
    for _ in range(3):
        r = await c.post(f"{API}/session", json={"name": "alice", "secret": "guess"})
        assert r.status_code == 401
    r = await c.post(f"{API}/session", json={"name": "alice", "secret": "alice-secret-1"})
    assert r.status_code == 429 and r.json()["code"] == "too-many-login-attempts"
    assert int(r.headers["retry-after"]) > 0
    r = await c.get(f"{API}/destinations", headers=ALICE)  # Basic credentials count as logins too
    assert r.status_code == 429


async def test_the_session_cookie_is_httponly_strict_and_csrf_guards_every_change(admin_env):
    c = admin_env.client
    csrf = await login(admin_env)
    cookie = next(v for k, v in admin_env.client.cookies.items() if k == "b2bgw_session")
    assert cookie
    r = await c.post(f"{API}/session", json={"name": "alice", "secret": "alice-secret-1"})
    flags = [part.strip().lower() for part in r.headers["set-cookie"].split(";")]
    assert "httponly" in flags and "samesite=strict" in flags and "path=/" in flags
    assert "secure" not in flags  # plain http here; https (or secure_cookies: true) adds it
    csrf = r.json()["csrf_token"]
    me = (await c.get(f"{API}/session")).json()
    assert me == {"operator": "alice", "role": "operator", "via": "session", "csrf_token": csrf, "can_act": True}
    [mid] = await post_invoices(admin_env, "INV-CSRF")
    action = {"destination": "queue://invoices.inbound", "message_ids": [mid]}
    r = await c.post(f"{API}/actions/delete", json=action)
    assert r.status_code == 403 and r.json()["code"] == "csrf-failed"
    r = await c.post(f"{API}/actions/delete", json=action, headers={"X-CSRF-Token": "x" + csrf})
    assert r.status_code == 403
    r = await c.post(
        f"{API}/actions/delete", json=action, headers={"X-CSRF-Token": csrf, "Sec-Fetch-Site": "cross-site"}
    )
    assert r.status_code == 403
    r = await c.post(
        f"{API}/actions/delete", json=action, headers={"X-CSRF-Token": csrf, "Origin": "https://evil.example"}
    )
    assert r.status_code == 403
    assert admin_env.broker.find_message("queue://invoices.inbound", mid) is not None
    r = await c.post(f"{API}/actions/delete", json=action, headers={"X-CSRF-Token": csrf, "Origin": "http://gw.test"})
    assert r.status_code == 200 and r.json()["count"] == 1
    r = await c.request("DELETE", f"{API}/session", headers={"X-CSRF-Token": csrf})
    assert r.status_code == 204
    c.cookies.clear()
    assert (await c.get(f"{API}/session")).status_code == 401


async def test_basic_credentials_change_only_with_a_json_body(admin_env):
    [mid] = await post_invoices(admin_env, "INV-FORM")
    r = await admin_env.client.post(
        f"{API}/actions/delete",
        headers={**ALICE, "Content-Type": "text/plain"},
        content=f'{{"destination": "queue://invoices.inbound", "message_ids": ["{mid}"]}}',
    )
    assert r.status_code == 403 and r.json()["code"] == "csrf-failed"
    assert admin_env.broker.find_message("queue://invoices.inbound", mid) is not None


async def test_a_viewer_reads_everything_and_is_refused_every_change(admin_env):
    c = admin_env.client
    [mid] = await post_invoices(admin_env, "INV-VIEW")
    for path in (
        "/destinations",
        "/partners",
        "/routes",
        "/etl/runs",
        "/audit",
        "/documents?doc_id=INV-VIEW",
        f"/documents/{mid}",
        "/messages?destination=queue://invoices.inbound",
    ):
        r = await c.get(API + path, headers=BOB)
        assert r.status_code == 200, (path, r.text)
    for action, body in (
        ("delete", {"message_ids": [mid]}),
        ("move", {"message_ids": [mid], "target": "queue://x"}),
        ("purge", {"confirm": "queue://invoices.inbound"}),
        ("replay", {"selector": "1 = 1"}),
    ):
        r = await c.post(
            f"{API}/actions/{action}", headers=BOB, json={"destination": "queue://invoices.inbound", **body}
        )
        assert r.status_code == 403 and r.json()["code"] == "forbidden", action
    assert admin_env.broker.find_message("queue://invoices.inbound", mid) is not None
    entries = (await c.get(f"{API}/audit", params={"operator": "bob"}, headers=ALICE)).json()["entries"]
    assert [e["action"] for e in entries if e["action"].startswith("read-")] == ["read-document"]  # reads too
    refused = [e for e in entries if not e["action"].startswith("read-")]
    assert [e["action"] for e in refused] == ["replay", "purge", "move", "delete"]
    assert all(e["outcome"] == "refused" and e["role"] == "viewer" for e in refused)


# --------------------------------------------------------------------------- destinations and messages


async def test_destinations_show_depth_and_counters_after_documents_arrive(admin_env):
    c = admin_env.client
    before = {d["name"]: d for d in (await c.get(f"{API}/destinations", headers=BOB)).json()["destinations"]}
    assert before["queue://invoices.inbound"]["depth"] == 0  # a routed queue is listed before anything arrives
    await post_invoices(admin_env, "INV-1", "INV-2", "INV-3")
    fresh(admin_env)
    after = {d["name"]: d for d in (await c.get(f"{API}/destinations", headers=BOB)).json()["destinations"]}
    inv = after["queue://invoices.inbound"]
    assert (inv["depth"], inv["enqueued"], inv["in_flight"], inv["kind"]) == (3, 3, 0, "queue")
    assert inv["dead_letter_queue"] == "queue://DLQ.invoices.inbound"
    assert inv["oldest_age_s"] is not None and 0 <= inv["oldest_age_s"] < 60
    one = (await c.get(f"{API}/destination", params={"name": "invoices.inbound"}, headers=BOB)).json()
    assert one["name"] == "queue://invoices.inbound" and one["depth"] == 3 and one["history"]
    r = await c.get(f"{API}/destination", params={"name": "topic://prices"}, headers=BOB)
    assert r.status_code == 400 and r.json()["code"] == "invalid-request"


async def test_browse_pages_with_cursor_and_selector_then_open_a_message(admin_env):
    c = admin_env.client
    ids = await post_invoices(admin_env, *(f"INV-{i}" for i in range(7)))
    seen, cursor = [], None
    while True:
        params = {"destination": "queue://invoices.inbound", "limit": "3", **({"cursor": cursor} if cursor else {})}
        page = (await c.get(f"{API}/messages", params=params, headers=BOB)).json()
        assert len(page["messages"]) <= 3
        seen += [m["message_id"] for m in page["messages"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids
    page = (
        await c.get(
            f"{API}/messages",
            headers=BOB,
            params={"destination": "queue://invoices.inbound", "selector": "InvoiceID IN ('INV-2', 'INV-5')"},
        )
    ).json()
    assert [m["message_id"] for m in page["messages"]] == [ids[2], ids[5]]
    assert page["messages"][0]["properties"]["InvoiceID"] == "INV-2" and "body" not in page["messages"][0]
    r = await c.get(
        f"{API}/messages", headers=BOB, params={"destination": "queue://invoices.inbound", "selector": "InvoiceID = "}
    )
    assert r.status_code == 400 and r.json()["code"] == "invalid-request"
    r = await c.get(f"{API}/messages", headers=BOB, params={"destination": "queue://invoices.inbound", "limit": "0"})
    assert r.status_code == 400
    m = (
        await c.get(f"{API}/message", params={"destination": "queue://invoices.inbound", "id": ids[2]}, headers=BOB)
    ).json()
    sent = with_id(INVOICE, "INV-2")
    assert m["size"] == len(sent) and m["state"] == "pending" and m["persistent"] is True
    assert m["body"]["format"] == "xml" and "<cbc:ID>INV-2</cbc:ID>" in m["body"]["text"]
    assert m["body"]["text"].count("\n") > 20  # indented for reading
    r = await c.get(f"{API}/message", params={"destination": "queue://invoices.inbound", "id": "ID:none"}, headers=BOB)
    assert r.status_code == 404


async def test_replay_a_dead_letter_by_id_puts_it_and_its_document_back(admin_env):
    c = admin_env.client
    ids = await post_invoices(admin_env, "INV-D1", "INV-D2")
    dead_letter(admin_env, "invoices.inbound", 2)
    await wait_status(admin_env, ids[0], "dead_lettered")
    fresh(admin_env)
    dests = {d["name"]: d for d in (await c.get(f"{API}/destinations", headers=ALICE)).json()["destinations"]}
    assert dests["queue://invoices.inbound"]["dead_letter_depth"] == 2
    assert dests["queue://DLQ.invoices.inbound"]["kind"] == "dead-letter"
    assert dests["queue://DLQ.invoices.inbound"]["dead_letter_for"] == "queue://invoices.inbound"
    r = await c.post(
        f"{API}/actions/replay",
        headers=ALICE,
        json={"destination": "queue://DLQ.invoices.inbound", "message_ids": [ids[0]]},
    )
    assert r.status_code == 200, r.text
    assert r.json() == {
        "action": "replay",
        "destination": "queue://DLQ.invoices.inbound",
        "count": 1,
        "message_ids": [ids[0]],
        "ledger_documents": 1,
    }
    assert admin_env.broker.find_message("queue://DLQ.invoices.inbound", ids[0]) is None
    assert admin_env.broker.find_message("queue://invoices.inbound", ids[0]) is not None
    assert admin_env.gateway.ledger.get(ids[0]).status == "accepted"
    r = await c.post(
        f"{API}/actions/replay", headers=ALICE, json={"destination": "queue://invoices.inbound", "selector": "1 = 1"}
    )
    assert r.status_code == 400  # not a dead-letter queue
    refused, entry = (await c.get(f"{API}/audit", params={"action": "replay"}, headers=ALICE)).json()["entries"]
    assert (refused["outcome"], refused["target"]) == ("refused", "queue://invoices.inbound")
    assert (
        entry["operator"],
        entry["role"],
        entry["target"],
        entry["message_ids"],
        entry["count"],
        entry["outcome"],
    ) == ("alice", "operator", "queue://DLQ.invoices.inbound", [ids[0]], 1, "done")
    assert entry["client"] == "10.1.2.3" and entry["at"] <= int(time.time() * 1000)


async def test_delete_and_move_by_selector_with_a_limit_and_purge_with_confirmation(admin_env):
    c = admin_env.client
    ids = await post_invoices(admin_env, *(f"INV-M{i}" for i in range(6)))
    r = await c.post(
        f"{API}/actions/move",
        headers=ALICE,
        json={
            "destination": "queue://invoices.inbound",
            "target": "queue://invoices.parked",
            "selector": "InvoiceID LIKE 'INV-M%'",
            "limit": 2,
        },
    )
    assert r.status_code == 200 and r.json()["message_ids"] == ids[:2]
    assert [m.message_id for m in admin_env.broker.browse_page("queue://invoices.parked").messages] == ids[:2]
    r = await c.post(
        f"{API}/actions/delete",
        headers=ALICE,
        json={"destination": "queue://invoices.inbound", "message_ids": [ids[5], "ID:unknown"]},
    )
    assert r.json()["count"] == 1
    r = await c.post(f"{API}/actions/delete", headers=ALICE, json={"destination": "queue://invoices.inbound"})
    assert r.status_code == 400  # name the messages
    r = await c.post(
        f"{API}/actions/delete",
        headers=ALICE,
        json={"destination": "queue://invoices.inbound", "selector": "1 = 1", "limit": 0},
    )
    assert r.status_code == 400
    r = await c.post(f"{API}/actions/purge", headers=ALICE, json={"destination": "queue://invoices.inbound"})
    assert r.status_code == 400 and "confirm" in r.json()["detail"]
    r = await c.post(
        f"{API}/actions/purge",
        headers=ALICE,
        json={"destination": "queue://invoices.inbound", "confirm": "queue://invoices.inbound"},
    )
    assert r.status_code == 200 and r.json()["count"] == 3
    assert admin_env.broker.browse_page("queue://invoices.inbound").messages == []
    r = await c.post(f"{API}/actions/explode", headers=ALICE, json={"destination": "queue://invoices.inbound"})
    assert r.status_code == 404
    entries = (await c.get(f"{API}/audit", headers=ALICE)).json()["entries"]
    assert [(e["action"], e["outcome"], e["count"]) for e in entries[:6]] == [
        ("purge", "done", 3),
        ("purge", "refused", None),
        ("delete", "refused", None),
        ("delete", "refused", None),
        ("delete", "done", 1),
        ("move", "done", 2),
    ]
    assert entries[5]["target"] == "queue://invoices.inbound -> queue://invoices.parked"


# --------------------------------------------------------------------------- ledger, partners, ETL


async def test_ledger_search_by_ids_and_filters_pages_newest_first(admin_env):
    c = admin_env.client
    ids = await post_invoices(admin_env, *(f"INV-L{i}" for i in range(5)))
    found = (await c.get(f"{API}/documents", params={"doc_id": "INV-L3"}, headers=BOB)).json()["documents"]
    assert [d["message_id"] for d in found] == [ids[3]]
    record = admin_env.gateway.ledger.get(ids[1])
    found = (await c.get(f"{API}/documents", params={"correlation_id": record.correlation_id}, headers=BOB)).json()
    assert [d["message_id"] for d in found["documents"]] == [ids[1]]
    seen, cursor = [], None
    while True:
        params = {"partner": "globex", "doc_type": "Invoice", "limit": "2", **({"cursor": cursor} if cursor else {})}
        page = (await c.get(f"{API}/documents", params=params, headers=BOB)).json()
        seen += [d["message_id"] for d in page["documents"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == ids[::-1]
    assert (await c.get(f"{API}/documents", params={"partner": "acme"}, headers=BOB)).json()["documents"] == []
    future = (await c.get(f"{API}/documents", params={"since": "2999-01-01T00:00:00Z"}, headers=BOB)).json()
    assert future["documents"] == []
    for bad in ({"status": "lost"}, {"since": "yesterday"}, {"cursor": "nope"}, {"limit": "1000"}):
        r = await c.get(f"{API}/documents", params=bad, headers=BOB)
        assert r.status_code == 400, bad


async def test_a_document_has_its_history_timeline_request_and_reply(admin_env):
    from gwtest import ACME, ORDER

    c = admin_env.client
    r = await c.post("/v1/documents", content=with_id(ORDER, "PO-777"), headers=ACME)
    assert r.status_code == 200, r.text
    mid = r.headers["x-message-id"]
    await wait_status(admin_env, mid, "replied")  # the reply is recorded just after it is answered
    doc = (await c.get(f"{API}/documents/{mid}", headers=BOB)).json()
    assert doc["status"] == "replied" and doc["doc_id"] == "PO-777" and doc["partner"] == "acme"
    assert doc["auth"] == "key:acme-demo"  # the key's id, never the key
    assert [h["status"] for h in doc["history"]] == ["accepted", "replied"]
    assert [s["step"] for s in doc["timeline"]][:3] == ["received", "accepted", "replied"]
    assert "<cbc:ID>PO-777</cbc:ID>" in doc["document"]["xml"] and "OrderResponse" in doc["reply"]["xml"]
    assert doc["lineage"]["loaded_type"] is True and doc["lineage"]["state"] == "no-load-yet"
    r = await c.get(f"{API}/documents/{mid}/reply", headers=BOB)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/xml")
    assert b"OrderResponse" in r.content
    r = await c.get(f"{API}/documents/{mid}/request", headers=BOB)
    assert r.content == with_id(ORDER, "PO-777")
    assert (await c.get(f"{API}/documents/ID:none", headers=BOB)).status_code == 404


async def test_a_document_says_which_key_sent_it_in_the_api_and_on_the_console(admin_env):
    from gwtest import GLOBEX_KEY

    [mid] = await post_invoices(admin_env, "INV-AUTH")
    assert admin_env.gateway.ledger.get(mid).auth == "key:globex-demo"
    doc = (await admin_env.client.get(f"{API}/documents/{mid}", headers=BOB)).json()
    assert doc["auth"] == "key:globex-demo"
    await console_login(admin_env, "bob", "bob-secret-22")
    page = await admin_env.client.get(f"/console/ledger/{mid}")
    assert page.status_code == 200
    assert '<dd class="id" id="auth">key:globex-demo</dd>' in page.text
    assert GLOBEX_KEY.split(".", 1)[1] not in page.text and GLOBEX_KEY.split(".", 1)[1] not in str(doc)


async def test_partners_and_routes_count_documents_by_status(admin_env):
    c = admin_env.client
    await post_invoices(admin_env, "INV-P1", "INV-P2")
    partners = {p["id"]: p for p in (await c.get(f"{API}/partners", headers=BOB)).json()["partners"]}
    assert partners["globex"]["keys"] == ["globex-demo"] and partners["globex"]["enabled"] is True
    assert partners["globex"]["last_hour"]["accepted"] == 2 and partners["globex"]["last_day"]["accepted"] == 2
    assert partners["acme"]["last_hour"] == {}
    routes = {r["id"]: r for r in (await c.get(f"{API}/routes", headers=BOB)).json()["routes"]}
    assert routes["ubl-invoice"]["last_day"]["accepted"] == 2
    assert routes["ubl-order"]["exchange"] == "request-reply"
    assert (await c.get(f"{API}/etl/runs", headers=BOB)).json() == {"runs": []}


async def test_the_openapi_document_describes_the_admin_api(admin_env):
    doc = (await admin_env.client.get("/openapi.json")).json()
    for path in (
        "/session",
        "/destinations",
        "/messages",
        "/message",
        "/actions/{action}",
        "/documents",
        "/documents/{message_id}",
        "/partners",
        "/routes",
        "/etl/runs",
        "/audit",
    ):
        assert API + path in doc["paths"], path
    assert {"operatorSession", "operatorBasic"} <= set(doc["components"]["securitySchemes"])
    codes = doc["components"]["schemas"]["Problem"]["properties"]["code"]["enum"]
    assert {"forbidden", "csrf-failed", "too-many-login-attempts", "invalid-request"} <= set(codes)


async def test_without_operators_there_is_no_admin_side(make_assembly):
    assembly = make_assembly()
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    try:
        app = create_app(assembly, runtime=runtime)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test") as c:
            assert (await c.get(f"{API}/destinations")).status_code == 404
            assert (await c.get("/console")).status_code == 404
            assert (await c.get("/metrics")).status_code == 404  # never to anyone on the partner port by default
            assert not any(p.startswith("/admin") for p in (await c.get("/openapi.json")).json()["paths"])
    finally:
        runtime.stop()


# --------------------------------------------------------------------------- the console's pages over HTTP


async def console_login(env: GatewayEnv, name: str = "alice", secret: str = "alice-secret-1") -> None:
    c = env.client
    form = await c.get("/console/login")
    token = form.cookies.get("b2bgw_login") or c.cookies.get("b2bgw_login")
    assert token and f'value="{token}"' in form.text
    r = await c.post("/console/login", data={"csrf": token, "name": name, "secret": secret, "next": "/console"})
    assert r.status_code == 303 and r.headers["location"] == "/console"
    assert c.cookies.get("b2bgw_session")


async def test_console_pages_need_a_session_and_render_for_it(admin_env):
    c = admin_env.client
    r = await c.get("/console/ledger?doc_id=X")
    assert r.status_code == 303 and r.headers["location"].startswith("/console/login?next=")
    r = await c.post("/console/login", data={"csrf": "forged", "name": "alice", "secret": "alice-secret-1"})
    assert r.status_code == 303 and "error=" in r.headers["location"] and not c.cookies.get("b2bgw_session")
    await console_login(admin_env)
    [mid] = await post_invoices(admin_env, "INV-PAGES")
    fresh(admin_env)
    for path in (
        "/console",
        "/console/destinations",
        "/console/destinations?q=invoices&page=0",
        "/console/dead-letters",
        "/console/ledger?doc_id=INV-PAGES",
        f"/console/ledger/{mid}",
        "/console/partners",
        "/console/etl",
        "/console/audit",
        "/console/destination?name=queue%3A%2F%2Finvoices.inbound",
        f"/console/message?destination=queue%3A%2F%2Finvoices.inbound&id={mid}",
        "/console/fragments/destinations",
    ):
        r = await c.get(path)
        assert r.status_code == 200, (path, r.text[:300])
        assert r.headers["cache-control"] == "no-store"
    page = await c.get("/console")
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert "queue://invoices.inbound" in page.text
    assert (await c.get("/console/static/console.css")).headers["content-type"].startswith("text/css")
    missing = await c.get("/console/message?destination=queue%3A%2F%2Finvoices.inbound&id=ID:none")
    assert missing.status_code == 404 and "not in queue://invoices.inbound" in missing.text


async def test_console_actions_need_the_csrf_token_and_say_what_they_did(admin_env):
    c = admin_env.client
    await console_login(admin_env)
    [mid] = await post_invoices(admin_env, "INV-FORM-DEL")
    page = await c.get("/console/destination?name=queue%3A%2F%2Finvoices.inbound")
    token = page.text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    form = {
        "destination": "queue://invoices.inbound",
        "message_id": mid,
        "action": "delete",
        "return_to": "/console/destination?name=queue%3A%2F%2Finvoices.inbound",
    }
    r = await c.post("/console/actions", data={**form, "csrf": "wrong"})
    assert r.status_code == 403
    assert admin_env.broker.find_message("queue://invoices.inbound", mid) is not None
    r = await c.post("/console/actions", data={**form, "csrf": token})
    assert r.status_code == 303 and "done=Deleted+1+message" in r.headers["location"]
    assert admin_env.broker.find_message("queue://invoices.inbound", mid) is None
    r = await c.post("/console/actions", data={**form, "csrf": token, "return_to": "https://evil.example/"})
    assert r.headers["location"].startswith("/console?")  # never redirected off the console


# --------------------------------------------------------------------------- lineage, and the admin side's own port


@pytest.fixture
async def etl_env(make_assembly, tmp_path):
    assembly = make_assembly(operators=OPERATORS, etl={"enabled": False, "warehouse": str(tmp_path / "wh")})
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=True)
    runtime.start()
    app = create_app(assembly, runtime=runtime)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test")
    try:
        yield GatewayEnv(assembly, runtime, app, client, None), tmp_path / "wh"
    finally:
        await client.aclose()
        app.state.ops.service.close()
        runtime.stop()


async def test_a_loaded_document_shows_its_run_and_warehouse_rows_a_quarantined_one_why(etl_env):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from spark_etl import state

    env, warehouse = etl_env
    c = env.client
    loaded, quarantined = await post_invoices(env, "INV-W1", "INV-W2")
    conn = env.broker.connect()
    conn.start()
    consumer = conn.create_session().create_consumer(Queue("invoices.inbound"))
    assert consumer.receive(timeout=2) is not None and consumer.receive(timeout=2) is not None
    conn.close()
    await wait_status(env, loaded, "delivered")
    await wait_status(env, quarantined, "delivered")
    doc = (await c.get(f"{API}/documents/{loaded}", headers=BOB)).json()
    assert doc["lineage"]["state"] == "no-load-yet"
    engine = env.broker.engine
    state.upgrade(engine)
    doc = (await c.get(f"{API}/documents/{loaded}", headers=BOB)).json()
    assert doc["lineage"]["state"] == "waiting-for-load"
    delivered_seq = next(h["seq"] for h in doc["history"] if h["status"] == "delivered")
    run_id = state.start_run(engine, mode="incremental", owner="test", seq_from=0, seq_to=delivered_seq + 10)
    state.finish_run(
        engine,
        run_id,
        lease=None,
        quarantine_rows=[
            {
                "message_id": quarantined,
                "partner": "globex",
                "doc_type": "Invoice",
                "ledger_seq": delivered_seq + 1,
                "reason": "a decimal does not fit decimal(18,6)",
            }
        ],
        rows_written=1,
        loaded=1,
    )
    folder = warehouse / "fact_invoice" / "issue_date=2009-12-15"  # the example invoice's IssueDate
    folder.mkdir(parents=True)
    pq.write_table(
        pa.table(
            {
                "message_id": [loaded, "ID:someone-else"],
                "invoice_id": ["INV-W1", "X"],
                "payable_amount": ["729.000000", "1.000000"],
            }
        ),
        folder / "part-00000.parquet",
    )
    doc = (await c.get(f"{API}/documents/{loaded}", headers=BOB)).json()
    lineage = doc["lineage"]
    assert lineage["state"] == "loaded" and lineage["run"]["run_id"] == run_id
    assert lineage["rows"] == {
        "fact_invoice": [{"message_id": loaded, "invoice_id": "INV-W1", "payable_amount": "729.000000"}]
    }
    assert doc["timeline"][-1]["step"] == "warehouse" and f"run {run_id}" in doc["timeline"][-1]["detail"]
    other = (await c.get(f"{API}/documents/{quarantined}", headers=BOB)).json()
    assert other["lineage"]["state"] == "quarantined"
    assert "decimal(18,6)" in other["timeline"][-1]["detail"]
    runs = (await c.get(f"{API}/etl/runs", headers=BOB)).json()["runs"]
    assert [(r["run_id"], r["status"], r["rows_written"]) for r in runs] == [(run_id, "succeeded", 1)]


async def test_the_admin_side_can_have_a_listener_of_its_own(make_assembly):
    assembly = make_assembly(operators=OPERATORS, admin={"host": "127.0.0.1", "port": 0})
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    app = create_app(assembly, runtime=runtime)
    ops = app.state.ops
    await ops.started(runtime)
    try:
        port = ops.listener_port
        assert port
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as admin:
            assert (await admin.get(f"{API}/destinations", headers=ALICE)).status_code == 200
            assert (await admin.get("/metrics")).status_code == 200
            assert (await admin.get("/console")).status_code == 303  # to the login page
            assert (await admin.get("/v1/documents/ID:1")).status_code == 404  # no partner API here
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test") as public:
            for path in ("/console", f"{API}/destinations", "/metrics"):
                assert (await public.get(path, headers=ALICE)).status_code == 404, path
            assert (await public.get("/healthz")).status_code == 200
    finally:
        await ops.stopping()
        runtime.stop()
