"""asyncio: receive_async and request_async wait without blocking the loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from broker_core import Broker, Queue, Requestor

QUEUE = Queue("async")


class _Ticker:
    """Counts 10 ms sleeps of a task on the running loop: how long the loop ran freely."""

    def __init__(self) -> None:
        self.ticks = 0
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0.01)
            self.ticks += 1

    def stop(self) -> int:
        self.task.cancel()
        return self.ticks


def test_receive_async_returns_a_waiting_message(session, send):
    send(QUEUE, "ready")
    consumer = session.create_consumer(QUEUE)
    message = asyncio.run(consumer.receive_async(timeout=2))
    assert message is not None and message.text == "ready"


def test_receive_async_times_out_with_none(session):
    consumer = session.create_consumer(QUEUE)

    async def main():
        start = time.monotonic()
        message = await consumer.receive_async(timeout=0.3)
        return message, time.monotonic() - start

    message, elapsed = asyncio.run(main())
    assert message is None
    assert 0.25 <= elapsed < 5


def test_receive_async_does_not_block_the_loop(broker, session):
    consumer = session.create_consumer(QUEUE)
    other = broker.connect().create_session()
    producer = other.create_producer(QUEUE)

    async def main():
        ticker = _Ticker()
        threading.Timer(0.3, lambda: producer.send(other.create_text_message("from a thread"))).start()
        message = await consumer.receive_async(timeout=5)
        return message, ticker.stop()

    message, ticks = asyncio.run(main())
    assert message is not None and message.text == "from a thread"
    assert ticks >= 2, "the event loop was blocked while waiting"


def test_receive_async_wakes_on_a_send_from_the_loop(session):
    consumer = session.create_consumer(QUEUE)
    producer = session.create_producer(QUEUE)

    async def main():
        waiting = asyncio.create_task(consumer.receive_async(timeout=5))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        producer.send(session.create_text_message("same loop"))
        return await waiting

    message = asyncio.run(main())
    assert message is not None and message.text == "same loop"


def test_concurrent_receive_async_on_several_consumers(conn, send):
    queues = [Queue(f"async.{i}") for i in range(3)]
    consumers = [conn.create_session().create_consumer(q) for q in queues]

    async def main():
        tasks = [asyncio.create_task(c.receive_async(timeout=5)) for c in consumers]
        await asyncio.sleep(0.05)
        for _i, q in enumerate(reversed(queues)):
            send(q, f"to {q.name}")
        return await asyncio.gather(*tasks)

    messages = asyncio.run(main())
    assert [m.text for m in messages] == [f"to {q.name}" for q in queues]


def test_receive_async_waits_for_start(broker, send):
    stopped = broker.connect()
    consumer = stopped.create_session().create_consumer(QUEUE)
    send(QUEUE, "after start")

    async def main():
        waiting = asyncio.create_task(consumer.receive_async(timeout=5))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        stopped.start()
        return await waiting

    message = asyncio.run(main())
    assert message is not None and message.text == "after start"


def test_request_async(broker, session):
    service = Queue("async.svc")
    responder_session = broker.connect().create_session()
    responder_session.connection.start()
    requests = responder_session.create_consumer(service)
    replies = responder_session.create_producer(None)

    def respond(n):
        for _ in range(n):
            request = requests.receive(timeout=10)
            if request is None:
                return
            reply = responder_session.create_text_message(request.text.upper())
            reply.jms_correlation_id = request.jms_correlation_id or request.jms_message_id
            replies.send(request.jms_reply_to, reply)

    n = 20
    thread = threading.Thread(target=respond, args=(n,), daemon=True)
    thread.start()
    requestor = Requestor(session, service)

    async def main():
        return await asyncio.gather(
            *(requestor.request_async(session.create_text_message(f"req-{i}"), timeout=10) for i in range(n))
        )

    results = asyncio.run(main())
    thread.join(10)
    assert [r.text for r in results] == [f"REQ-{i}" for i in range(n)]


def test_request_async_timeout(session):
    import pytest

    from broker_core import RequestTimeoutError

    requestor = Requestor(session, Queue("async.nobody"))

    async def main():
        await requestor.request_async(session.create_text_message("hello?"), timeout=0.2)

    with pytest.raises(RequestTimeoutError):
        asyncio.run(main())


def test_send_async_returns_once_stored(broker, session):
    producer = session.create_producer(QUEUE)

    async def main():
        futures = [producer.send_async(session.create_text_message(f"m{i}")) for i in range(50)]
        await asyncio.gather(*futures)

    asyncio.run(main())
    consumer = broker.connect()
    consumer.start()
    reader = consumer.create_session().create_consumer(QUEUE)
    texts = []
    while (message := reader.receive_no_wait()) is not None:  # stored before gather returned: all there now
        texts.append(message.text)
    assert texts == [f"m{i}" for i in range(50)]  # one producer: sent order


def test_send_async_stamps_the_message_and_checks_arguments_at_the_call(session):
    import pytest

    from broker_core import InvalidArgumentError

    producer = session.create_producer(QUEUE)

    async def main():
        message = session.create_text_message("stamped")
        future = producer.send_async(message, priority=7)
        assert message.jms_message_id is not None and message.jms_priority == 7  # set before the commit
        await future
        with pytest.raises(InvalidArgumentError):
            producer.send_async(session.create_text_message("bad"), priority=12)

    asyncio.run(main())


def test_send_async_in_a_transacted_session_stages_until_commit(broker, conn):
    transacted = conn.create_session(transacted=True)
    producer = transacted.create_producer(QUEUE)
    consumer = broker.connect()
    consumer.start()
    reader = consumer.create_session().create_consumer(QUEUE)

    async def main():
        await producer.send_async(transacted.create_text_message("staged"))
        assert reader.receive_no_wait() is None
        await transacted.commit_async()

    asyncio.run(main())
    message = reader.receive(timeout=5)
    assert message is not None and message.text == "staged"


def test_async_for_receives_each_message_until_the_consumer_closes(broker, send):
    queue = Queue("async.iter")
    send(queue, "a", "b")

    async def main():
        got = []
        async with broker.connect() as conn:
            conn.start()
            session = conn.create_session(transacted=True)
            consumer = session.create_consumer(queue)
            producer = broker.connect().create_session()
            async for message in consumer:
                got.append(message.text)
                await session.commit_async()
                if message.text == "b":  # one more arrives while iterating
                    producer.create_producer(queue).send(producer.create_text_message("c"))
                if len(got) == 3:
                    consumer.close()  # ends the loop at its next turn
        return got

    got = asyncio.run(main())
    assert got == ["a", "b", "c"]
    assert broker.stats(queue).depth == 0 and broker.stats(queue).in_flight == 0


def test_async_for_ends_when_the_connection_closes_from_elsewhere(broker):
    conn = broker.connect()
    conn.start()
    consumer = conn.create_session().create_consumer(Queue("async.iter.close"))

    async def main():
        asyncio.get_running_loop().call_later(0.2, conn.close)
        return [message async for message in consumer]

    assert asyncio.run(asyncio.wait_for(main(), 10)) == []


def test_async_with_closes_and_redelivers_what_was_not_committed(broker, send):
    queue = Queue("async.with")
    send(queue, "x")

    async def main():
        async with broker.connect() as conn:
            conn.start()
            async with conn.create_session(transacted=True) as session:
                async with session.create_consumer(queue) as consumer:
                    first = await consumer.receive_async(2)
                    async with session.create_producer(Queue("async.with.out")) as producer:
                        producer.send(session.create_text_message("dropped"))
                assert consumer._closed
            assert session._closed
        return first, conn

    first, conn = asyncio.run(main())
    assert first.text == "x"
    assert conn._closed
    again = broker.connect()
    again.start()
    redelivered = again.create_session().create_consumer(queue).receive(2)
    assert redelivered.text == "x" and redelivered.jms_redelivered is True
    assert list(broker.browse(Queue("async.with.out"))) == []


def test_async_with_a_broker_closes_it(broker_url):
    async def main():
        async with Broker.open(broker_url, sweep_interval=0) as opened:
            assert not opened.closed
        return opened

    assert asyncio.run(main()).closed


def test_commit_async_of_a_reply_to_a_requestor_of_this_process_completes(broker):
    """The reply (non-persistent, to a temporary queue of this process) is
    handed to the waiting requestor when the commit completes; on the SQL
    store that happens in the writer's thread, which must not wait for a
    write of its own."""
    service = Queue("async.commit.reply")
    requester = broker.connect()
    requester.start()
    requestor = Requestor(requester.create_session(), service)
    responder = broker.connect()
    responder.start()
    tx = responder.create_session(transacted=True)
    requests = tx.create_consumer(service)
    replies = tx.create_producer(None)

    async def answer_one():
        request = await requests.receive_async(5)
        reply = tx.create_text_message("pong")
        reply.jms_correlation_id = request.jms_message_id
        replies.send(request.jms_reply_to, reply)
        await asyncio.wait_for(tx.commit_async(), 10)

    def serve():
        asyncio.run(answer_one())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    reply = requestor.request(requester.create_session().create_text_message("ping"), timeout=10)
    thread.join(10)
    assert not thread.is_alive()
    assert reply.text == "pong"
    requester.close()
    responder.close()


class _HeldWriter:
    """Holds the store's writer (a write that waits) until released: a claim queues behind it."""

    def __init__(self, broker: Broker) -> None:
        self.started, self.release = threading.Event(), threading.Event()

        def hold(conn):
            self.started.set()
            self.release.wait(10)

        self.thread = threading.Thread(target=broker.write, args=(hold,), daemon=True)
        self.thread.start()
        assert self.started.wait(5)

    def free(self) -> None:
        self.release.set()
        self.thread.join(10)


def _started_consumer(broker: Broker, queue: Queue):
    conn = broker.connect()
    conn.start()
    return conn.create_session().create_consumer(queue)


def test_receive_async_keeps_the_loop_running_while_the_claim_waits_for_the_store(broker, send):
    send(QUEUE, "behind a long write")
    consumer = _started_consumer(broker, QUEUE)

    async def main():
        held = _HeldWriter(broker)
        ticker = _Ticker()
        asyncio.get_running_loop().call_later(0.3, held.free)
        started = time.monotonic()
        message = await consumer.receive_async(timeout=5)
        waited = time.monotonic() - started
        await asyncio.sleep(0.3)  # the memory store's claim never waits: the write is still held
        return message, ticker.stop(), waited

    message, ticks, waited = asyncio.run(main())
    assert message is not None and message.text == "behind a long write"
    # a tick every 10 ms while the claim waited (and the 300 ms after): half of them at least
    assert ticks >= (waited + 0.3) / 0.01 / 2, f"the event loop was blocked: {ticks} ticks in {waited + 0.3:.2f} s"


def test_a_consumer_closed_while_its_async_claim_waits_gives_the_message_back(broker, send):
    """The claim completes after the close: what it took goes back, not delivered (JMSRedelivered false)."""
    queue = Queue("async.claim.closed")
    send(queue, "only once")
    consumer = _started_consumer(broker, queue)

    async def main():
        held = _HeldWriter(broker)
        receiving = asyncio.create_task(consumer.receive_async(timeout=5))
        await asyncio.sleep(0.1)  # the claim is queued behind the held write (or done: memory)
        closing = threading.Thread(target=consumer.close)
        closing.start()
        await asyncio.sleep(0.1)
        held.free()
        got = await receiving
        await asyncio.to_thread(closing.join, 10)
        return got

    got = asyncio.run(main())
    later = _started_consumer(broker, queue).receive(2)
    if got is None:
        assert later is not None and later.text == "only once" and later.jms_redelivered is False
    else:  # a store whose claim never waits handed it out (and acknowledged it) before the close
        assert got.text == "only once" and later is None


@pytest.mark.parametrize("selector", [None, "kind = 'a'"], ids=["plain", "selective"])
def test_a_receive_async_cancelled_while_its_claim_waits_loses_nothing(broker, session, selector):
    """``wait_for`` gives up on a receive whose claim waits for the store: the message it claimed is the next
    receive's, not delivered meanwhile (JMSRedelivered false), and not acknowledged in nobody's hands."""
    queue = Queue("async.claim.cancelled")
    message = session.create_text_message("kept")
    message.set_string_property("kind", "a")
    session.create_producer(queue).send(message)
    conn = broker.connect()
    conn.start()
    consumer = conn.create_session().create_consumer(queue, selector)

    async def main():
        held = _HeldWriter(broker)
        first = None
        try:
            first = await asyncio.wait_for(consumer.receive_async(timeout=5), 0.2)
        except TimeoutError:
            pass
        finally:
            held.free()
        return first or await consumer.receive_async(timeout=5)  # a store whose claim never waits: the first

    got = asyncio.run(main())
    assert got is not None and got.text == "kept" and got.jms_redelivered is False
    assert _started_consumer(broker, queue).receive(0.5) is None
