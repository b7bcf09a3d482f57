"""Message listeners: serial delivery per session, failures redeliver then
dead-letter, no synchronous receive, and connection stop/start."""

from __future__ import annotations

import threading
import time

import pytest

from broker_core import AckMode, IllegalStateError, InvalidArgumentError, Queue

QUEUE = Queue("listen")


class Collector:
    """A listener that records messages and signals when ``expected`` arrived."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.messages = []
        self.done = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, message) -> None:
        with self._lock:
            self.messages.append(message)
            if len(self.messages) >= self.expected:
                self.done.set()

    @property
    def texts(self):
        return [m.text for m in self.messages]


def test_listener_receives_every_message_in_order(session, send):
    collector = Collector(20)
    consumer = session.create_consumer(QUEUE)
    consumer.set_message_listener(collector)
    assert consumer.message_listener is collector
    send(QUEUE, *[str(i) for i in range(20)])
    assert collector.done.wait(10)
    time.sleep(0.1)
    assert collector.texts == [str(i) for i in range(20)]


def test_listener_gets_messages_that_were_waiting(session, send):
    send(QUEUE, "a", "b")
    collector = Collector(2)
    session.create_consumer(QUEUE).set_message_listener(collector)
    assert collector.done.wait(10)
    assert collector.texts == ["a", "b"]


def test_listener_calls_of_one_session_never_overlap(conn, send):
    session = conn.create_session()
    queues = [Queue(f"listen.{i}") for i in range(3)]
    state = {"active": 0, "max_active": 0, "count": 0}
    lock = threading.Lock()
    done = threading.Event()
    per_queue = 30
    threads = set()

    def on_message(message):
        with lock:
            state["active"] += 1
            state["max_active"] = max(state["max_active"], state["active"])
            threads.add(threading.get_ident())
        time.sleep(0.001)  # give an overlapping call the chance to show up
        with lock:
            state["active"] -= 1
            state["count"] += 1
            if state["count"] == per_queue * len(queues):
                done.set()

    for queue in queues:
        session.create_consumer(queue).set_message_listener(on_message)
    senders = [threading.Thread(target=send, args=(queue, *[str(i) for i in range(per_queue)])) for queue in queues]
    for t in senders:
        t.start()
    for t in senders:
        t.join(30)
    assert done.wait(30), f"only {state['count']} messages delivered"
    assert state["max_active"] == 1, "listener calls of one session overlapped"
    assert len(threads) == 1


def test_listeners_of_different_sessions_each_get_their_messages(conn, send):
    collectors = []
    for i in range(3):
        collector = Collector(10)
        conn.create_session().create_consumer(Queue(f"listen.s{i}")).set_message_listener(collector)
        collectors.append(collector)
    for i in range(3):
        send(Queue(f"listen.s{i}"), *[f"{i}-{n}" for n in range(10)])
    for i, collector in enumerate(collectors):
        assert collector.done.wait(10)
        assert collector.texts == [f"{i}-{n}" for n in range(10)]


def test_a_failing_listener_gets_the_message_again_then_it_is_dead_lettered(make_broker, drain):
    broker = make_broker(max_deliveries=3)
    conn = broker.connect()
    conn.start()
    session = conn.create_session()
    producer_session = conn.create_session()
    producer_session.create_producer(QUEUE).send(producer_session.create_text_message("poison"))
    calls = []
    third = threading.Event()

    def on_message(message):
        calls.append((message.text, message.jms_redelivered, message.get_int_property("JMSXDeliveryCount")))
        if len(calls) == 3:
            third.set()
        raise ValueError("cannot process")

    session.create_consumer(QUEUE).set_message_listener(on_message)
    assert third.wait(10)
    deadline = time.monotonic() + 5
    while broker.stats(QUEUE).dead_lettered == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)
    assert calls == [("poison", False, 1), ("poison", True, 2), ("poison", True, 3)]
    dead = drain(conn.create_session().create_consumer(Queue("DLQ.listen")))
    assert [m.text for m in dead] == ["poison"]
    assert "ValueError" in dead[0].get_string_property("JMS_DLQ_Reason")


def test_a_failure_then_success_is_not_dead_lettered(make_broker):
    broker = make_broker(max_deliveries=3)
    conn = broker.connect()
    conn.start()
    session = conn.create_session()
    session.create_producer(QUEUE).send(session.create_text_message("flaky"))
    calls = []
    done = threading.Event()

    def on_message(message):
        calls.append(message.jms_redelivered)
        if len(calls) == 1:
            raise RuntimeError("transient")
        done.set()

    conn.create_session().create_consumer(QUEUE).set_message_listener(on_message)
    assert done.wait(10)
    time.sleep(0.1)
    assert calls == [False, True]
    stats = broker.stats(QUEUE)
    assert (stats.depth, stats.in_flight, stats.dead_lettered, stats.dequeued) == (0, 0, 0, 1)


def test_a_failing_listener_in_a_transacted_session_rolls_back(conn, send):
    send(QUEUE, "m")
    tx = conn.create_session(transacted=True)
    calls = []
    done = threading.Event()

    def on_message(message):
        calls.append(message.jms_redelivered)
        if len(calls) == 1:
            tx.create_producer(Queue("listen.out")).send(tx.create_text_message("never"))
            raise RuntimeError("fail")
        tx.commit()
        done.set()

    tx.create_consumer(QUEUE).set_message_listener(on_message)
    assert done.wait(10)
    assert calls == [False, True]
    check = conn.create_session().create_consumer(Queue("listen.out"))
    assert check.receive(timeout=0.2) is None


def test_a_listener_can_send_and_commit_on_its_session(conn, send, drain):
    send(QUEUE, "a", "b")
    tx = conn.create_session(transacted=True)
    producer = tx.create_producer(Queue("listen.out"))
    handled = Collector(2)

    def on_message(message):
        producer.send(tx.create_text_message(message.text.upper()))
        tx.commit()
        handled(message)

    tx.create_consumer(QUEUE).set_message_listener(on_message)
    assert handled.done.wait(10)
    out = drain(conn.create_session().create_consumer(Queue("listen.out")))
    assert [m.text for m in out] == ["A", "B"]
    tx.close()
    assert conn.create_session().create_consumer(QUEUE).receive(timeout=0.2) is None


def test_auto_listener_acknowledges_when_it_returns(broker, conn, send):
    send(QUEUE, "a")
    session = conn.create_session(ack_mode=AckMode.AUTO)
    collector = Collector(1)
    session.create_consumer(QUEUE).set_message_listener(collector)
    assert collector.done.wait(10)
    deadline = time.monotonic() + 5
    while broker.stats(QUEUE).dequeued == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    session.close()
    assert conn.create_session().create_consumer(QUEUE).receive(timeout=0.2) is None


def test_client_listener_messages_wait_for_acknowledge(broker, conn, send):
    send(QUEUE, "a", "b")
    session = conn.create_session(ack_mode=AckMode.CLIENT)
    collector = Collector(2)
    session.create_consumer(QUEUE).set_message_listener(collector)
    assert collector.done.wait(10)
    assert broker.stats(QUEUE).in_flight == 2
    collector.messages[0].acknowledge()
    assert broker.stats(QUEUE).in_flight == 0
    session.close()
    assert conn.create_session().create_consumer(QUEUE).receive(timeout=0.2) is None


def test_a_consumer_with_a_listener_cannot_receive(session):
    consumer = session.create_consumer(QUEUE)
    consumer.set_message_listener(lambda m: None)
    with pytest.raises(IllegalStateError):
        consumer.receive(timeout=0.1)
    with pytest.raises(IllegalStateError):
        consumer.receive_no_wait()


def test_removing_the_listener_allows_receive_again(conn, send):
    session = conn.create_session()
    consumer = session.create_consumer(QUEUE)
    consumer.set_message_listener(Collector(1))
    consumer.set_message_listener(None)
    assert consumer.message_listener is None
    send(QUEUE, "sync")
    assert consumer.receive(timeout=2).text == "sync"


def test_listener_must_be_callable(session):
    with pytest.raises(InvalidArgumentError):
        session.create_consumer(QUEUE).set_message_listener("not callable")


def test_a_stopped_connection_does_not_call_listeners(broker, send):
    conn = broker.connect()  # created stopped
    collector = Collector(1)
    conn.create_session().create_consumer(QUEUE).set_message_listener(collector)
    send(QUEUE, "waiting")
    assert not collector.done.wait(0.3)
    conn.start()
    assert collector.done.wait(10)
    assert collector.texts == ["waiting"]


def test_stop_pauses_listener_delivery_and_start_resumes_it(conn, send):
    collector = Collector(2)
    conn.create_session().create_consumer(QUEUE).set_message_listener(collector)
    send(QUEUE, "before")
    deadline = time.monotonic() + 10
    while not collector.messages and time.monotonic() < deadline:
        time.sleep(0.01)
    conn.stop()
    send(QUEUE, "while stopped")
    time.sleep(0.3)
    assert collector.texts == ["before"]
    conn.start()
    assert collector.done.wait(10)
    assert collector.texts == ["before", "while stopped"]


def test_stop_waits_for_a_running_listener(conn, send):
    entered = threading.Event()
    finished = threading.Event()

    def slow(message):
        entered.set()
        time.sleep(0.3)
        finished.set()

    conn.create_session().create_consumer(QUEUE).set_message_listener(slow)
    send(QUEUE, "slow")
    assert entered.wait(10)
    conn.stop()
    assert finished.is_set(), "stop() returned while a listener was still running"


def test_no_listener_call_starts_after_stop_returns(broker, conn, run_threads):
    """Stop and start many times while messages keep flowing: once stop()
    has returned no listener call may begin until start()."""
    queue = Queue("listen.flow")
    stopped = threading.Event()
    violations = []
    received = []

    def on_message(message):
        if stopped.is_set():
            violations.append(message.text)
        received.append(message.text)

    conn.create_session().create_consumer(queue).set_message_listener(on_message)
    feeding = threading.Event()
    feeding.set()

    def feed(_):
        session = broker.connect().create_session()
        producer = session.create_producer(queue)
        n = 0
        while feeding.is_set() and n < 3000:
            producer.send(session.create_text_message(str(n)))
            n += 1
            if n % 20 == 0:
                time.sleep(0.001)

    feeder = threading.Thread(target=feed, args=(0,), daemon=True)
    feeder.start()
    try:
        for _ in range(60):
            conn.stop()
            stopped.set()
            time.sleep(0.004)
            stopped.clear()
            conn.start()
            time.sleep(0.002)
    finally:
        feeding.clear()
        feeder.join(30)
    assert received, "the listener never ran"
    assert violations == [], f"{len(violations)} listener calls started after stop() returned"


def test_closing_a_session_stops_its_listeners(conn, send):
    session = conn.create_session()
    collector = Collector(1)
    session.create_consumer(QUEUE).set_message_listener(collector)
    session.close()
    send(QUEUE, "after close")
    assert not collector.done.wait(0.3)
    assert conn.create_session().create_consumer(QUEUE).receive(timeout=2).text == "after close"
