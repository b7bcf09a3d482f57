"""Request-reply with Requestor: replies matched by correlation id, timeouts,
and many concurrent callers on one requestor."""

from __future__ import annotations

import threading

import pytest

from broker_core import IllegalStateError, JMSError, Queue, Requestor, RequestTimeoutError, reply_correlation_id

SERVICE = Queue("svc")


class Responder:
    """A service on its own connection: replies to each request with
    ``reply(request)`` (by default an echo of the text), following the JMS
    convention for the correlation id."""

    def __init__(self, broker, destination=SERVICE, reply=None) -> None:
        self.conn = broker.connect()
        self.session = self.conn.create_session()
        self.consumer = self.session.create_consumer(destination)
        self.producer = self.session.create_producer(None)
        self.reply = reply or (lambda request: request.text)
        self.handled = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.conn.start()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            request = self.consumer.receive(timeout=0.1)
            if request is None:
                continue
            text = self.reply(request)
            if text is None:
                continue
            response = self.session.create_text_message(text)
            response.jms_correlation_id = request.jms_correlation_id or request.jms_message_id
            self.producer.send(request.jms_reply_to, response)
            self.handled += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.conn.close()


@pytest.fixture
def responder(broker):
    r = Responder(broker)
    yield r
    r.stop()


def test_request_returns_the_reply(session, responder):
    requestor = Requestor(session, SERVICE)
    request = session.create_text_message("ping")
    reply = requestor.request(request, timeout=5)
    assert reply.text == "ping"
    assert reply.jms_correlation_id == request.jms_message_id
    assert request.jms_reply_to == requestor.reply_queue
    assert request.jms_reply_to.is_temporary


def test_request_with_its_own_correlation_id(session, responder):
    requestor = Requestor(session, SERVICE)
    request = session.create_text_message("order")
    request.jms_correlation_id = "PO-1001"
    reply = requestor.request(request, timeout=5)
    assert reply.text == "order"
    assert reply.jms_correlation_id == "PO-1001"


def test_reply_correlation_id_follows_the_jms_convention(session):
    message = session.create_text_message("x")
    message.jms_message_id = "ID:abc"
    assert reply_correlation_id(message) == "ID:abc"
    message.jms_correlation_id = "PO-1"
    assert reply_correlation_id(message) == "PO-1"


def test_request_times_out_without_a_responder(session):
    requestor = Requestor(session, Queue("nobody.listens"))
    with pytest.raises(RequestTimeoutError) as info:
        requestor.request(session.create_text_message("hello?"), timeout=0.3)
    assert isinstance(info.value, JMSError)
    assert isinstance(info.value, TimeoutError)


def test_a_late_reply_does_not_answer_the_next_request(broker, session):
    gate = threading.Event()
    calls = []

    def slow_then_fast(request):
        calls.append(request.text)
        if request.text == "slow":
            gate.wait(5)
        return f"re: {request.text}"

    responder = Responder(broker, reply=slow_then_fast)
    late = []
    try:
        requestor = Requestor(session, SERVICE, on_late_reply=late.append)
        with pytest.raises(RequestTimeoutError):
            requestor.request(session.create_text_message("slow"), timeout=0.2)
        gate.set()
        reply = requestor.request(session.create_text_message("fast"), timeout=5)
        assert reply.text == "re: fast"
        assert [m.text for m in late] == ["re: slow"]
    finally:
        responder.stop()


def test_many_threads_share_one_requestor(session, responder, run_threads):
    requestor = Requestor(session, SERVICE)
    threads, per_thread = 8, 50

    def caller(t):
        replies = []
        for i in range(per_thread):
            body = f"thread-{t}-request-{i}"
            replies.append((body, requestor.request(session.create_text_message(body), timeout=10).text))
        return replies

    results = run_threads(caller, threads, timeout=120)
    for t, replies in enumerate(results):
        assert len(replies) == per_thread
        assert all(sent == got for sent, got in replies), f"thread {t} got someone else's reply"
        assert [sent for sent, _ in replies] == [f"thread-{t}-request-{i}" for i in range(per_thread)]
    assert responder.handled == threads * per_thread


def test_concurrent_requests_with_the_same_correlation_id(session, responder, run_threads):
    requestor = Requestor(session, SERVICE)

    def caller(t):
        request = session.create_text_message(f"same-id-{t}")
        request.jms_correlation_id = "SHARED"
        return requestor.request(request, timeout=10).jms_correlation_id

    assert run_threads(caller, 4) == ["SHARED"] * 4


def test_requestor_needs_a_non_transacted_session(conn):
    with pytest.raises(IllegalStateError):
        Requestor(conn.create_session(transacted=True), SERVICE)


def test_closed_requestor_refuses_requests_and_deletes_its_queue(broker, session):
    requestor = Requestor(session, SERVICE)
    reply_queue = requestor.reply_queue
    requestor.close()
    requestor.close()
    with pytest.raises(IllegalStateError):
        requestor.request(session.create_text_message("x"), timeout=0.1)
    from broker_core import InvalidDestinationError

    with pytest.raises(InvalidDestinationError):
        session.create_producer(reply_queue).send(session.create_text_message("x"))


def test_requestor_as_context_manager(session, responder):
    with Requestor(session, SERVICE) as requestor:
        assert requestor.request(session.create_text_message("ctx"), timeout=5).text == "ctx"
    with pytest.raises(IllegalStateError):
        requestor.request(session.create_text_message("x"), timeout=0.1)
