"""An asynchronous commit on the SQL store finishes on its caller's event loop: once the SQL part is
durable, the memory-tier part (non-persistent messages to this process's temporary queues, their
acknowledgements) runs there and the awaited commit completes, with no thread in between. What the
transaction sent is there for a consumer once ``commit_async`` returns, and a failed commit raises a
StoreError from it, sending nothing."""

from __future__ import annotations

import asyncio
import threading

import pytest

from broker_core import Broker, DeliveryMode, Queue, StoreError


class Boom(Exception):
    pass


@pytest.fixture
def transacted(tmp_path):
    """A SQLite broker, a started connection, a transacted session's producer and a temporary queue."""
    with Broker.open(f"sqlite:///{tmp_path / 'a.db'}", sweep_interval=0) as broker:
        connection = broker.connect()
        connection.start()
        session = connection.create_session(transacted=True)
        yield broker, connection, session, session.create_producer(None), connection.create_temporary_queue()
        connection.close()


def test_an_async_commit_finishes_on_the_loop_with_its_memory_part(transacted):
    broker, connection, session, producer, temporary = transacted
    durable = Queue("async.commit")
    reader = connection.create_session()
    on_temporary, on_durable = reader.create_consumer(temporary), reader.create_consumer(durable)
    memory_threads: list[str] = []
    real = broker.store._mem.commit

    def spy(*args, **kwargs):
        memory_threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    broker.store._mem.commit = spy

    async def run() -> str:
        for i in range(3):
            producer.send(
                temporary, session.create_text_message(f"volatile-{i}"), delivery_mode=DeliveryMode.NON_PERSISTENT
            )
            producer.send(durable, session.create_text_message(f"kept-{i}"))
            await session.commit_async()
        return threading.current_thread().name

    loop_thread = asyncio.run(run())
    assert memory_threads == [loop_thread] * 3  # each memory part ran on the loop, after its SQL part
    assert [on_temporary.receive_no_wait().text for _ in range(3)] == [f"volatile-{i}" for i in range(3)]
    assert [on_durable.receive(timeout=2).text for _ in range(3)] == [f"kept-{i}" for i in range(3)]
    assert on_temporary.receive_no_wait() is None and on_durable.receive_no_wait() is None


def test_a_failed_async_commit_raises_on_the_loop_and_sends_nothing(transacted):
    broker, connection, session, producer, temporary = transacted
    durable = Queue("async.failed")

    def fail(conn):
        raise Boom("the application's record could not be written")

    async def run() -> None:
        producer.send(temporary, session.create_text_message("volatile"), delivery_mode=DeliveryMode.NON_PERSISTENT)
        producer.send(durable, session.create_text_message("kept"))
        await session.commit_async(in_transaction=[fail])

    with pytest.raises(StoreError, match="could not be written"):
        asyncio.run(run())
    reader = connection.create_session()
    assert reader.create_consumer(temporary).receive_no_wait() is None
    assert reader.create_consumer(durable).receive(timeout=0.3) is None
