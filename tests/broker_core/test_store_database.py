"""Broker.engine, Broker.write and the leases: an application's own rows in
the store's transactions, on every store."""

from __future__ import annotations

import asyncio
import threading

import pytest

from broker_core import Queue, StoreError


def _create_table(broker) -> None:
    if broker.engine is not None:
        import sqlalchemy as sa

        broker.write(lambda conn: conn.execute(sa.text("CREATE TABLE IF NOT EXISTS app_rows (n INTEGER)")))


def test_write_runs_every_function_in_one_transaction_and_returns_their_results(broker, store_kind):
    assert (broker.engine is None) == (store_kind == "memory")
    _create_table(broker)
    seen = []

    def first(conn):
        seen.append(conn)
        if conn is not None:
            import sqlalchemy as sa

            conn.execute(sa.text("INSERT INTO app_rows (n) VALUES (1)"))
        return "one"

    assert broker.write(first, lambda conn: 2) == ["one", 2]
    assert len(seen) == 1
    if broker.engine is not None:
        import sqlalchemy as sa

        with broker.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM app_rows")).scalar() == 1


def test_a_failing_function_rolls_back_the_others(broker):
    _create_table(broker)

    def insert(conn):
        if conn is not None:
            import sqlalchemy as sa

            conn.execute(sa.text("INSERT INTO app_rows (n) VALUES (2)"))

    def fail(conn):
        raise ValueError("no")

    with pytest.raises((ValueError, StoreError)):  # the SQL store's writer reports it as a StoreError
        broker.write(insert, fail)
    if broker.engine is not None:
        import sqlalchemy as sa

        with broker.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM app_rows WHERE n = 2")).scalar() == 0


def test_write_with_a_callback_returns_at_once_and_calls_back(broker):
    done = threading.Event()
    errors = []

    def finished(error):
        errors.append(error)
        done.set()

    assert broker.write(lambda conn: 1, durable=False, callback=finished) == []
    assert done.wait(5) and errors == [None]


def test_write_async_waits_for_the_commit(broker):
    async def main():
        return await broker.write_async(lambda conn: "a", lambda conn: "b")

    assert asyncio.run(main()) == ["a", "b"]


def test_write_commits_with_the_messages_of_other_sessions_intact(broker):
    conn = broker.connect()
    conn.start()
    session = conn.create_session()
    session.create_producer(Queue("kept")).send(session.create_text_message("x"))
    broker.write(lambda c: None)
    assert session.create_consumer(Queue("kept")).receive(2).text == "x"
    conn.close()


def test_leases(broker, store_kind):
    assert broker.acquire_lease("job", 5.0)
    assert broker.acquire_lease("job", 5.0)  # renewed by its holder
    broker.release_lease("job")
    broker.release_lease("never-taken")


def test_a_selector_matches_a_snapshot_of_a_message():
    from broker_core import Int, TextMessage
    from broker_core.selectors import STRING_NUMBERS_PROPERTY, compile_selector, snapshot

    message = TextMessage("x")
    message.jms_type = "invoice"
    message.set_object_property("amount", Int(150))
    selector = compile_selector("JMSType = 'invoice' AND amount > 100")
    assert selector.matches(snapshot(message))
    message.set_object_property("amount", Int(50))
    assert not selector.matches(snapshot(message))
    stomp = TextMessage()
    stomp.set_object_property(STRING_NUMBERS_PROPERTY, True)
    stomp.set_string_property("amount", "150")
    assert compile_selector("amount > 100").matches(snapshot(stomp))
