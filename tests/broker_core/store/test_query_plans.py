"""The SQL store's statements on ``b2b_entries`` must find their rows through
an index: on a deep queue, or with thousands of messages in flight, a
statement that walks the table (or every in-flight row of the process, as an
acknowledgement once did) turns each call into work proportional to the
backlog. The statements are captured as the store issues them and their
plans checked."""

from __future__ import annotations

import sqlite3

import pytest
import sqlalchemy as sa

from broker_core import AckMode, Broker, Queue, Topic
from broker_core._sql import _statements


@pytest.fixture()
def traced(tmp_path, monkeypatch):
    """A broker whose statements are recorded as the store issues them (text
    and parameters), to be planned again the same way: those it runs on the
    driver's cursor and those it runs through SQLAlchemy."""
    statements: list[tuple[str, object]] = []
    real_run = _statements._Statements.run

    def run(self, conn, sql, params, many=False):
        if not many:
            statements.append((sql, params))
        return real_run(self, conn, sql, params, many)

    monkeypatch.setattr(_statements._Statements, "run", run)
    path = tmp_path / "plans.db"
    with Broker.open(f"sqlite:///{path}", sweep_interval=0) as broker:

        def record(conn, cursor, statement, parameters, context, executemany):
            if not executemany:
                statements.append((statement, parameters))

        sa.event.listen(broker.store.engine, "before_cursor_execute", record)
        yield broker, statements, path


def _plans(path, statements):
    conn = sqlite3.connect(path)
    try:
        seen = set()
        for sql, parameters in statements:
            text = " ".join(sql.split())
            if text in seen or "FROM b2b_entries" not in text and "UPDATE b2b_entries" not in text:
                continue
            seen.add(text)
            plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + text, parameters or ())]
            yield text, plan
    finally:
        conn.close()


def test_no_statement_walks_the_entries_table(traced):
    broker, statements, path = traced
    queue = Queue("plans.q")
    with broker.connect() as conn:
        conn.start()
        session = conn.create_session(ack_mode=AckMode.CLIENT)
        producer = session.create_producer(queue)
        for i in range(20):
            producer.send(session.create_text_message(f"m{i}"), time_to_live=0 if i % 2 else 600_000)
        consumer = session.create_consumer(queue)
        got = [consumer.receive(timeout=5) for _ in range(10)]
        got[-1].acknowledge()
        session.recover()  # in-flight ones go back
        selective = session.create_consumer(queue, selector="JMSPriority = 4")
        assert selective.receive(timeout=5) is not None
        consumer.close()
        selective.close()  # what they prefetched goes back
        one_at_a_time = session.create_consumer(queue, selector="JMSPriority = 4", prefetch=1)
        assert one_at_a_time.receive(timeout=5) is not None  # the first of a window of candidates
        one_at_a_time.close()
        assert len(list(session.create_browser(queue))) >= 8
        broker.store.sweep_expired(0)
        broker.destinations()
        temporary = conn.create_temporary_queue()
        session.create_producer(temporary).send(session.create_text_message("t"))
        temporary.delete()
    with broker.connect(client_id="plans") as conn:
        session = conn.create_session()
        session.create_durable_subscriber(Topic("plans.t"), "sub").close()
        session.create_producer(Topic("plans.t")).send(session.create_text_message("for the subscription"))
        session.unsubscribe("sub")
    checked = list(_plans(path, statements))
    assert len(checked) >= 8, checked  # claims, acks, releases, scans, browse, sweep, stats, temporary queue
    for text, plan in checked:
        walks = [
            step
            for step in plan
            if step.startswith("SCAN") and step.split()[1] in ("b2b_entries", "e") and "INDEX" not in step
        ]
        assert not walks, f"{text}\n -> {plan}"


def test_an_acknowledgement_is_found_by_primary_key_not_by_owner(traced):
    broker, statements, path = traced
    queue = Queue("plans.ack")
    with broker.connect() as conn:
        conn.start()
        session = conn.create_session(ack_mode=AckMode.CLIENT)
        producer = session.create_producer(queue)
        for i in range(5):
            producer.send(session.create_text_message(f"m{i}"))
        consumer = session.create_consumer(queue)
        [consumer.receive(timeout=5) for _ in range(5)][-1].acknowledge()
    acks = [
        (text, plan)
        for text, plan in _plans(path, statements)
        if text.startswith("DELETE FROM b2b_entries WHERE id IN")
    ]
    assert acks
    for text, plan in acks:
        assert any("PRIMARY KEY" in step for step in plan), (text, plan)
        assert not any("b2b_entries_owner" in step for step in plan), (text, plan)
