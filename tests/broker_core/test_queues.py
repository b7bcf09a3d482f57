"""Queues: one consumer per message, priority then FIFO, competing consumers,
messages that wait, stopped connections, blocking and non-blocking receive."""

from __future__ import annotations

import threading
import time

import pytest

from broker_core import AckMode, DeliveryMode, InvalidArgumentError, InvalidDestinationError, JMSError, Queue


def test_each_message_goes_to_exactly_one_consumer(broker, send, drain):
    queue = Queue("orders")
    conn2 = broker.connect()
    conn2.start()
    consumers = [conn2.create_session().create_consumer(queue) for _ in range(3)]
    sent = send(queue, *[f"m{i}" for i in range(30)])
    got = []
    for consumer in consumers:
        got.extend(drain(consumer))
    assert sorted(m.jms_message_id for m in got) == sorted(m.jms_message_id for m in sent)


def test_higher_priority_first_fifo_within_a_priority(session, drain):
    queue = Queue("prio")
    producer = session.create_producer(queue)
    order = [(1, "a"), (9, "b"), (4, "c"), (9, "d"), (0, "e"), (4, "f"), (7, "g"), (1, "h")]
    for priority, text in order:
        producer.send(session.create_text_message(text), priority=priority)
    got = drain(session.create_consumer(queue))
    assert [m.text for m in got] == ["b", "d", "g", "c", "f", "a", "h", "e"]
    assert [m.jms_priority for m in got] == [9, 9, 7, 4, 4, 1, 1, 0]


def test_default_priority_is_four(session, drain):
    queue = Queue("prio.default")
    producer = session.create_producer(queue)
    producer.send(session.create_text_message("low"), priority=3)
    producer.send(session.create_text_message("default"))
    producer.send(session.create_text_message("high"), priority=5)
    assert [m.text for m in drain(session.create_consumer(queue))] == ["high", "default", "low"]


def test_producer_defaults_apply_to_its_sends(session):
    queue = Queue("defaults")
    producer = session.create_producer(queue)
    producer.priority = 8
    producer.delivery_mode = DeliveryMode.NON_PERSISTENT
    producer.time_to_live = 60_000
    message = session.create_text_message("x")
    producer.send(message)
    received = session.create_consumer(queue).receive(timeout=2)
    assert received.jms_priority == 8
    assert received.jms_delivery_mode == DeliveryMode.NON_PERSISTENT
    assert received.jms_expiration == message.jms_timestamp + 60_000


def test_fifo_for_many_messages(session, drain):
    queue = Queue("fifo")
    producer = session.create_producer(queue)
    for i in range(200):
        producer.send(session.create_text_message(str(i)))
    assert [m.text for m in drain(session.create_consumer(queue))] == [str(i) for i in range(200)]


def test_competing_consumers_share_the_load(broker, send, run_threads):
    queue = Queue("work")
    n_threads, n_messages = 4, 200
    ready = threading.Barrier(n_threads + 1, timeout=30)
    conns = [broker.connect() for _ in range(n_threads)]
    for c in conns:
        c.start()

    shared = threading.Barrier(n_threads, timeout=30)

    def work(i: int) -> list[str]:
        consumer = conns[i].create_session().create_consumer(queue)
        ready.wait()
        first = consumer.receive(timeout=10)
        assert first is not None, f"consumer {i} got nothing while the others were busy"
        got = [first.text]
        # Busy with its first message until every consumer has one: they can
        # only have got theirs if the broker hands messages to idle consumers.
        shared.wait()
        while (message := consumer.receive(timeout=0.5)) is not None:
            got.append(message.text)
        return got

    sender = threading.Thread(target=lambda: (ready.wait(), send(queue, *[str(i) for i in range(n_messages)])))
    sender.start()
    results = run_threads(work, n_threads, timeout=120)
    sender.join(30)
    everything = [text for got in results for text in got]
    assert sorted(everything, key=int) == [str(i) for i in range(n_messages)], "lost or duplicated messages"
    for got in results:  # each consumer sees its share in queue order
        assert [int(t) for t in got] == sorted(int(t) for t in got)


def test_competing_consumers_in_one_connection(conn, send, run_threads):
    queue = Queue("work.one.conn")
    send(queue, *[str(i) for i in range(100)])
    sessions = [conn.create_session() for _ in range(3)]

    def work(i: int) -> list[str]:
        consumer = sessions[i].create_consumer(queue)
        got = []
        while (message := consumer.receive(timeout=0.5)) is not None:
            got.append(message.text)
        return got

    results = run_threads(work, 3)
    assert sorted((t for got in results for t in got), key=int) == [str(i) for i in range(100)]


def test_messages_wait_while_nobody_consumes(broker, send, drain):
    queue = Queue("waiting")
    send(queue, "early-1", "early-2")
    time.sleep(0.1)
    later = broker.connect()
    later.start()
    assert [m.text for m in drain(later.create_session().create_consumer(queue))] == ["early-1", "early-2"]


def test_messages_wait_after_a_consumer_closes(session, send, drain):
    queue = Queue("waiting.again")
    session.create_consumer(queue).close()
    send(queue, "kept")
    assert [m.text for m in drain(session.create_consumer(queue))] == ["kept"]


def test_a_connection_is_created_stopped(broker, send):
    queue = Queue("stopped")
    send(queue, "m")
    stopped = broker.connect()
    assert stopped.started is False
    consumer = stopped.create_session().create_consumer(queue)
    assert consumer.receive_no_wait() is None
    assert consumer.receive(timeout=0.2) is None
    stopped.start()
    assert consumer.receive(timeout=2).text == "m"


def test_stop_pauses_and_start_resumes(conn, session, send):
    queue = Queue("pause")
    consumer = session.create_consumer(queue)
    send(queue, "one")
    assert consumer.receive(timeout=2).text == "one"
    conn.stop()
    send(queue, "two")
    assert consumer.receive(timeout=0.2) is None
    assert consumer.receive_no_wait() is None
    conn.start()
    assert consumer.receive(timeout=2).text == "two"


def test_start_wakes_a_blocked_receive(broker, send):
    queue = Queue("wake.on.start")
    stopped = broker.connect()
    consumer = stopped.create_session().create_consumer(queue)
    send(queue, "m")
    got = []
    t = threading.Thread(target=lambda: got.append(consumer.receive(timeout=10)))
    t.start()
    time.sleep(0.2)
    assert got == []
    stopped.start()
    t.join(10)
    assert not t.is_alive()
    assert got[0] is not None and got[0].text == "m"


def test_a_stopped_connection_does_not_take_messages_from_others(broker, conn, send, drain):
    queue = Queue("shared")
    stopped = broker.connect()
    stopped.create_session().create_consumer(queue)
    send(queue, "a", "b")
    assert [m.text for m in drain(conn.create_session().create_consumer(queue))] == ["a", "b"]


def test_receive_no_wait_and_timeout_on_an_empty_queue(session):
    consumer = session.create_consumer(Queue("empty"))
    assert consumer.receive_no_wait() is None
    start = time.monotonic()
    assert consumer.receive(timeout=0.3) is None
    elapsed = time.monotonic() - start
    assert 0.25 <= elapsed < 5


def test_receive_without_timeout_blocks_until_a_message_arrives(broker, session):
    queue = Queue("block")
    consumer = session.create_consumer(queue)
    got = []
    t = threading.Thread(target=lambda: got.append(consumer.receive()))
    t.start()
    time.sleep(0.2)
    assert t.is_alive() and got == []
    other = broker.connect().create_session()
    other.create_producer(queue).send(other.create_text_message("finally"))
    t.join(10)
    assert not t.is_alive()
    assert got[0].text == "finally"


def test_receive_with_timeout_gets_a_message_sent_meanwhile(broker, session):
    queue = Queue("meanwhile")
    consumer = session.create_consumer(queue)
    other = broker.connect().create_session()

    def later():
        time.sleep(0.2)
        other.create_producer(queue).send(other.create_text_message("late"))

    t = threading.Thread(target=later)
    t.start()
    message = consumer.receive(timeout=5)
    t.join(10)
    assert message is not None and message.text == "late"


def _receive_in_thread(consumer, timeout):
    """Start ``consumer.receive(timeout)`` in a thread; returns the thread and
    a list that gets its result (or the IllegalStateError of a receive that
    only started after the close: a heavily loaded machine)."""
    from broker_core import IllegalStateError

    got = []

    def run():
        try:
            got.append(consumer.receive(timeout=timeout))
        except IllegalStateError as exc:
            got.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, got


def test_closing_a_consumer_unblocks_its_receive(session):
    consumer = session.create_consumer(Queue("unblock"))
    t, got = _receive_in_thread(consumer, None)
    time.sleep(0.2)
    consumer.close()
    t.join(5)
    assert not t.is_alive(), "receive() still blocked after close()"
    assert len(got) == 1 and (got[0] is None or isinstance(got[0], JMSError))


def test_closing_the_session_unblocks_receive(conn):
    session = conn.create_session()
    consumer = session.create_consumer(Queue("unblock.session"))
    t, got = _receive_in_thread(consumer, 60)
    time.sleep(0.2)
    session.close()
    t.join(5)
    assert not t.is_alive(), "receive() still blocked after the session closed"
    assert len(got) == 1 and (got[0] is None or isinstance(got[0], JMSError))


def test_unidentified_producer_names_the_destination(session, drain):
    producer = session.create_producer(None)
    producer.send(Queue("u.a"), session.create_text_message("to a"))
    producer.send(Queue("u.b"), session.create_text_message("to b"), priority=6)
    a = drain(session.create_consumer(Queue("u.a")))
    b = drain(session.create_consumer(Queue("u.b")))
    assert [m.text for m in a] == ["to a"]
    assert [(m.text, m.jms_priority) for m in b] == [("to b", 6)]
    with pytest.raises(InvalidDestinationError):
        producer.send(session.create_text_message("nowhere"))


def test_identified_producer_refuses_another_destination(session):
    producer = session.create_producer(Queue("fixed"))
    with pytest.raises(JMSError):
        producer.send(Queue("other"), session.create_text_message("x"))
    assert session.create_consumer(Queue("other")).receive(timeout=0.2) is None


def test_queues_are_independent(session, send, drain):
    send(Queue("q1"), "one")
    send(Queue("q2"), "two")
    assert [m.text for m in drain(session.create_consumer(Queue("q2")))] == ["two"]
    assert [m.text for m in drain(session.create_consumer(Queue("q1")))] == ["one"]


def test_client_ack_in_flight_messages_are_not_given_to_others(conn, send):
    queue = Queue("inflight")
    send(queue, "a", "b")
    holder = conn.create_session(ack_mode=AckMode.CLIENT).create_consumer(queue)
    other = conn.create_session().create_consumer(queue)
    assert holder.receive(timeout=2).text == "a"
    assert other.receive(timeout=2).text == "b"
    assert other.receive(timeout=0.2) is None


def test_a_consumer_with_prefetch_one_holds_nothing_back_from_its_peers(session, send, drain):
    """``create_consumer(..., prefetch=1)``: the store claims nothing for a consumer ahead of its
    ``receive``, so whatever it has not received yet is there for the other consumers at once."""
    queue = Queue("prefetch.one")
    send(queue, *[f"m{i}" for i in range(10)])
    first = session.create_consumer(queue, prefetch=1)
    taken = [first.receive_no_wait().text for _ in range(4)]  # (by default the SQL store claims 1, 2, 4...)
    second = session.create_consumer(queue, prefetch=1)
    rest = [m.text for m in drain(second)]
    assert taken == ["m0", "m1", "m2", "m3"] and rest == [f"m{i}" for i in range(4, 10)]


@pytest.mark.parametrize("prefetch", [0, -1, True, 2.5, "1"])
def test_prefetch_must_be_a_positive_int(session, prefetch):
    with pytest.raises(InvalidArgumentError, match="prefetch"):
        session.create_consumer(Queue("prefetch.bad"), prefetch=prefetch)
