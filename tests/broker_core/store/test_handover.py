"""The SQL store hands new messages to a consumer of the same process that
waits on an empty queue. If that consumer closes between the hand-over being
decided (in the commit) and its delivery, the messages must go back to the
queue, not be lost or counted as delivered."""

from __future__ import annotations

import threading
import time

from broker_core import AckMode, Broker, Queue
from broker_core._sql import _store


def test_messages_handed_to_a_consumer_that_closed_meanwhile_go_back_unmarked(tmp_path, monkeypatch):
    queue = Queue("handover.closed")
    with Broker.open(f"sqlite:///{tmp_path / 'h.db'}", sweep_interval=0) as broker:
        conn = broker.connect()
        conn.start()
        waiting = conn.create_session(ack_mode=AckMode.CLIENT).create_consumer(queue)
        handed = []
        real_hand_over = _store.SQLStore._hand_over

        def close_first(self, by_reader):
            for reader in by_reader:
                reader.close()  # the consumer goes away before the commit delivers to it
            handed.extend(d for deliveries in by_reader.values() for d in deliveries)
            real_hand_over(self, by_reader)

        monkeypatch.setattr(_store.SQLStore, "_hand_over", close_first)
        got = []
        thread = threading.Thread(target=lambda: got.append(waiting.receive(timeout=1.0)))
        thread.start()
        time.sleep(0.2)  # blocked on the empty queue
        sender = broker.connect().create_session()
        producer = sender.create_producer(queue)
        for i in range(3):
            producer.send(sender.create_text_message(f"m{i}"))
        thread.join(5)
        assert len(handed) >= 1  # the hand-over path was taken
        monkeypatch.setattr(_store.SQLStore, "_hand_over", real_hand_over)

        other = broker.connect()
        other.start()
        consumer = other.create_session(ack_mode=AckMode.CLIENT).create_consumer(queue)
        again = []
        deadline = time.monotonic() + 5
        while len(again) < 3 and time.monotonic() < deadline:
            message = consumer.receive(timeout=0.5)
            if message is not None:
                again.append(message)
                message.acknowledge()
        assert sorted(m.text for m in again) == ["m0", "m1", "m2"]
        assert not any(m.jms_redelivered for m in again)  # never given to the application: not redelivered
        assert got == [None]
        conn.close()
        other.close()


def test_a_message_handed_over_wakes_only_the_consumer_that_got_it(tmp_path):
    """Four consumers wait on one queue: a new message goes to one of them,
    and the other three are not woken to claim from a queue that has nothing
    for them (each such claim is a write transaction)."""
    queue = Queue("handover.herd")
    with Broker.open(f"sqlite:///{tmp_path / 'h.db'}", sweep_interval=0, heartbeat_interval=60) as broker:
        writer = broker.store._writer
        conn = broker.connect()
        conn.start()
        consumers = [conn.create_session(ack_mode=AckMode.CLIENT).create_consumer(queue) for _ in range(4)]
        got: list = []
        threads = [threading.Thread(target=lambda c=c: got.append(c.receive(timeout=3))) for c in consumers]
        for thread in threads:
            thread.start()
        time.sleep(0.3)  # all four found the queue empty and wait
        before = writer.operations
        sender = broker.connect().create_session()
        sender.create_producer(queue).send(sender.create_text_message("one"))
        deadline = time.monotonic() + 3
        while not any(got) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # room for needless claims, if any consumer were woken
        assert writer.operations - before == 1  # the send; no claim
        for thread in threads:
            thread.join(5)
        received = [m for m in got if m is not None]
        assert [m.text for m in received] == ["one"]
        received[0].acknowledge()
        conn.close()
