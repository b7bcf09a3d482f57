"""Handlers behind the whole gateway: a partner POSTs a document over HTTP, a
handler of gateway.handlers answers it (or takes it), and the partner sees
what the HTTP contract says: 200 with the reply, 502 backend-error for a
BusinessError, 504 and a dead-lettered document for a Reject; one-way
documents taken by the sample receivers become ``delivered``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from gwtest import (
    ACME,
    DESPATCH_ADVICE,
    GLOBEX,
    INVOICE,
    ORDER,
    ORDER_CANCELLATION,
    ORDER_CHANGE,
    SAMPLE_CONFIG,
    with_id,
)

from gateway.config.loader import load_yaml
from gateway.handlers import BusinessError, Reject, Worker, handler
from gateway.http.app import create_app
from gateway.runtime.serving import Runtime
from gateway.samples.order_responder import ORDERS_QUEUE, respond, respond_async

pytestmark = pytest.mark.anyio


@asynccontextmanager
async def gateway(
    make_assembly: Callable[..., Any], handlers: list[Any] | None = None, **changes: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, Runtime, Worker | None]]:
    """The sample gateway on a fresh SQLite store; ``handlers`` run in a Worker of their own
    (else the runtime starts the workers the configuration names)."""
    assembly = make_assembly(**changes)
    runtime = Runtime(assembly, workers=handlers is None, etl=False, reconcile=True)
    runtime.start()
    worker = None
    try:
        if handlers is not None:
            worker = Worker(runtime.broker, handlers)
            worker.start()
        app = create_app(assembly, runtime=runtime)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test") as client:
            yield client, runtime, worker
    finally:
        if worker is not None:
            worker.stop()
        runtime.stop()


async def wait_for_status(client: httpx.AsyncClient, url: str, headers: dict, want: str, timeout: float = 15.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = (await client.get(url, headers=headers)).json()
        if body["status"] == want or time.monotonic() > deadline:
            assert body["status"] == want, body
            return body
        await asyncio.sleep(0.05)


async def test_sync_and_async_responders_answer_orders_side_by_side(make_assembly):
    """The sample responder written both ways, each taking its share of the
    orders (by the OrderID property the route sets): every order gets its
    OrderResponse over HTTP."""
    plain = handler(ORDERS_QUEUE, selector="OrderID LIKE 'S-%'", name="plain", registry=None)(respond.function)
    coroutine = handler(ORDERS_QUEUE, selector="OrderID LIKE 'A-%'", name="coroutine", registry=None)(
        respond_async.function
    )
    assert coroutine.is_async and not plain.is_async
    async with gateway(make_assembly, [plain, coroutine]) as (client, runtime, worker):
        ids = ["S-1", "A-1", "S-2", "A-2"]
        responses = await asyncio.gather(
            *(client.post("/v1/documents", content=with_id(ORDER, i), headers=ACME) for i in ids)
        )
        for order_id, response in zip(ids, responses, strict=False):
            assert response.status_code == 200, response.text
            assert response.headers["content-type"].startswith("application/xml")
            assert f"<cbc:ID>OR-{order_id}</cbc:ID>".encode() in response.content
            assert b"OrderResponse-2" in response.content
        deadline = time.monotonic() + 5
        while sum(s.handled for s in worker.stats().values()) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        stats = worker.stats()
    assert stats["plain"].handled == 2 and stats["coroutine"].handled == 2


async def test_a_crash_in_an_async_handler_is_redelivered_and_the_order_still_answered(make_assembly):
    attempts: list[int] = []

    @handler(ORDERS_QUEUE, name="flaky", registry=None)
    async def flaky(message, context):
        attempts.append(message.get_int_property("JMSXDeliveryCount"))
        await context.send("audit.orders", "<Seen/>")
        if len(attempts) == 1:
            raise RuntimeError("the ERP connection dropped")
        return await respond_async.function(message, context)

    async with gateway(make_assembly, [flaky]) as (client, runtime, worker):
        response = await client.post("/v1/documents", content=ORDER, headers=ACME)
        assert response.status_code == 200, response.text
        assert b"<cbc:ID>OR-34</cbc:ID>" in response.content
        audit = [m.text for m in runtime.broker.browse("queue://audit.orders")]
    assert attempts == [1, 2]
    assert audit == ["<Seen/>"]  # the crashed attempt sent nothing


async def test_business_error_is_502_with_its_code_and_detail(make_assembly):
    @handler(ORDERS_QUEUE, name="refusing", registry=None)
    async def refusing(message, context):
        raise BusinessError("unknown-customer", "no customer 'IYT Corporation' in the ERP")

    async with gateway(make_assembly, [refusing]) as (client, runtime, worker):
        response = await client.post("/v1/documents", content=ORDER, headers=ACME)
        assert response.status_code == 502
        assert response.headers["content-type"] == "application/problem+json"
        body = response.json()
        assert body["code"] == "backend-error"
        assert "unknown-customer: no customer 'IYT Corporation' in the ERP" in body["detail"]
        status = (await client.get(body["status_url"], headers=ACME)).json()
        assert status["status"] == "failed" and status["error"].startswith("unknown-customer:")
        again = await client.post("/v1/documents", content=ORDER, headers=ACME)  # the same document: replayed
        assert again.status_code == 502 and "unknown-customer" in again.json()["detail"]
    assert worker.stats()["refusing"].business_errors == 1


async def test_reject_dead_letters_the_order_once_and_the_partner_is_told_to_look_later(make_assembly):
    calls: list[int] = []

    @handler(ORDERS_QUEUE, name="rejecting", registry=None)
    def rejecting(message, context):
        calls.append(message.get_int_property("JMSXDeliveryCount"))
        raise Reject("the order names a buyer the ERP does not know")

    async with gateway(make_assembly, [rejecting]) as (client, runtime, worker):
        response = await client.post("/v1/documents", content=ORDER, headers=ACME)
        assert response.status_code == 504  # no reply comes: the document is accepted, look later
        url = response.json()["status_url"]
        await wait_for_status(client, url, ACME, "dead_lettered")
        [letter] = list(runtime.broker.browse("queue://DLQ.orders.inbound"))
        assert letter.get_string_property("JMS_DLQ_Reason") == "the order names a buyer the ERP does not know"
    assert calls == [1]


@pytest.mark.parametrize(
    "document, headers",
    [
        (INVOICE, GLOBEX),
        (DESPATCH_ADVICE, GLOBEX),
        (ORDER_CHANGE, ACME),
        (ORDER_CANCELLATION, ACME),
    ],
    ids=["Invoice", "DespatchAdvice", "OrderChange", "OrderCancellation"],
)
async def test_the_sample_configuration_delivers_every_one_way_document(make_assembly, document, headers):
    """`b2bgw serve` with the sample workers: a posted Invoice (and the other
    one-way documents) is taken by a consumer, so its status becomes
    ``delivered``, which is what the nightly warehouse load reads."""
    from gateway.samples.document_receiver import RECEIVED

    workers = load_yaml(SAMPLE_CONFIG)["workers"]  # the sample's own worker list
    assert "gateway.samples.document_receiver" in workers
    async with gateway(make_assembly, workers=workers) as (client, runtime, worker):
        response = await client.post("/v1/documents", content=document, headers=headers)
        assert response.status_code == 202, response.text
        receipt = response.json()
        await wait_for_status(client, receipt["status_url"], headers, "delivered")
    assert any(r.message_id == receipt["message_id"] and r.doc_type == receipt["document_type"] for r in RECEIVED)
