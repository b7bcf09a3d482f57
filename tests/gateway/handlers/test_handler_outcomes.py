"""``async def`` handlers in the worker, and the explicit outcomes Reject and
BusinessError, sync and async side by side, on ``memory://`` and SQLite.

What the worker promises (gateway/handlers.py): the request and everything
sent for it commit in one transaction; a failure sends nothing and
redelivers; Reject dead-letters at once with its reason; BusinessError
answers with an error reply and commits.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from broker_core import Broker, Queue, Requestor, XMLMessage
from gateway.handlers import (
    ERROR_CODE_PROPERTY,
    ERROR_PROPERTY,
    AsyncHandlerContext,
    BusinessError,
    HandlerContext,
    HandlerStats,
    Reject,
    Worker,
    handler,
)

WORK = Queue("work")
AUDIT = Queue("audit")
DLQ = Queue("DLQ.work")


@pytest.fixture(params=["memory", "sqlite"])
def broker(request, tmp_path):
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/b.db"
    opened = Broker.open(url, sweep_interval=0, max_deliveries=3)
    yield opened
    opened.close()


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def texts(broker: Broker, queue: Queue) -> list[str]:
    return [m.text for m in broker.browse(queue)]


def request(broker: Broker, body: str, timeout: float = 10.0) -> XMLMessage:
    with broker.connect() as conn:
        conn.start()
        return Requestor(conn.create_session(), WORK).request(XMLMessage(body), timeout=timeout)


def send(broker: Broker, body: str) -> XMLMessage:
    with broker.connect() as conn:
        session = conn.create_session()
        message = session.create_xml_message(body)
        session.create_producer(WORK).send(message)
    return message


# --------------------------------------------------------------------------- async def in the worker


def test_async_handler_replies_and_sends_in_the_same_transaction(broker):
    contexts = []

    @handler(WORK, registry=None)
    async def pong(message, context: AsyncHandlerContext):
        contexts.append(context)
        await asyncio.sleep(0)  # really on an event loop
        await context.send(AUDIT, f'<Audit n="{message.document().get("n")}"/>')
        return f'<Pong n="{message.document().get("n")}"/>'

    assert pong.is_async
    with Worker(broker, [pong]) as worker:
        reply = request(broker, '<Ping n="7"/>')
        assert reply.jms_type == "Pong" and reply.document().get("n") == "7"
        wait_until(lambda: worker.stats()[pong.name].handled == 1, what="the commit")
    assert texts(broker, AUDIT) == ['<Audit n="7"/>']
    assert worker.stats()[pong.name] == HandlerStats(handled=1, replied=1)
    context = contexts[0]
    assert isinstance(context, AsyncHandlerContext) and context.session.transacted
    assert context.logger.name == f"gateway.handlers.{pong.name}"


def test_async_sessions_run_concurrently_on_one_loop(broker):
    """``concurrency`` tasks: four requests are in the handler at once, all on
    the same thread (the worker's event loop)."""
    inside: list[int] = []
    threads: set[int] = set()
    all_in = asyncio.Event()
    loops: list[asyncio.AbstractEventLoop] = []

    @handler(WORK, concurrency=4, registry=None)
    async def gather(message, context):
        loops.append(asyncio.get_running_loop())
        threads.add(threading.get_ident())
        inside.append(1)
        if len(inside) == 4:
            all_in.set()
        await asyncio.wait_for(all_in.wait(), 10)
        return "<Done/>"

    for n in range(4):
        send(broker, f"<Job n='{n}'/>")
    with Worker(broker, [gather]) as worker:
        wait_until(lambda: worker.stats()[gather.name].handled == 4, what="four jobs together")
    assert len(threads) == 1 and threading.get_ident() not in threads
    assert len(set(map(id, loops))) == 1


def test_a_crash_inside_an_async_handler_sends_nothing_and_redelivers(broker):
    attempts = []

    @handler(WORK, registry=None)
    async def flaky(message, context):
        attempts.append((message.jms_redelivered, message.get_int_property("JMSXDeliveryCount")))
        await context.send(AUDIT, f"<Attempt n='{len(attempts)}'/>")
        if len(attempts) == 1:
            raise RuntimeError("crashed after sending")
        return "<Done/>"

    with Worker(broker, [flaky]) as worker:
        reply = request(broker, "<Job/>")
        assert reply.text == "<Done/>"
        wait_until(lambda: worker.stats()[flaky.name].handled == 1, what="the second attempt")
    assert attempts == [(False, 1), (True, 2)]
    assert texts(broker, AUDIT) == ["<Attempt n='2'/>"]  # the first attempt's send was rolled back
    assert worker.stats()[flaky.name] == HandlerStats(handled=1, replied=1, failed=1)


def test_a_crashing_async_handler_is_dead_lettered_after_max_deliveries_with_the_error(broker):
    @handler(WORK, registry=None)
    async def broken(message, context):
        raise ValueError("cannot read the order")

    sent = send(broker, "<Job/>")
    with Worker(broker, [broken]) as worker:
        wait_until(lambda: worker.stats()[broken.name].failed == 3, what="three attempts")
        wait_until(lambda: texts(broker, DLQ) == ["<Job/>"], what="the dead letter")
    (letter,) = broker.browse(DLQ)
    assert letter.jms_message_id == sent.jms_message_id
    assert "ValueError: cannot read the order" in letter.get_string_property("JMS_DLQ_Reason")


def test_a_plain_function_returning_a_coroutine_fails_and_says_why(broker, caplog):
    async def body(message, context):
        return "<Never/>"

    @handler(WORK, registry=None)
    def wrong(message, context):
        return body(message, context)  # forgot `async def` on the handler itself

    assert not wrong.is_async
    send(broker, "<Job/>")
    with caplog.at_level("WARNING", logger="gateway.handlers"), Worker(broker, [wrong]) as worker:
        wait_until(lambda: worker.stats()[wrong.name].failed >= 1, what="the failure")
    assert "declare it `async def`" in caplog.text


def test_stop_cancels_a_stuck_async_handler_and_its_request_comes_back(broker):
    started = threading.Event()

    @handler(WORK, name="stuck-async", registry=None)
    async def stuck(message, context):
        await context.send(AUDIT, "<FromStuck/>")
        started.set()
        await asyncio.sleep(3600)

    sent = send(broker, "<Job/>")
    worker = Worker(broker, [stuck])
    worker.start()
    assert started.wait(10)
    began = time.monotonic()
    assert worker.stop(timeout=0.3) is False
    assert time.monotonic() - began < 5
    assert texts(broker, AUDIT) == []
    assert broker.message_status([sent.jms_message_id])[sent.jms_message_id] == "pending"
    assert worker.stats()["stuck-async"].failed == 1


def test_sync_and_async_handlers_run_side_by_side_in_one_worker(broker):
    @handler(WORK, selector="JMSType = 'Sync'", name="sync-side", registry=None)
    def plain(message, context: HandlerContext):
        context.send(AUDIT, "<FromSync/>")
        return "<SyncReply/>"

    @handler(WORK, selector="JMSType = 'Async'", name="async-side", registry=None)
    async def coroutine(message, context: AsyncHandlerContext):
        await context.send(AUDIT, "<FromAsync/>")
        return "<AsyncReply/>"

    with Worker(broker, [plain, coroutine]) as worker, broker.connect() as conn:
        conn.start()
        requestor = Requestor(conn.create_session(), WORK)
        for kind in ("Sync", "Async", "Sync", "Async"):
            message = XMLMessage("<Ask/>")
            message.jms_type = kind
            assert requestor.request(message, timeout=10).jms_type == f"{kind}Reply"
        wait_until(lambda: sum(s.handled for s in worker.stats().values()) == 4, what="four commits")
    assert sorted(texts(broker, AUDIT)) == ["<FromAsync/>"] * 2 + ["<FromSync/>"] * 2


# --------------------------------------------------------------------------- Reject


@pytest.mark.parametrize("style", ["raise", "return"])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_reject_dead_letters_once_at_once_with_its_reason(broker, kind, style):
    calls = []

    def decide(message, context):
        calls.append(message.get_int_property("JMSXDeliveryCount"))
        context.send(AUDIT, "<NotCommitted/>")
        rejection = Reject("unknown customer C-77")
        if style == "raise":
            raise rejection
        return rejection

    if kind == "sync":

        @handler(WORK, name="rejecting", registry=None)
        def rejecting(message, context):
            return decide(message, context)
    else:

        @handler(WORK, name="rejecting", registry=None)
        async def rejecting(message, context):
            calls.append(message.get_int_property("JMSXDeliveryCount"))
            await context.send(AUDIT, "<NotCommitted/>")
            rejection = Reject("unknown customer C-77")
            if style == "raise":
                raise rejection
            return rejection

    sent = send(broker, "<Order customer='C-77'/>")
    with Worker(broker, [rejecting]) as worker:
        wait_until(lambda: worker.stats()["rejecting"].rejected == 1, what="the rejection")
        wait_until(lambda: texts(broker, DLQ) == ["<Order customer='C-77'/>"], what="the dead letter")
    (letter,) = broker.browse(DLQ)
    assert letter.jms_message_id == sent.jms_message_id
    assert letter.get_string_property("JMS_DLQ_Reason") == "unknown customer C-77"
    assert calls == [1]  # never redelivered
    assert texts(broker, AUDIT) == []
    assert broker.stats(WORK).dead_lettered == 1
    assert worker.stats()["rejecting"] == HandlerStats(rejected=1)


def test_reject_needs_a_reason():
    with pytest.raises(ValueError, match="reason"):
        Reject("")
    with pytest.raises(ValueError, match="reason"):
        Reject(None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- BusinessError


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_business_error_answers_with_an_error_reply_and_commits(broker, kind):
    if kind == "sync":

        @handler(WORK, name="business", registry=None)
        def business(message, context):
            context.send(AUDIT, "<Refused/>")
            raise BusinessError(
                "unknown-customer",
                "no customer C-77 in the ERP",
                reply="<ApplicationResponse><Code>RE</Code></ApplicationResponse>",
            )
    else:

        @handler(WORK, name="business", registry=None)
        async def business(message, context):
            await context.send(AUDIT, "<Refused/>")
            return BusinessError("unknown-customer", "no customer C-77 in the ERP")

    with Worker(broker, [business]) as worker:
        reply = request(broker, "<Order customer='C-77'/>")
        wait_until(lambda: worker.stats()["business"].handled == 1, what="the commit")
    assert reply.get_string_property(ERROR_PROPERTY) == "unknown-customer: no customer C-77 in the ERP"
    assert reply.get_string_property(ERROR_CODE_PROPERTY) == "unknown-customer"
    if kind == "sync":
        assert reply.jms_type == "ApplicationResponse" and "<Code>RE</Code>" in reply.text
    else:
        assert reply.text == ""
    assert texts(broker, AUDIT) == ["<Refused/>"]  # an answer, not a failure: what was sent commits
    assert broker.stats(WORK).depth == 0 and list(broker.browse(DLQ)) == []
    assert worker.stats()["business"] == HandlerStats(handled=1, replied=1, business_errors=1)


def test_business_error_arguments_are_checked():
    with pytest.raises(ValueError, match="code"):
        BusinessError("", "detail")
    with pytest.raises(ValueError, match="code"):
        BusinessError("x" * 101, "detail")
    error = BusinessError("c", "d" * 5000)
    assert len(error.detail) == 1000


def test_the_error_property_is_the_one_the_gateway_reads():
    from gateway.exchange import request_reply as exchange

    assert ERROR_PROPERTY == exchange.ERROR_PROPERTY
