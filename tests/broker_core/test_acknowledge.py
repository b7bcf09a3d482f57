"""Acknowledgement modes, recover(), and redelivery of what a closed session
or connection had not acknowledged."""

from __future__ import annotations

import threading
import time

import pytest

from broker_core import AckMode, IllegalStateError, InvalidArgumentError, Queue

QUEUE = Queue("ack")


def redelivered_elsewhere(broker, drain):
    """What a fresh connection now receives from QUEUE."""
    other = broker.connect()
    other.start()
    return drain(other.create_session().create_consumer(QUEUE))


def test_auto_acknowledges_on_receive(broker, conn, send, drain):
    send(QUEUE, "a", "b")
    session = conn.create_session(ack_mode=AckMode.AUTO)
    assert session.ack_mode == AckMode.AUTO
    assert [m.text for m in drain(session.create_consumer(QUEUE))] == ["a", "b"]
    assert broker.stats(QUEUE).in_flight == 0
    session.recover()
    session.close()
    assert redelivered_elsewhere(broker, drain) == []
    assert broker.stats(QUEUE).dequeued == 2


def test_client_acknowledge_acknowledges_everything_consumed_so_far(broker, conn, send, drain):
    send(QUEUE, "a", "b", "c", "d")
    session = conn.create_session(ack_mode=AckMode.CLIENT)
    consumer = session.create_consumer(QUEUE)
    a, b, c = (consumer.receive(timeout=2) for _ in range(3))
    assert [a.text, b.text, c.text] == ["a", "b", "c"]
    b.acknowledge()  # acknowledges a, b and c: all consumed so far
    d = consumer.receive(timeout=2)
    assert d.text == "d"
    session.close()  # d was consumed after the acknowledge: it comes back
    again = redelivered_elsewhere(broker, drain)
    assert [m.text for m in again] == ["d"]
    assert again[0].jms_redelivered is True


def test_client_acknowledge_covers_every_consumer_of_the_session(broker, conn, send, drain):
    send(Queue("ack.x"), "x")
    send(QUEUE, "q")
    session = conn.create_session(ack_mode=AckMode.CLIENT)
    x = session.create_consumer(Queue("ack.x")).receive(timeout=2)
    q = session.create_consumer(QUEUE).receive(timeout=2)
    assert x.text == "x" and q.text == "q"
    q.acknowledge()
    session.close()
    other = broker.connect()
    other.start()
    other_session = other.create_session()
    assert drain(other_session.create_consumer(Queue("ack.x"))) == []
    assert drain(other_session.create_consumer(QUEUE)) == []


def test_client_unacknowledged_messages_are_redelivered_after_session_close(broker, conn, send, drain):
    send(QUEUE, "a", "b")
    session = conn.create_session(ack_mode=AckMode.CLIENT)
    first = drain(session.create_consumer(QUEUE))
    assert [m.jms_redelivered for m in first] == [False, False]
    session.close()
    again = redelivered_elsewhere(broker, drain)
    assert [m.text for m in again] == ["a", "b"]
    assert [m.jms_message_id for m in again] == [m.jms_message_id for m in first]
    assert all(m.jms_redelivered for m in again)
    assert [m.get_int_property("JMSXDeliveryCount") for m in again] == [2, 2]


def test_closing_the_connection_redelivers_to_another_connection(broker, send, drain):
    send(QUEUE, "a")
    conn = broker.connect()
    conn.start()
    session = conn.create_session(ack_mode=AckMode.INDIVIDUAL)
    assert session.create_consumer(QUEUE).receive(timeout=2).text == "a"
    conn.close()
    again = redelivered_elsewhere(broker, drain)
    assert [m.text for m in again] == ["a"]
    assert again[0].jms_redelivered


def test_closing_a_consumer_keeps_its_messages_with_the_session(broker, conn, send, drain):
    send(QUEUE, "a", "b")
    session = conn.create_session(ack_mode=AckMode.CLIENT)
    consumer = session.create_consumer(QUEUE)
    a = consumer.receive(timeout=2)
    consumer.close()
    assert redelivered_elsewhere(broker, drain)[0].text == "b"
    a.acknowledge()
    session.close()
    assert redelivered_elsewhere(broker, drain) == []


def test_individual_acknowledges_only_that_message(broker, conn, send, drain):
    send(QUEUE, "a", "b", "c")
    session = conn.create_session(ack_mode=AckMode.INDIVIDUAL)
    a, b, c = drain(session.create_consumer(QUEUE))
    b.acknowledge()
    b.acknowledge()  # twice is harmless
    session.close()
    again = redelivered_elsewhere(broker, drain)
    assert [m.text for m in again] == ["a", "c"]
    assert all(m.jms_redelivered for m in again)


def test_individual_recover_redelivers_only_the_unacknowledged(conn, send, drain):
    send(QUEUE, "a", "b", "c")
    session = conn.create_session(ack_mode=AckMode.INDIVIDUAL)
    consumer = session.create_consumer(QUEUE)
    a, b, c = drain(consumer)
    a.acknowledge()
    c.acknowledge()
    session.recover()
    assert [m.text for m in drain(consumer)] == ["b"]


def test_dups_ok_does_not_redeliver_after_close(broker, conn, send, drain):
    send(QUEUE, "a", "b")
    session = conn.create_session(ack_mode=AckMode.DUPS_OK)
    assert [m.text for m in drain(session.create_consumer(QUEUE))] == ["a", "b"]
    session.close()
    assert redelivered_elsewhere(broker, drain) == []


def test_no_acknowledge_forgets_messages_at_once(broker, conn, send, drain):
    send(QUEUE, "a", "b")
    session = conn.create_session(ack_mode=AckMode.NO_ACKNOWLEDGE)
    consumer = session.create_consumer(QUEUE)
    assert [m.text for m in drain(consumer)] == ["a", "b"]
    assert broker.stats(QUEUE).in_flight == 0
    session.recover()
    assert drain(consumer) == []
    session.close()
    assert redelivered_elsewhere(broker, drain) == []


def test_recover_redelivers_in_order_with_flag_and_count(conn, send, drain):
    send(QUEUE, "a", "b", "c")
    session = conn.create_session(ack_mode=AckMode.CLIENT)
    consumer = session.create_consumer(QUEUE)
    first = drain(consumer)
    assert [m.get_int_property("JMSXDeliveryCount") for m in first] == [1, 1, 1]
    session.recover()
    second = drain(consumer)
    assert [m.text for m in second] == ["a", "b", "c"]
    assert [m.jms_message_id for m in second] == [m.jms_message_id for m in first]
    assert all(m.jms_redelivered for m in second)
    assert [m.get_int_property("JMSXDeliveryCount") for m in second] == [2, 2, 2]
    session.recover()
    third = drain(consumer)
    assert [m.get_int_property("JMSXDeliveryCount") for m in third] == [3, 3, 3]
    third[0].acknowledge()
    session.recover()
    assert drain(consumer) == []


def test_recover_puts_messages_before_newer_ones(conn, send, drain):
    send(QUEUE, "a", "b")
    session = conn.create_session(ack_mode=AckMode.CLIENT)
    consumer = session.create_consumer(QUEUE)
    assert consumer.receive(timeout=2).text == "a"
    send(QUEUE, "c")
    session.recover()
    assert [m.text for m in drain(consumer)] == ["a", "b", "c"]


def test_acknowledged_messages_never_come_back(broker, conn, send, drain):
    send(QUEUE, "a")
    session = conn.create_session(ack_mode=AckMode.CLIENT)
    consumer = session.create_consumer(QUEUE)
    consumer.receive(timeout=2).acknowledge()
    session.recover()
    assert consumer.receive(timeout=0.2) is None
    session.close()
    assert redelivered_elsewhere(broker, drain) == []
    stats = broker.stats(QUEUE)
    assert (stats.depth, stats.in_flight, stats.dequeued) == (0, 0, 1)


def test_session_acknowledge(broker, conn, send, drain):
    send(QUEUE, "a", "b")
    session = conn.create_session(ack_mode=AckMode.CLIENT)
    drain(session.create_consumer(QUEUE))
    session.acknowledge()
    session.close()
    assert redelivered_elsewhere(broker, drain) == []


def test_acknowledge_after_the_session_closed_fails(conn, send):
    send(QUEUE, "a")
    session = conn.create_session(ack_mode=AckMode.CLIENT)
    message = session.create_consumer(QUEUE).receive(timeout=2)
    session.close()
    with pytest.raises(IllegalStateError):
        message.acknowledge()


def test_acknowledge_is_a_no_op_for_unsent_and_auto_messages(session, send):
    session.create_text_message("never sent").acknowledge()
    send(QUEUE, "a")
    session.create_consumer(QUEUE).receive(timeout=2).acknowledge()


def test_recover_is_for_non_transacted_sessions(conn):
    with pytest.raises(IllegalStateError):
        conn.create_session(transacted=True).recover()


@pytest.mark.parametrize("mode", [AckMode.TRANSACTED, 99, "auto"])
def test_invalid_ack_modes_are_refused(conn, mode):
    with pytest.raises(InvalidArgumentError):
        conn.create_session(transacted=False, ack_mode=mode)


@pytest.mark.parametrize(
    "mode", [AckMode.AUTO, AckMode.CLIENT, AckMode.DUPS_OK, AckMode.INDIVIDUAL, AckMode.NO_ACKNOWLEDGE]
)
def test_session_reports_its_ack_mode(conn, mode):
    session = conn.create_session(ack_mode=mode)
    assert session.ack_mode == mode
    assert session.transacted is False


def test_messages_that_reach_a_waiting_consumer_and_are_not_received_come_back_unmarked(broker, conn, drain):
    """A consumer blocked in receive() may be handed several messages at once
    (prefetch, or the SQL store's direct hand-over to a waiting consumer);
    those it never returned to the application are not redelivered ones."""
    queue = Queue("ack.handover")
    waiting_session = conn.create_session(ack_mode=AckMode.CLIENT)
    waiting = waiting_session.create_consumer(queue)
    got = []
    thread = threading.Thread(target=lambda: got.append(waiting.receive(timeout=10)))
    thread.start()
    time.sleep(0.2)  # blocked in receive on an empty queue
    sender = broker.connect().create_session(transacted=True)
    producer = sender.create_producer(queue)
    for i in range(5):
        producer.send(sender.create_text_message(f"h{i}"))
    sender.commit()  # all five arrive together
    thread.join(10)
    assert got and got[0] is not None and got[0].text == "h0"
    waiting.close()
    waiting_session.close()  # the received one was never acknowledged: back, marked redelivered
    other = broker.connect()
    other.start()
    again = drain(other.create_session().create_consumer(queue), timeout=0.5)
    assert sorted(m.text for m in again) == [f"h{i}" for i in range(5)]
    assert {m.text: m.jms_redelivered for m in again} == {
        "h0": True,
        "h1": False,
        "h2": False,
        "h3": False,
        "h4": False,
    }
