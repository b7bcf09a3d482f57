"""The HTTP contract of the gateway, through the ASGI app on a temporary SQLite store.

Every status code of POST /v1/documents, idempotent replays (sequential and
concurrent), request-reply with an in-test responder (200, 504 then the late
reply through GET, 502), the ledger row existing iff the message is in its
queue, GET of another partner's document (404, like a missing one), status
reconciliation, the error format, and random requests never answered 500.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from gwtest import (
    ACME,
    ACME_KEY,
    DESPATCH_ADVICE,
    GLOBEX,
    GLOBEX_KEY,
    INVOICE,
    ORDER,
    ORDER_CANCELLATION,
    ORDER_CHANGE,
    with_id,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_core import Queue

pytestmark = pytest.mark.anyio

PROBLEM = "application/problem+json"


def problem(response) -> dict:
    assert response.headers["content-type"] == PROBLEM
    body = response.json()
    assert {"type", "title", "status", "detail", "code"} <= set(body)
    assert body["status"] == response.status_code
    assert body["type"] == f"urn:b2bgw:problem:{body['code']}"
    return body


async def post(env, document: bytes, headers: dict, **extra) -> object:
    return await env.client.post("/v1/documents", content=document, headers={**headers, **extra})


async def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


# --------------------------------------------------------------------------- one-way: 202


async def test_one_way_document_is_stored_before_the_receipt(gw_env):
    response = await post(gw_env, INVOICE, GLOBEX, **{"X-Correlation-ID": "corr-inv-1"})
    assert response.status_code == 202
    receipt = response.json()
    assert receipt["route"] == "ubl-invoice"
    assert receipt["correlation_id"] == "corr-inv-1"
    assert receipt["document_type"] == "Invoice" and receipt["document_id"] == "TOSL108"
    assert receipt["status"] == "accepted"
    assert receipt["status_url"] == f"/v1/documents/{receipt['message_id']}"
    assert response.headers["location"] == receipt["status_url"]
    assert response.headers["x-message-id"] == receipt["message_id"]
    assert response.headers["x-correlation-id"] == "corr-inv-1"

    # the receipt came after the commit: message and ledger row are both there now
    [message] = gw_env.messages("invoices.inbound")
    assert message.jms_message_id == receipt["message_id"]
    assert message.jms_correlation_id == "corr-inv-1"
    assert message.jms_type == "Invoice"
    assert message.get_string_property("JMSXUserID") == "globex"
    assert message.get_string_property("B2BRoute") == "ubl-invoice"
    assert message.get_string_property("B2BDocumentID") == "TOSL108"
    assert message.get_string_property("InvoiceID") == "TOSL108"
    assert message.get_string_property("Currency") == "EUR"
    assert message.get_object_property("TotalAmount") == pytest.approx(729.0)
    assert isinstance(message.get_object_property("TotalAmount"), float)
    assert message.text.encode() == INVOICE.decode("utf-8").encode()
    assert message.jms_expiration > 0  # the route's time_to_live
    [row] = gw_env.ledger_rows()
    assert row.message_id == receipt["message_id"] and row.partner == "globex" and row.status == "accepted"
    assert row.document == INVOICE and row.route == "ubl-invoice" and row.destination == "queue://invoices.inbound"
    assert row.idempotency_key.startswith("globex|") and row.doc_id == "TOSL108"


async def test_every_sample_route_accepts_its_ubl_example(gw_env):
    for document, headers, _queue in [
        (ORDER_CHANGE, ACME, "orders.changes"),
        (ORDER_CANCELLATION, ACME, "orders.changes"),
        (DESPATCH_ADVICE, GLOBEX, "despatch.inbound"),
        (INVOICE, GLOBEX, "invoices.inbound"),
    ]:
        response = await post(gw_env, document, headers)
        assert response.status_code == 202, response.text
    assert gw_env.depth("orders.changes") == 2
    assert gw_env.depth("despatch.inbound") == 1
    assert {m.jms_type for m in gw_env.messages("orders.changes")} == {"OrderChange", "OrderCancellation"}


async def test_receipt_body_is_the_ledgers_receipt_and_the_text_is_the_document_without_bom(gw_env):
    import codecs

    document = codecs.BOM_UTF8 + with_id(INVOICE, "BOM-1")
    response = await post(gw_env, document, GLOBEX)
    assert response.status_code == 202
    [row] = [r for r in gw_env.ledger_rows() if r.doc_id == "BOM-1"]
    assert response.content == row.receipt.encode("utf-8")
    assert json.loads(row.receipt) == response.json()
    [message] = [m for m in gw_env.messages("invoices.inbound") if m.get_string_property("B2BDocumentID") == "BOM-1"]
    assert message.text == document[3:].decode("utf-8") and row.document == document[3:]
    latin = (
        "<?xml version='1.0' encoding='ISO-8859-1'?>" + with_id(INVOICE, "LATIN-1").decode("utf-8").split("?>", 1)[1]
    ).encode("latin-1", "replace")
    response = await post(gw_env, latin, GLOBEX)
    assert response.status_code == 202, response.text
    [message] = [m for m in gw_env.messages("invoices.inbound") if m.get_string_property("B2BDocumentID") == "LATIN-1"]
    assert message.text.startswith("<Invoice")  # re-serialised as text, not the latin-1 bytes decoded


async def test_a_transformed_document_is_stored_as_the_transform_made_it(make_assembly, tmp_path):
    """The message carries the transform's output; the ledger keeps the document as received."""
    import httpx
    from gwtest import GatewayEnv, sample_data

    from gateway.http.app import create_app
    from gateway.runtime.serving import Runtime

    (tmp_path / "slim.xsl").write_text(
        """<xsl:stylesheet version="1.0"
    xmlns:xsl="http://www.w3.org/1999/XSL/Transform" exclude-result-prefixes="i cbc"
    xmlns:i="urn:oasis:names:specification:ubl:schema:xsd:Invoice-2"
    xmlns:cbc="urn:oasis:names:specification:ubl:schema:xsd:CommonBasicComponents-2">
  <xsl:output method="xml" omit-xml-declaration="yes"/>
  <xsl:template match="/i:Invoice"><SlimInvoice id="{cbc:ID}">Ünïcode</SlimInvoice></xsl:template>
</xsl:stylesheet>""",
        encoding="utf-8",
    )
    data = sample_data(tmp_path)
    [invoice_route] = [r for r in data["routes"] if r["destination"] == "queue://invoices.inbound"]
    invoice_route["transform"] = str(tmp_path / "slim.xsl")
    runtime = Runtime(make_assembly(data), workers=False, etl=False, reconcile=False)
    runtime.start()
    app = create_app(runtime.assembly, runtime=runtime)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test")
    try:
        env = GatewayEnv(runtime.assembly, runtime, app, client, None)
        response = await post(env, with_id(INVOICE, "SLIM-1"), GLOBEX)
        assert response.status_code == 202, response.text
        [message] = env.messages("invoices.inbound")  # read back from its row
        assert message.text.strip() == '<SlimInvoice id="SLIM-1">Ünïcode</SlimInvoice>'
        [row] = [r for r in env.ledger_rows() if r.doc_id == "SLIM-1"]
        assert row.document == with_id(INVOICE, "SLIM-1")
    finally:
        await client.aclose()
        runtime.stop()


async def test_correlation_id_is_generated_when_absent(gw_env):
    response = await post(gw_env, INVOICE, GLOBEX)
    assert len(response.json()["correlation_id"]) == 36


# --------------------------------------------------------------------------- idempotency


async def test_sequential_replay_returns_the_first_receipt_and_enqueues_once(gw_env):
    first = await post(gw_env, INVOICE, GLOBEX)
    again = await post(gw_env, INVOICE, GLOBEX, **{"X-Correlation-ID": "other"})
    assert again.status_code == 202
    assert again.json() == first.json()
    assert again.headers["idempotent-replayed"] == "true"
    assert gw_env.depth("invoices.inbound") == 1
    assert len(gw_env.ledger_rows()) == 1
    # another document id is another document
    assert (await post(gw_env, with_id(INVOICE, "TOSL109"), GLOBEX)).json()["message_id"] != first.json()["message_id"]
    assert gw_env.depth("invoices.inbound") == 2


async def test_idempotency_key_header_decides_and_is_scoped_per_partner(gw_env):
    a = await post(gw_env, with_id(ORDER_CHANGE, "C1"), ACME, **{"Idempotency-Key": "k-1"})
    same = await post(gw_env, with_id(ORDER_CHANGE, "C1"), ACME, **{"Idempotency-Key": "k-1"})
    assert same.json() == a.json() and same.headers["idempotent-replayed"] == "true"
    b = await post(gw_env, with_id(ORDER_CHANGE, "C2"), ACME, **{"Idempotency-Key": "k-1"})  # another document
    assert b.status_code == 409 and problem(b)["code"] == "idempotency-conflict"
    assert problem(b)["message_id"] == a.json()["message_id"]
    c = await post(gw_env, with_id(INVOICE, "I9"), GLOBEX, **{"Idempotency-Key": "k-1"})
    assert c.status_code == 202 and c.json()["message_id"] != a.json()["message_id"]
    assert gw_env.depth("orders.changes") == 1 and gw_env.depth("invoices.inbound") == 1


async def test_concurrent_duplicates_enqueue_once(gw_env):
    responses = await asyncio.gather(*[post(gw_env, DESPATCH_ADVICE, GLOBEX) for _ in range(12)])
    assert {r.status_code for r in responses} == {202}
    assert len({r.json()["message_id"] for r in responses}) == 1
    assert gw_env.depth("despatch.inbound") == 1
    assert len(gw_env.ledger_rows()) == 1


async def test_concurrent_distinct_documents_all_enqueue(gw_env):
    responses = await asyncio.gather(*[post(gw_env, with_id(INVOICE, f"INV-{i}"), GLOBEX) for i in range(20)])
    assert {r.status_code for r in responses} == {202}
    assert gw_env.depth("invoices.inbound") == 20
    assert len(gw_env.ledger_rows()) == 20


async def test_ledger_row_exists_iff_message_is_enqueued(gw_env):
    accepted = await post(gw_env, DESPATCH_ADVICE, GLOBEX)
    refused = [
        await post(gw_env, with_id(DESPATCH_ADVICE, "X1"), ACME),  # 403
        await post(gw_env, DESPATCH_ADVICE.replace(b"<cbc:IssueDate>2024-03-14", b"<cbc:IssueDate>soon"), GLOBEX),
        await post(gw_env, b"<oops", GLOBEX),
    ]
    assert [r.status_code for r in refused] == [403, 400, 400]
    ids = {m.jms_message_id for m in gw_env.messages("despatch.inbound")}
    assert ids == {row.message_id for row in gw_env.ledger_rows()} == {accepted.json()["message_id"]}


# --------------------------------------------------------------------------- request-reply: 200, 504, 502


async def test_request_reply_returns_the_order_response(gw_env):
    response = await post(gw_env, ORDER, ACME, **{"X-Correlation-ID": "po-34"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/xml")
    assert b"<OrderResponse" in response.content and b"<cbc:ID>OR-34</cbc:ID>" in response.content
    message_id = response.headers["x-message-id"]
    assert response.headers["x-correlation-id"] == "po-34"
    assert response.headers["content-location"] == f"/v1/documents/{message_id}"
    [request] = gw_env.responder.seen
    assert request.jms_message_id == message_id
    assert request.jms_reply_to is not None and request.jms_reply_to.is_temporary
    assert request.jms_type == "Order" and request.get_string_property("JMSXUserID") == "acme"
    assert request.get_object_property("TotalAmount") == 6225.0
    assert request.get_string_property("BuyerName") == "Johnssons byggvaror"
    assert request.get_string_property("SellerName") == "Moderna Produkter AB"

    status = (await gw_env.client.get(f"/v1/documents/{message_id}", headers=ACME)).json()
    assert status["status"] == "replied"
    assert status["reply"] == response.text and status["reply_type"] == "OrderResponse"
    assert [h["status"] for h in status["history"]] == ["accepted", "replied"]
    raw = await gw_env.client.get(f"/v1/documents/{message_id}/reply", headers=ACME)
    assert raw.status_code == 200 and raw.content == response.content

    again = await post(gw_env, ORDER, ACME)  # a replay answers the same reply, without a second request
    assert again.status_code == 200 and again.content == response.content
    assert again.headers["idempotent-replayed"] == "true"
    assert len(gw_env.responder.seen) == 1


async def test_concurrent_orders_each_get_their_own_reply(gw_env):
    # the replies wait 0.5 s, so that all 15 requests are in flight at once (intake threads may otherwise let
    # the first round trip end before the last request starts, and its correlation id is then free again)
    gw_env.responder.mode, gw_env.responder.delay = "late", 0.5
    ids = [f"PO-{i}" for i in range(15)]
    responses = await asyncio.gather(
        *[post(gw_env, with_id(ORDER, i), ACME, **{"X-Correlation-ID": "same-for-all"}) for i in ids]
    )
    assert [r.status_code for r in responses] == [200] * len(ids)
    for order_id, response in zip(ids, responses, strict=False):
        assert f"<cbc:ID>OR-{order_id}</cbc:ID>".encode() in response.content
    # the partner's correlation id is kept, made unique where two were in flight at once
    assert all(r.headers["x-correlation-id"].startswith("same-for-all") for r in responses)
    assert len({r.headers["x-correlation-id"] for r in responses}) == len(ids)


async def test_504_then_get_returns_the_late_reply(gw_env):
    gw_env.responder.mode, gw_env.responder.delay = "late", 1.9
    response = await post(gw_env, ORDER, ACME)
    assert response.status_code == 504
    body = problem(response)
    assert body["code"] == "reply-timeout"
    message_id = body["message_id"]
    assert body["status_url"] == f"/v1/documents/{message_id}" and response.headers["x-message-id"] == message_id
    status = (await gw_env.client.get(body["status_url"], headers=ACME)).json()
    assert status["status"] in ("accepted", "delivered") and status["reply"] is None
    assert (await gw_env.client.get(body["status_url"] + "/reply", headers=ACME)).status_code == 404

    async def replied():
        return (await gw_env.client.get(body["status_url"], headers=ACME)).json()

    deadline = time.monotonic() + 5
    status = await replied()
    while status["status"] != "replied" and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        status = await replied()
    assert status["status"] == "replied"
    assert "<OrderResponse" in status["reply"]
    # and the replay of the document now answers the reply
    again = await post(gw_env, ORDER, ACME)
    assert again.status_code == 200 and again.text == status["reply"]


async def test_replay_while_no_reply_answers_504_without_resending(gw_env):
    gw_env.responder.mode = "silent"
    first = await post(gw_env, ORDER, ACME)
    assert first.status_code == 504
    again = await post(gw_env, ORDER, ACME)
    assert again.status_code == 504 and problem(again)["message_id"] == problem(first)["message_id"]
    assert len(gw_env.responder.seen) == 1
    assert gw_env.depth("orders.inbound") == 0


async def test_backend_error_reply_is_502_and_failed(gw_env):
    gw_env.responder.mode = "error"
    response = await post(gw_env, ORDER, ACME)
    assert response.status_code == 502
    body = problem(response)
    assert body["code"] == "backend-error" and "out of stock" in body["detail"]
    status = (await gw_env.client.get(body["status_url"], headers=ACME)).json()
    assert status["status"] == "failed" and "out of stock" in status["error"]


# --------------------------------------------------------------------------- GET and status


async def test_get_of_another_partners_document_is_404_like_a_missing_one(gw_env):
    receipt = (await post(gw_env, INVOICE, GLOBEX)).json()
    mine = await gw_env.client.get(receipt["status_url"], headers=GLOBEX)
    assert mine.status_code == 200 and mine.json()["status"] == "accepted"
    theirs = await gw_env.client.get(receipt["status_url"], headers=ACME)
    missing = await gw_env.client.get("/v1/documents/ID:nothing-1", headers=ACME)
    assert theirs.status_code == missing.status_code == 404
    assert problem(theirs)["detail"].replace(receipt["message_id"], "X") == problem(missing)["detail"].replace(
        "ID:nothing-1", "X"
    )
    assert (await gw_env.client.get(receipt["status_url"] + "/reply", headers=ACME)).status_code == 404
    assert (await gw_env.client.get(receipt["status_url"])).status_code == 401


async def test_status_follows_delivery_and_dead_letters(gw_env):
    delivered = (await post(gw_env, with_id(INVOICE, "A"), GLOBEX)).json()
    dead = (await post(gw_env, with_id(INVOICE, "B"), GLOBEX)).json()
    conn = gw_env.broker.connect()
    conn.start()
    from broker_core import AckMode

    session = conn.create_session(False, AckMode.CLIENT)
    consumer = session.create_consumer(Queue("invoices.inbound"))
    for _ in range(3):  # take "A"; fail "B" until it is dead-lettered (max_deliveries=2)
        message = consumer.receive(2)
        if message is None:
            break
        if message.jms_message_id == delivered["message_id"]:
            message.acknowledge()
        else:
            session.recover()
    conn.close()
    # GET refreshes a single document at once
    status = (await gw_env.client.get(delivered["status_url"], headers=GLOBEX)).json()
    assert status["status"] == "delivered"
    assert [h["status"] for h in status["history"]] == ["accepted", "delivered"]
    # and the background reconciler does it for the others
    await wait_for(
        lambda: {r.message_id: r.status for r in gw_env.ledger_rows()}[dead["message_id"]] == "dead_lettered"
    )
    assert (await gw_env.client.get(dead["status_url"], headers=GLOBEX)).json()["status"] == "dead_lettered"


async def test_get_shows_a_move_the_background_reconciler_made_meanwhile(gw_env, monkeypatch):
    receipt = (await post(gw_env, with_id(INVOICE, "R"), GLOBEX)).json()
    from broker_core import AckMode

    conn = gw_env.broker.connect()
    conn.start()
    message = conn.create_session(False, AckMode.CLIENT).create_consumer(Queue("invoices.inbound")).receive(2)
    message.acknowledge()  # returns once committed (AUTO's acknowledgement would be deferred)
    conn.close()
    reconciler = gw_env.runtime.reconciler
    real_refresh = reconciler.refresh

    def reconciler_got_there_first(documents):
        real_refresh(documents)  # the background pass moves it after the GET read it as accepted...
        return real_refresh(documents)  # ...so the GET's own refresh finds nothing left to move

    monkeypatch.setattr(reconciler, "refresh", reconciler_got_there_first)
    status = (await gw_env.client.get(receipt["status_url"], headers=GLOBEX)).json()
    assert status["status"] == "delivered"
    assert [h["status"] for h in status["history"]] == ["accepted", "delivered"]


# --------------------------------------------------------------------------- the errors


async def test_400_not_well_formed_lists_line_and_column(gw_env):
    response = await post(gw_env, b"<Invoice>\n  <a>\n</Invoice>", GLOBEX)
    assert response.status_code == 400
    body = problem(response)
    assert body["code"] == "not-well-formed"
    assert body["errors"] and body["errors"][0]["line"] in (2, 3) and body["errors"][0]["column"]


async def test_400_schema_invalid_lists_every_error_with_path(gw_env):
    bad = INVOICE.replace(b"<cbc:IssueDate>2009-12-15", b"<cbc:IssueDate>15.12.2009")
    bad = bad.replace(b"<cbc:InvoiceTypeCode", b"<cbc:Bogus>1</cbc:Bogus><cbc:InvoiceTypeCode")
    response = await post(gw_env, bad, GLOBEX)
    assert response.status_code == 400
    body = problem(response)
    assert body["code"] == "schema-invalid" and len(body["errors"]) >= 2
    paths = [e["path"] for e in body["errors"]]
    assert "/Invoice/cbc:IssueDate" in paths
    assert all(e["line"] and e["column"] and e["message"] for e in body["errors"])
    assert gw_env.depth("invoices.inbound") == 0


async def test_401_403_415_422(gw_env):
    assert problem(await post(gw_env, INVOICE, {"Content-Type": "application/xml"}))["code"] == "unauthenticated"
    unknown = await post(gw_env, INVOICE, {**GLOBEX, "Authorization": "Bearer globex-demo.wrongwrongwrongwrongwrong"})
    assert unknown.status_code == 401 and unknown.headers["www-authenticate"].startswith("Bearer")
    basic = await post(gw_env, INVOICE, {**GLOBEX, "Authorization": "Basic Z2xvYmV4OnNlY3JldA=="})
    assert basic.status_code == 401

    forbidden = await post(gw_env, INVOICE, ACME)
    assert forbidden.status_code == 403 and problem(forbidden)["code"] == "forbidden-route"

    media = await post(gw_env, INVOICE, {**GLOBEX, "Content-Type": "application/json"})
    assert media.status_code == 415 and problem(media)["code"] == "unsupported-media-type"
    text_xml = await post(gw_env, INVOICE, {**GLOBEX, "Content-Type": "text/xml; charset=utf-8"})
    assert text_xml.status_code == 202

    quotation = gw_env.assembly.settings.base_dir.parent / "q.xml"
    document = b'<Quotation xmlns="urn:oasis:names:specification:ubl:schema:xsd:Quotation-2"/>'
    no_route = await post(gw_env, document, GLOBEX)
    assert no_route.status_code == 422
    detail = problem(no_route)["detail"]
    assert "Quotation" in detail and "urn:oasis:names:specification:ubl:schema:xsd:Quotation-2" in detail
    assert "'globex'" in detail
    del quotation


async def test_413_by_content_length_and_by_stream(gw_env, make_assembly):
    limit = gw_env.assembly.settings.limits.max_bytes
    big = b"<a>" + b"x" * (limit + 10) + b"</a>"
    response = await post(gw_env, big, GLOBEX)
    assert response.status_code == 413 and problem(response)["code"] == "document-too-large"
    assert response.headers["connection"] == "close"

    async def chunks():
        for _ in range(limit // 65536 + 2):
            yield b"x" * 65536

    streamed = await gw_env.client.post("/v1/documents", content=chunks(), headers=GLOBEX)
    assert streamed.status_code == 413


async def test_400_for_malformed_headers(gw_env):
    bad = await post(gw_env, INVOICE, GLOBEX, **{"X-Correlation-ID": "has space"})
    assert bad.status_code == 400 and problem(bad)["code"] == "invalid-header"
    assert problem(bad)["header"] == "X-Correlation-ID"
    too_long = await post(gw_env, INVOICE, GLOBEX, **{"Idempotency-Key": "k" * 201})
    assert too_long.status_code == 400


async def test_unknown_paths_and_methods_are_problems(gw_env):
    assert problem(await gw_env.client.get("/v2/nothing"))["code"] == "not-found"
    not_allowed = await gw_env.client.put("/v1/documents", content=b"<a/>")
    assert not_allowed.status_code == 405 and "POST" in not_allowed.headers["allow"]
    assert problem(not_allowed)["code"] == "method-not-allowed"


async def test_health_readiness_and_openapi(gw_env):
    assert (await gw_env.client.get("/healthz")).json() == {"status": "ok"}
    assert (await gw_env.client.get("/readyz")).json() == {"status": "ready"}
    spec = (await gw_env.client.get("/openapi.json")).json()
    assert spec["openapi"].startswith("3.1")
    post_doc = spec["paths"]["/v1/documents"]["post"]
    assert {"200", "202", "400", "401", "403", "413", "415", "422", "504"} <= set(post_doc["responses"])
    gw_env.gateway.stop()
    not_ready = await gw_env.client.get("/readyz")
    assert not_ready.status_code == 503 and problem(not_ready)["code"] == "store-unavailable"


async def test_error_bodies_are_bounded(gw_env):
    lines = b"".join(b"<cbc:Note>n</cbc:Note><cbc:Bogus%d/>" % i for i in range(400))
    bad = INVOICE.replace(b"<cbc:InvoiceTypeCode", lines + b"<cbc:InvoiceTypeCode")
    response = await post(gw_env, bad, GLOBEX)
    assert response.status_code == 400
    assert len(response.content) <= 64 * 1024
    body = problem(response)
    assert len(body["errors"]) <= 50


# --------------------------------------------------------------------------- the direct path for POST


async def test_post_documents_bypasses_the_router_and_answers_like_it(gw_env):
    """POST /v1/documents is served without Starlette's router and middleware; under a root_path it goes
    through them. Both answer with the same statuses, headers and bodies."""
    import httpx

    app = gw_env.app
    assert set(app.fast_posts) == {"/v1/documents"}
    routed = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, root_path="/gw"), base_url="http://gw.test")

    async def failing_stack(scope, receive, send):
        raise AssertionError(f"the router was used for {scope['method']} {scope['path']}")

    cases = [
        ("one-way", with_id(INVOICE, "FAST-1"), GLOBEX, {"X-Correlation-ID": "c-1"}),
        ("replay", with_id(INVOICE, "FAST-1"), GLOBEX, {}),
        ("request-reply", with_id(ORDER, "FAST-2"), ACME, {"Idempotency-Key": "k-fast-2"}),
        ("no key", INVOICE, {"Content-Type": "application/xml"}, {}),
        ("media type", INVOICE, {**GLOBEX, "Content-Type": "text/plain"}, {}),
        ("bad header", INVOICE, GLOBEX, {"X-Correlation-ID": "has space"}),
        ("not well-formed", b"<Invoice>", GLOBEX, {}),
        ("no route", b"<a/>", GLOBEX, {}),
    ]
    try:
        for name, document, headers, extra in cases:
            stack, app.middleware_stack = app.middleware_stack, failing_stack
            try:
                direct = await post(gw_env, document, headers, **extra)
            finally:
                app.middleware_stack = stack
            if name == "one-way":  # the routed request is then a replay of it
                again = await routed.post("/v1/documents", content=document, headers={**headers, **extra})
                assert again.headers["idempotent-replayed"] == "true" and again.json() == direct.json()
                continue
            if name == "request-reply":  # a replay too: the same reply document
                again = await routed.post("/v1/documents", content=document, headers={**headers, **extra})
                assert again.status_code == 200 and again.content == direct.content
                assert again.headers["idempotent-replayed"] == "true"
                assert [k for k in again.headers if k != "idempotent-replayed"] == list(direct.headers)
                continue
            via_router = await routed.post("/v1/documents", content=document, headers={**headers, **extra})
            assert direct.status_code == via_router.status_code, name
            assert list(direct.headers) == list(via_router.headers), name
            for header in (
                "content-type",
                "content-length",
                "location",
                "x-route-id",
                "cache-control",
                "idempotent-replayed",
                "connection",
            ):
                assert direct.headers.get(header) == via_router.headers.get(header), (name, header)
            if direct.headers["content-type"] == PROBLEM:
                a, b = direct.json(), via_router.json()
                assert a == {**b, "instance": a["instance"]}, name
            else:
                assert direct.json() == via_router.json(), name
    finally:
        await routed.aclose()


async def test_post_documents_direct_path_reads_a_streamed_body_and_refuses_a_large_one(gw_env):
    async def chunks(document: bytes):
        for i in range(0, len(document), 1000):
            yield document[i : i + 1000]

    response = await gw_env.client.post("/v1/documents", content=chunks(with_id(INVOICE, "STREAM-1")), headers=GLOBEX)
    assert response.status_code == 202 and response.json()["document_id"] == "STREAM-1"
    limit = gw_env.assembly.settings.limits.max_bytes
    declared = await post(gw_env, b"<a/>", {**GLOBEX, "Content-Length": str(limit + 1)})
    assert declared.status_code == 413


async def test_noop_endpoint_uses_the_same_direct_path(make_assembly):
    import httpx

    from gateway.http.app import create_app

    app = create_app(make_assembly(), noop_endpoint=True)
    assert set(app.fast_posts) == {"/v1/documents", "/v1/noop"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test") as client:
        response = await client.post("/v1/noop", content=b"<a>12345</a>", headers={"Content-Type": "application/xml"})
    assert response.status_code == 202 and response.json() == {"status": "noop", "bytes": 12}
    assert response.headers["content-type"] == "application/json"


def test_serve_freezes_the_startup_objects_out_of_the_collector(monkeypatch):
    import gc

    from gateway.cli import serve as serve_cli

    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append("collect") or 0)
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    serve_cli._freeze_startup_objects()
    assert calls == ["collect", "freeze"]


# --------------------------------------------------------------------------- random requests


_HEADER_VALUE = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    auth=st.sampled_from([None, f"Bearer {ACME_KEY}", f"Bearer {GLOBEX_KEY}", "Bearer x.y", "Basic abc", ""]),
    content_type=st.sampled_from(
        [
            None,
            "application/xml",
            "text/xml; charset=iso-8859-1",
            "application/ubl+xml",
            "text/plain",
            "application/xml; charset=nope",
        ]
    ),
    correlation=st.one_of(st.none(), _HEADER_VALUE),
    key=st.one_of(st.none(), _HEADER_VALUE),
    body=st.one_of(
        st.binary(max_size=300),
        st.sampled_from(
            [
                ORDER_CHANGE,
                INVOICE,
                DESPATCH_ADVICE,
                b"<a/>",
                b"<?xml version='1.0'?>",
                b"<!DOCTYPE a [<!ENTITY e SYSTEM 'file:///etc/passwd'>]><a>&e;</a>",
            ]
        ),
        st.text(max_size=200).map(lambda t: f"<Invoice>{t}</Invoice>".encode("utf-8", "surrogatepass")),
    ),
)
def test_random_requests_never_500(gw_sync, auth, content_type, correlation, key, body):
    client, _runtime, _responder = gw_sync
    headers = {}
    if auth is not None:
        headers["Authorization"] = auth
    if content_type is not None:
        headers["Content-Type"] = content_type
    if correlation is not None:
        headers["X-Correlation-ID"] = correlation
    if key is not None:
        headers["Idempotency-Key"] = key
    response = client.post("/v1/documents", content=body, headers=headers)
    assert response.status_code in (200, 202, 400, 401, 403, 409, 413, 415, 422), response.text
    if response.status_code >= 400:
        assert response.headers["content-type"] == PROBLEM
        assert len(response.content) < 70_000
        json.loads(response.content)


# --------------------------------------------------------------------------- what `serve` runs beside the API


async def test_serve_runs_the_sample_responder_and_the_nightly_load(make_assembly, monkeypatch):
    """The runtime of `b2bgw serve`: the configured workers answer in-process, the ETL is scheduled."""
    import httpx

    import spark_etl.scheduler
    from gateway.http.app import create_app
    from gateway.runtime.serving import Runtime

    started = []

    class FakeLoad:
        def __init__(self, settings, db_url):
            started.append(("init", settings, db_url))

        def start(self):
            started.append("start")

        def stop(self):
            started.append("stop")

    monkeypatch.setattr(spark_etl.scheduler, "NightlyLoad", FakeLoad)
    assembly = make_assembly(
        workers=[{"module": "gateway.samples.order_responder", "concurrency": 2}],
        etl={"enabled": True, "schedule": "0 3 * * *"},
    )
    runtime = Runtime(assembly)  # workers and ETL as configured, like the app's lifespan
    runtime.start()
    try:
        assert [h.concurrency for h in runtime.worker.handlers if h.name == "order_responder"] == [2]
        assert started[0] == ("init", {"enabled": True, "schedule": "0 3 * * *"}, assembly.settings.store_url)
        assert started[1] == "start"
        app = create_app(assembly, runtime=runtime)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test") as client:
            response = await client.post("/v1/documents", content=ORDER, headers=ACME)
        assert response.status_code == 200, response.text
        assert b"<cbc:ID>OR-34</cbc:ID>" in response.content
    finally:
        runtime.stop()
    assert started[-1] == "stop"
