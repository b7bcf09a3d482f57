"""Tests of gateway.handlers: replies, exactly-once transactions, dead letters,
vanished reply queues, stopping, concurrency and statistics.

Every test that needs a broker runs on ``memory://`` and on a SQLite store.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

import pytest

from broker_core import (
    Broker,
    InvalidSelectorError,
    Queue,
    Requestor,
    TextMessage,
    Topic,
    XMLMessage,
)
from gateway.handlers import (
    Handler,
    HandlerContext,
    HandlerRegistry,
    HandlerStats,
    Worker,
    handler,
    registry,
)

WORK = Queue("work")
REPLIES = Queue("replies")
AUDIT = Queue("audit")


@pytest.fixture(params=["memory", "sqlite"])
def open_broker(request, tmp_path) -> Callable[..., Broker]:
    """Open a broker on the store under test (closed at teardown)."""
    opened: list[Broker] = []

    def open_(**options) -> Broker:
        options.setdefault("sweep_interval", 0)
        url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/b.db"
        broker = Broker.open(url, **options)
        opened.append(broker)
        return broker

    yield open_
    for broker in reversed(opened):
        broker.close()


@pytest.fixture
def broker(open_broker) -> Broker:
    return open_broker()


def wait_until(predicate: Callable[[], object], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def texts(broker: Broker, queue: Queue) -> list[str]:
    return [m.text for m in broker.browse(queue)]


def send(
    broker: Broker,
    body: str,
    *,
    reply_to=None,
    jms_type: str | None = None,
    correlation_id: str | None = None,
    destination: Queue = WORK,
) -> XMLMessage:
    """Send one XML request (outside any worker) and return it, stamped."""
    with broker.connect() as conn:
        session = conn.create_session()
        message = session.create_xml_message(body)
        message.jms_reply_to = reply_to
        message.jms_type = jms_type
        message.jms_correlation_id = correlation_id
        session.create_producer(destination).send(message)
    return message


# --------------------------------------------------------------------------- declaring handlers


def test_handler_decorator_registers_and_stays_callable():
    own = HandlerRegistry()

    @handler("orders.x", selector="JMSType = 'Order'", concurrency=2, registry=own)
    def respond(message, context):
        return "<Ok/>"

    assert isinstance(respond, Handler)
    assert respond.destination == Queue("orders.x")
    assert respond.selector == "JMSType = 'Order'"
    assert respond.concurrency == 2
    assert respond.name.endswith("test_handler_decorator_registers_and_stays_callable.<locals>.respond")
    assert list(own) == [respond] and respond in own and respond.name in own
    assert respond(None, None) == "<Ok/>"  # still the function
    assert respond not in registry  # only where it was asked to go


def test_handler_registers_in_the_module_registry_by_default():
    @handler("defaults.q", name="test-default-registry")
    def fn(message, context):
        return None

    try:
        assert registry.get("test-default-registry") is fn
    finally:
        registry.remove("test-default-registry")
    assert "test-default-registry" not in registry


def test_handler_destinations_and_arguments_are_checked():
    assert handler("topic://news", registry=None)(lambda m, c: None).destination == Topic("news")
    assert handler(Topic("news"), registry=None)(lambda m, c: None).destination == Topic("news")
    assert handler("queue://a.b", registry=None)(lambda m, c: None).destination == Queue("a.b")
    with pytest.raises(ValueError, match="concurrency must be 1 for a topic"):
        handler(Topic("news"), concurrency=2, registry=None)(lambda m, c: None)
    with pytest.raises(ValueError, match="concurrency"):
        handler("q", concurrency=0, registry=None)(lambda m, c: None)
    with pytest.raises(TypeError):
        handler(42, registry=None)  # type: ignore[arg-type]


def test_registering_a_name_again_replaces_it():
    own = HandlerRegistry()
    first = handler("q", name="same", registry=own)(lambda m, c: "1")
    second = handler("q", name="same", registry=own)(lambda m, c: "2")
    assert list(own) == [second] and first not in own


def test_worker_rejects_two_handlers_with_one_name(broker):
    a = handler("q", name="dup", registry=None)(lambda m, c: None)
    b = handler("q", name="dup", registry=None)(lambda m, c: None)
    with pytest.raises(ValueError, match="dup"):
        Worker(broker, [a, b])
    with pytest.raises(TypeError):
        Worker(broker, [lambda m, c: None])  # type: ignore[list-item]


# --------------------------------------------------------------------------- replies


def test_reply_goes_to_reply_to_with_correlation_and_type(broker):
    contexts: list[HandlerContext] = []

    @handler(WORK, selector="JMSType = 'Ping'", registry=None)
    def pong(message, context):
        contexts.append(context)
        n = message.document().get("n")
        return f'<Pong xmlns="urn:test" n="{n}"/>'

    with Worker(broker, [pong]) as worker, broker.connect() as conn:
        conn.start()
        requestor = Requestor(conn.create_session(), WORK)
        request = XMLMessage('<Ping n="1"/>')
        request.jms_type = "Ping"
        reply = requestor.request(request, timeout=5)
        assert reply.jms_correlation_id == request.jms_message_id  # no correlation id on the request
        assert reply.jms_type == "Pong"  # the root's local name
        assert isinstance(reply, XMLMessage) and reply.document().get("n") == "1"

        request = XMLMessage('<Ping n="2"/>')
        request.jms_type = "Ping"
        request.jms_correlation_id = "business-key-2"
        reply = requestor.request(request, timeout=5)
        assert reply.jms_correlation_id == "business-key-2"  # the request's correlation id wins
        assert reply.document().get("n") == "2"
        # counted once the commit returns, which may be just after the reply arrived
        wait_until(lambda: worker.stats()[pong.name].handled == 2, what="the counters")
        assert worker.stats()[pong.name] == HandlerStats(handled=2, replied=2, failed=0)

    context = contexts[0]
    assert context.broker is broker and context.session.transacted
    assert context.handler_name == pong.name
    assert context.logger.name == f"gateway.handlers.{pong.name}"


def test_handler_may_return_a_message_or_an_element_and_keeps_its_type(broker):
    from lxml import etree

    @handler(WORK, registry=None)
    def answer(message, context):
        kind = message.document().tag
        if kind == "text":
            reply = TextMessage("plain words")
            reply.jms_type = "Custom"
            reply.set_string_property("Extra", "yes")
            return reply
        return etree.fromstring("<Element><child>x &amp; y</child></Element>")

    with Worker(broker, [answer]):
        send(broker, "<text/>", reply_to=REPLIES)
        send(broker, "<element/>", reply_to=REPLIES)
        wait_until(lambda: len(texts(broker, REPLIES)) == 2, what="two replies")
    replies = list(broker.browse(REPLIES))
    by_type = {r.jms_type: r for r in replies}
    assert by_type["Custom"].text == "plain words" and by_type["Custom"].get_string_property("Extra") == "yes"
    assert by_type["Element"].document().findtext("child") == "x & y"


def test_request_without_reply_to_just_commits(broker):
    calls = []

    @handler(WORK, registry=None)
    def fn(message, context):
        calls.append(message.jms_message_id)
        return "<Ignored/>"

    request = send(broker, "<Fire/>")
    with Worker(broker, [fn]) as worker:
        wait_until(lambda: worker.stats()[fn.name].handled == 1, what="the request to commit")
        time.sleep(0.3)  # no redelivery either
    assert calls == [request.jms_message_id]
    assert broker.message_status([request.jms_message_id]) == {request.jms_message_id: "gone"}
    assert worker.stats()[fn.name] == HandlerStats(handled=1, replied=0, failed=0)


def test_none_means_no_reply(broker):
    @handler(WORK, registry=None)
    def fn(message, context):
        return None

    request = send(broker, "<Quiet/>", reply_to=REPLIES)
    with Worker(broker, [fn]) as worker:
        wait_until(lambda: worker.stats()[fn.name].handled == 1, what="the request to commit")
    assert texts(broker, REPLIES) == []
    assert broker.message_status([request.jms_message_id])[request.jms_message_id] == "gone"


# --------------------------------------------------------------------------- transactions


def test_failed_attempt_sends_nothing_and_redelivers(broker):
    """The request, the reply and extra sends commit in one transaction: a
    handler that raises after sending leaves nothing behind, and the request
    comes back marked redelivered."""
    attempts: list[tuple[bool, object]] = []
    second_attempt = threading.Event()
    release = threading.Event()

    @handler(WORK, registry=None)
    def fn(message, context):
        attempts.append((message.jms_redelivered, message.get_object_property("JMSXDeliveryCount")))
        context.send("audit", f'<Audit attempt="{len(attempts)}"/>')
        if len(attempts) == 1:
            raise RuntimeError("fails after sending")
        second_attempt.set()
        assert release.wait(5)
        return "<Done/>"

    request = send(broker, "<Job/>", reply_to=REPLIES)
    with Worker(broker, [fn]) as worker:
        assert second_attempt.wait(5)
        # the first attempt rolled back: neither its audit message nor a reply exists
        assert texts(broker, AUDIT) == []
        assert texts(broker, REPLIES) == []
        assert broker.message_status([request.jms_message_id])[request.jms_message_id] == "in_flight"
        release.set()
        wait_until(lambda: worker.stats()[fn.name].handled == 1, what="the second attempt to commit")
    assert attempts == [(False, 1), (True, 2)]
    assert texts(broker, AUDIT) == ['<Audit attempt="2"/>']
    audit = next(iter(broker.browse(AUDIT)))
    assert audit.jms_type == "Audit"
    replies = list(broker.browse(REPLIES))
    assert [r.text for r in replies] == ["<Done/>"]
    assert replies[0].jms_correlation_id == request.jms_message_id
    assert broker.message_status([request.jms_message_id])[request.jms_message_id] == "gone"
    assert worker.stats()[fn.name] == HandlerStats(handled=1, replied=1, failed=1)


def test_request_is_dead_lettered_after_max_deliveries(open_broker):
    broker = open_broker(max_deliveries=3)
    calls = []

    @handler(WORK, registry=None)
    def fn(message, context):
        calls.append(message.jms_redelivered)
        context.send(AUDIT, "<SideEffect/>")
        raise ValueError("cannot process this")

    request = send(broker, "<Poison/>", reply_to=REPLIES)
    with Worker(broker, [fn]) as worker:
        wait_until(
            lambda: broker.message_status([request.jms_message_id])[request.jms_message_id] == "dead_lettered",
            what="the request to be dead-lettered",
        )
        time.sleep(0.2)
    assert calls == [False, True, True]
    dead = list(broker.browse(Queue("DLQ.work")))
    assert [m.jms_message_id for m in dead] == [request.jms_message_id]
    assert dead[0].get_string_property("JMS_DLQ_OriginalDestination") == "queue://work"
    assert texts(broker, AUDIT) == [] and texts(broker, REPLIES) == []
    assert worker.stats()[fn.name] == HandlerStats(handled=0, replied=0, failed=3)


def test_reply_that_is_not_xml_fails_the_transaction(open_broker):
    broker = open_broker(max_deliveries=1)

    @handler(WORK, registry=None)
    def fn(message, context):
        return "<not-closed"

    request = send(broker, "<Job/>", reply_to=REPLIES)
    with Worker(broker, [fn]) as worker:
        wait_until(lambda: worker.stats()[fn.name].failed == 1, what="the failure")
    assert texts(broker, REPLIES) == []
    assert broker.message_status([request.jms_message_id])[request.jms_message_id] == "dead_lettered"


def test_vanished_temporary_reply_queue_commits_without_reply(broker, caplog):
    """The requester's temporary queue is gone: warn and commit, once."""
    calls = []

    @handler(WORK, registry=None)
    def fn(message, context):
        calls.append(message.jms_redelivered)
        context.send(AUDIT, "<Processed/>")
        return "<Reply/>"

    with broker.connect() as requester:
        temp = requester.create_temporary_queue()
        request = send(broker, "<Job/>", reply_to=temp)
    # the requester's connection is closed: its temporary queue is deleted

    with caplog.at_level(logging.WARNING, logger="gateway.handlers"):
        with Worker(broker, [fn]) as worker:
            wait_until(lambda: worker.stats()[fn.name].handled == 1, what="the request to commit")
            time.sleep(0.4)  # time enough for redeliveries, were there any
    assert calls == [False]
    assert worker.stats()[fn.name] == HandlerStats(handled=1, replied=0, failed=0, undeliverable=1)
    assert broker.message_status([request.jms_message_id])[request.jms_message_id] == "gone"
    assert texts(broker, AUDIT) == ["<Processed/>"]  # the rest of the transaction committed
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and request.jms_message_id in r.getMessage()]
    assert warnings and "cannot be sent" in warnings[0].getMessage()


# --------------------------------------------------------------------------- starting and stopping


def test_stop_is_prompt_and_the_worker_restarts(broker):
    a = handler(WORK, concurrency=3, name="a", registry=None)(lambda m, c: None)
    b = handler(Queue("other"), name="b", registry=None)(lambda m, c: None)
    worker = Worker(broker, [a, b])
    worker.start()
    assert worker.running
    with pytest.raises(RuntimeError):
        worker.start()
    time.sleep(0.1)
    started = time.monotonic()
    assert worker.stop() is True
    assert time.monotonic() - started < 1.5
    assert not worker.running
    assert broker.stats(WORK).consumers == 0
    assert worker.stop() is True  # idempotent

    worker.start()  # and again
    send(broker, "<Again/>")
    wait_until(lambda: worker.stats()["a"].handled == 1, what="the restarted worker")
    started = time.monotonic()
    worker.stop()
    assert time.monotonic() - started < 1.5


@pytest.mark.parametrize("selector", [None, "JMSType = 'Job'"])
def test_one_session_of_a_handler_waits_on_the_broker_and_the_others_still_work_in_parallel(
    broker, monkeypatch, selector
):
    """With concurrency N, a new message wakes one waiting session, not all N (each would look for it and
    try to claim it); the sessions still process messages in parallel."""
    import broker_core

    waiting, most, guard = [0], [0], threading.Lock()
    real_receive = broker_core.MessageConsumer.receive

    def receive(self, timeout=None):
        if timeout == 0:
            return real_receive(self, timeout)
        with guard:
            waiting[0] += 1
            most[0] = max(most[0], waiting[0])
        try:
            return real_receive(self, timeout)
        finally:
            with guard:
                waiting[0] -= 1

    monkeypatch.setattr(broker_core.MessageConsumer, "receive", receive)
    inside, busiest = [0], [0]

    @handler(WORK, selector=selector, concurrency=4, name="parallel", registry=None)
    def job(message, context):
        with guard:
            inside[0] += 1
            busiest[0] = max(busiest[0], inside[0])
        time.sleep(0.3)
        with guard:
            inside[0] -= 1

    with Worker(broker, [job], poll_interval=0.05) as worker:
        time.sleep(0.2)  # all four sessions idle: one of them waits on the broker
        for n in range(4):
            send(broker, f"<Job n='{n}'/>", jms_type="Job")
        started = time.monotonic()
        wait_until(lambda: worker.stats()["parallel"].handled == 4, what="four jobs")
        elapsed = time.monotonic() - started
    assert most[0] == 1
    assert busiest[0] >= 2 and elapsed < 1.0  # not one after the other (4 x 0.3 s)
    assert broker.stats(WORK).depth == 0


def test_a_backlog_is_shared_among_the_sessions(broker):
    """Twelve jobs committed at once while the sessions wait: with prefetch 1 (the handlers' default)
    each session holds one at a time and the others take the rest as they come free. (With the
    store's prefetch of 64, the SQL store handed the whole batch to the one session waiting on it,
    and its peers idled.)"""
    guard = threading.Lock()
    by_thread: dict[str, int] = {}

    @handler(WORK, concurrency=3, name="backlog", registry=None)
    def job(message, context):
        with guard:
            name = threading.current_thread().name
            by_thread[name] = by_thread.get(name, 0) + 1
        time.sleep(0.05)

    with Worker(broker, [job], poll_interval=0.05) as worker:
        time.sleep(0.2)  # every session idle, one waiting on the broker
        with broker.connect() as conn:
            session = conn.create_session(True)
            producer = session.create_producer(WORK)
            for n in range(12):
                producer.send(session.create_xml_message(f"<Job n='{n}'/>"))
            session.commit()  # one transaction: the twelve become available together
        wait_until(lambda: worker.stats()["backlog"].handled == 12, what="twelve jobs")
    assert len(by_thread) == 3 and max(by_thread.values()) <= 6, by_thread


def test_handler_prefetch_must_be_a_positive_int():
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="prefetch"):
            handler(WORK, prefetch=bad, registry=None)(lambda m, c: None)


def test_stop_waits_for_the_message_in_progress(broker):
    started = threading.Event()

    @handler(WORK, registry=None)
    def slow(message, context):
        started.set()
        time.sleep(0.5)
        return "<Finished/>"

    request = send(broker, "<Slow/>", reply_to=REPLIES)
    worker = Worker(broker, [slow])
    worker.start()
    assert started.wait(5)
    assert worker.stop() is True
    assert texts(broker, REPLIES) == ["<Finished/>"]
    assert broker.message_status([request.jms_message_id])[request.jms_message_id] == "gone"
    assert worker.stats()[slow.name] == HandlerStats(handled=1, replied=1, failed=0)


def test_stuck_handler_is_rolled_back_on_stop_timeout_and_redelivered(broker):
    """Like a crash before commit: no reply was sent and the request comes back."""
    stuck = threading.Event()
    unstick = threading.Event()

    @handler(WORK, name="stuck", registry=None)
    def stuck_fn(message, context):
        context.send(AUDIT, "<FromStuck/>")
        stuck.set()
        unstick.wait(10)
        return "<Late/>"

    seen = []

    @handler(WORK, name="fine", registry=None)
    def fine(message, context):
        seen.append(message.jms_redelivered)
        return "<OnTime/>"

    request = send(broker, "<Job/>", reply_to=REPLIES)
    first = Worker(broker, [stuck_fn])
    first.start()
    try:
        assert stuck.wait(5)
        started = time.monotonic()
        assert first.stop(timeout=0.3) is False
        assert time.monotonic() - started < 1.5
        assert texts(broker, REPLIES) == [] and texts(broker, AUDIT) == []
        assert broker.message_status([request.jms_message_id])[request.jms_message_id] == "pending"

        with Worker(broker, [fine]) as second:
            wait_until(lambda: second.stats()["fine"].handled == 1, what="the redelivered request")
        assert seen == [True]
        assert texts(broker, REPLIES) == ["<OnTime/>"] and texts(broker, AUDIT) == []
    finally:
        unstick.set()
    wait_until(lambda: first.stats()["stuck"].failed == 1, what="the stuck attempt to fail")
    assert texts(broker, REPLIES) == ["<OnTime/>"]  # the stuck attempt's reply never appears


def test_start_with_a_bad_selector_opens_nothing(broker):
    good = handler(Queue("good"), name="good", registry=None)(lambda m, c: None)
    bad = handler(WORK, selector="JMSType = ", name="bad", registry=None)(lambda m, c: None)
    worker = Worker(broker, [good, bad])
    with pytest.raises(InvalidSelectorError):
        worker.start()
    assert not worker.running
    assert broker.stats(Queue("good")).consumers == 0


# --------------------------------------------------------------------------- concurrency and topics


def test_concurrency_processes_in_parallel(broker):
    parallel = 4
    barrier = threading.Barrier(parallel, timeout=5)
    threads = set()
    lock = threading.Lock()

    @handler(WORK, concurrency=parallel, registry=None)
    def fn(message, context):
        with lock:
            threads.add(threading.current_thread().name)
        barrier.wait()  # passes only when `parallel` messages are in progress at once
        return "<Ok/>"

    for n in range(parallel):
        send(broker, f'<Job n="{n}"/>', reply_to=REPLIES)
    with Worker(broker, [fn]) as worker:
        wait_until(lambda: worker.stats()[fn.name].handled == parallel, what="all jobs")
    assert worker.stats()[fn.name] == HandlerStats(handled=parallel, replied=parallel, failed=0)
    assert len(threads) == parallel
    assert len(texts(broker, REPLIES)) == parallel


def test_topic_handler_and_selector(broker):
    got = []

    @handler(Topic("events"), selector="JMSType = 'Wanted'", registry=None)
    def fn(message, context):
        got.append(message.text)

    with Worker(broker, [fn]) as worker, broker.connect() as conn:
        producer = conn.create_session().create_producer(Topic("events"))
        for kind in ("Wanted", "Other", "Wanted"):
            message = XMLMessage(f"<{kind}/>")
            message.jms_type = kind
            producer.send(message)
        wait_until(lambda: worker.stats()[fn.name].handled == 2, what="two events")
    assert got == ["<Wanted/>", "<Wanted/>"]


# --------------------------------------------------------------------------- statistics


def test_stats_per_handler(open_broker):
    broker = open_broker(max_deliveries=1)

    @handler(WORK, name="mixed", registry=None)
    def mixed(message, context):
        kind = message.document().tag
        if kind == "fail":
            raise RuntimeError("no")
        return None if kind == "quiet" else "<Answer/>"

    idle = handler(Queue("idle"), name="idle", registry=None)(lambda m, c: None)
    worker = Worker(broker, [mixed, idle])
    assert worker.stats() == {"mixed": HandlerStats(), "idle": HandlerStats()}
    for body in ("<answer/>", "<quiet/>", "<fail/>", "<answer/>"):
        send(broker, body, reply_to=REPLIES)
    with worker:
        wait_until(lambda: (s := worker.stats()["mixed"]).handled + s.failed == 4, what="four requests")
    stats = worker.stats()
    assert stats == {
        "mixed": HandlerStats(handled=3, replied=2, failed=1, undeliverable=0),
        "idle": HandlerStats(),
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats["mixed"].handled = 99  # type: ignore[misc]
    assert worker.stats()["mixed"].handled == 3
