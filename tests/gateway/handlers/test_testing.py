"""gateway.testing.HandlerHarness: a handler run in the test's own thread or
event loop, with the worker's code, and what became of each request."""

from __future__ import annotations

import asyncio
import threading

import pytest
from lxml import etree

from broker_core import Broker, Queue, TextMessage, Topic
from gateway.handlers import AsyncHandlerContext, BusinessError, HandlerContext, HandlerStats, Reject, handler
from gateway.testing import HandlerHarness, HarnessError

pytestmark = pytest.mark.anyio


@handler("orders.test", name="sync-orders", registry=None)
def sync_orders(message, context: HandlerContext):
    order = message.document()
    customer = order.get("customer")
    if customer is None:
        raise Reject("an order without a customer attribute")
    if customer == "C-77":
        raise BusinessError("unknown-customer", "no customer C-77", reply="<Refusal customer='C-77'/>")
    if customer == "crash":
        context.send("audit", "<Audit/>")
        raise RuntimeError("the ERP is down")
    context.send("audit", f"<Audit customer='{customer}'/>")
    return f"<Confirmation customer='{customer}'/>"


@handler("orders.async", name="async-orders", registry=None)
async def async_orders(message, context: AsyncHandlerContext):
    await asyncio.sleep(0)
    customer = message.document().get("customer")
    if customer is None:
        return Reject("an order without a customer attribute")
    if customer == "C-77":
        return BusinessError("unknown-customer", "no customer C-77")
    if customer == "crash":
        await context.send("audit", "<Audit/>")
        raise RuntimeError("the ERP is down")
    await context.send("audit", f"<Audit customer='{customer}'/>")
    return f"<Confirmation customer='{customer}'/>"


def test_a_committed_request_gives_its_reply_and_what_was_sent():
    with HandlerHarness(sync_orders) as harness:
        result = harness.request("<Order customer='acme'/>")
        assert result.committed and not (result.rejected or result.redelivered or result.dead_lettered)
        assert result.reply.text == "<Confirmation customer='acme'/>"
        assert result.reply.jms_type == "Confirmation"
        assert result.reply.jms_correlation_id == result.request.jms_message_id
        assert result.request.jms_type == "Order"  # set from the root, as the gateway does
        assert [m.text for m in result.sent_to("audit")] == ["<Audit customer='acme'/>"]
        assert result.error is None and result.error_code is None
        # what the result says is what the broker holds
        assert [m.text for m in harness.broker.browse(Queue("audit"))] == ["<Audit customer='acme'/>"]
        assert harness.broker.stats(Queue("orders.test")).depth == 0
        assert harness.stats() == {"sync-orders": HandlerStats(handled=1, replied=1)}


def test_the_handler_runs_in_the_tests_own_thread():
    seen = []

    @handler("where", registry=None)
    def where(message, context):
        seen.append(threading.get_ident())

    with HandlerHarness(where) as harness:
        assert harness.request("<Where/>").committed
    assert seen == [threading.get_ident()]


def test_reject_is_reported_with_its_reason_and_the_request_is_dead_lettered():
    with HandlerHarness(sync_orders) as harness:
        result = harness.request("<Order/>")
        assert result.rejected
        assert result.reason == "an order without a customer attribute"
        assert result.reply is None and result.sent == []
        (letter,) = harness.broker.browse(Queue("DLQ.orders.test"))
        assert letter.get_string_property("JMS_DLQ_Reason") == result.reason
        with pytest.raises(HarnessError, match="no request waits"):
            harness.deliver()  # not redelivered


def test_business_error_is_an_error_reply_that_commits():
    with HandlerHarness(sync_orders) as harness:
        result = harness.request("<Order customer='C-77'/>")
        assert result.committed
        assert result.business_error.code == "unknown-customer"
        assert result.error_code == "unknown-customer"
        assert result.reply.get_string_property("B2BError") == "unknown-customer: no customer C-77"
        assert result.reply.text == "<Refusal customer='C-77'/>"


def test_a_failure_is_redelivered_then_dead_lettered_after_max_deliveries():
    with HandlerHarness(sync_orders, max_deliveries=2) as harness:
        first = harness.request("<Order customer='crash'/>")
        assert first.redelivered
        assert isinstance(first.error, RuntimeError) and str(first.error) == "the ERP is down"
        assert first.sent == [] and list(harness.broker.browse(Queue("audit"))) == []
        second = harness.deliver()
        assert second.request.jms_message_id == first.request.jms_message_id
        assert second.request.jms_redelivered is True
        assert second.dead_lettered
        assert "RuntimeError: the ERP is down" in second.reason
        assert harness.stats()["sync-orders"] == HandlerStats(failed=2)


async def test_an_async_handler_runs_in_the_tests_own_loop():
    loop = asyncio.get_running_loop()
    seen = []

    @handler("where.async", registry=None)
    async def where(message, context):
        seen.append(asyncio.get_running_loop())
        return "<Here/>"

    async with HandlerHarness(where, async_orders) as harness:
        result = await harness.request_async("<Where/>", handler=where)
        assert result.committed and result.reply.text == "<Here/>"
        assert seen == [loop]
        ok = await harness.request_async("<Order customer='acme'/>", handler="async-orders")
        assert ok.committed and [m.text for m in ok.sent_to("audit")] == ["<Audit customer='acme'/>"]
        rejected = await harness.request_async("<Order/>", handler=async_orders)
        assert rejected.rejected and rejected.reason == "an order without a customer attribute"
        refused = await harness.request_async("<Order customer='C-77'/>", handler=async_orders)
        assert refused.committed and refused.error_code == "unknown-customer" and refused.reply.text == ""
        crashed = await harness.request_async("<Order customer='crash'/>", handler=async_orders)
        assert crashed.redelivered and str(crashed.error) == "the ERP is down" and crashed.sent == []
        with pytest.raises(HarnessError, match="async def"):
            harness.deliver(async_orders)  # a plain call cannot wait inside this loop


def test_a_plain_call_runs_an_async_handler_in_a_loop_of_its_own():
    with HandlerHarness(async_orders) as harness:
        assert harness.request("<Order customer='acme'/>").reply.text == "<Confirmation customer='acme'/>"


async def test_a_plain_handler_runs_inline_from_a_coroutine():
    async with HandlerHarness(sync_orders) as harness:
        assert (await harness.request_async("<Order customer='acme'/>")).committed


def test_requests_take_documents_in_every_form_and_their_options():
    received = []

    @handler("forms", registry=None)
    def keep(message, context):
        received.append(message)

    with HandlerHarness(keep) as harness:
        harness.request(b"<Bytes/>")
        harness.request(etree.fromstring("<Element/>"))
        harness.request(etree.ElementTree(etree.fromstring("<Tree/>")))
        harness.request(TextMessage("plain"))
        harness.request(
            "<Typed/>", jms_type="Custom", correlation_id="c-1", properties={"amount": 150}, priority=7, reply=False
        )
        with pytest.raises(TypeError):
            harness.send(42)
    assert [m.jms_type for m in received] == ["Bytes", "Element", "Tree", None, "Custom"]
    last = received[-1]
    assert (last.jms_correlation_id, last.get_long_property("amount"), last.jms_priority) == ("c-1", 150, 7)
    assert last.jms_reply_to is None


def test_a_request_the_selector_does_not_take_is_reported():
    @handler("picky", selector="JMSType = 'Invoice'", registry=None)
    def picky(message, context):
        return None

    with HandlerHarness(picky) as harness:
        with pytest.raises(HarnessError, match="JMSType = 'Invoice'"):
            harness.request("<Order/>")
        assert harness.request("<Invoice/>").committed


def test_several_handlers_and_topics():
    @handler(Topic("events"), name="listener", registry=None)
    def listener(message, context):
        return None

    with HandlerHarness(sync_orders, listener) as harness:
        with pytest.raises(HarnessError, match="say which one"):
            harness.request("<Order customer='acme'/>")
        assert harness.request("<Event/>", handler="listener").committed
        assert harness.request("<Order customer='acme'/>", handler=sync_orders).committed
        with pytest.raises(HarnessError, match="does not run a handler named 'other'"):
            harness.deliver("other")
    with pytest.raises(HarnessError, match="at least one handler"):
        HandlerHarness()


def test_replies_are_matched_to_their_requests():
    with HandlerHarness(sync_orders) as harness:
        harness.send("<Order customer='a'/>")
        harness.send("<Order customer='b'/>")
        first, second = harness.deliver(), harness.deliver()
        assert first.reply.text == "<Confirmation customer='a'/>"
        assert second.reply.text == "<Confirmation customer='b'/>"


def test_a_broker_of_the_tests_own(tmp_path):
    broker = Broker.open(f"sqlite:///{tmp_path}/h.db", sweep_interval=0)
    try:
        with HandlerHarness(sync_orders, broker=broker) as harness:
            result = harness.request("<Order customer='acme'/>")
            assert result.committed and result.reply.text == "<Confirmation customer='acme'/>"
        assert not broker.closed  # the test's own broker stays open
        assert [m.text for m in broker.browse(Queue("audit"))] == ["<Audit customer='acme'/>"]
    finally:
        broker.close()
