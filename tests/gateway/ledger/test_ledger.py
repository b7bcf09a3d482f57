"""Tests of gateway.ledger.records: the migration (the contract tables exactly), inserts inside
the store's commit (recorded iff enqueued), the unique idempotency key under
concurrency, conditional status moves with events, and the reconciler."""

from __future__ import annotations

import os
import threading

import pytest
import sqlalchemy as sa

from broker_core import AckMode, Broker, Queue, StoreError, XMLMessage
from gateway.ledger.reconciler import Reconciler
from gateway.ledger.records import (
    DuplicateDocumentError,
    Ledger,
    NewDocument,
    current_revision,
    head_revision,
    now_ms,
    upgrade_ledger,
)
from ledger_contract.tables import LZ4_MAGIC, documents, events, metadata


@pytest.fixture
def broker(tmp_path):
    broker = Broker.open(f"sqlite:///{tmp_path / 'l.db'}", sweep_interval=0, max_deliveries=1)
    upgrade_ledger(broker.engine)
    yield broker
    broker.close()


def record(message_id: str, key: str | None = None) -> NewDocument:
    return NewDocument(
        message_id=message_id,
        partner="acme",
        doc_type="Order",
        doc_namespace="urn:x",
        doc_id="34",
        idempotency_key=key or f"acme|{message_id}",
        correlation_id="c",
        route="r",
        destination="queue://q",
        received_at=now_ms(),
        document=b"<Order/>",
        receipt=f'{{"message_id": "{message_id}"}}',
    )


def test_migration_makes_exactly_the_contract_tables(broker):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    engine = broker.engine
    assert current_revision(engine) == head_revision() == "g0011"
    assert upgrade_ledger(engine) == "g0011"  # idempotent
    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"include_name": lambda name, type_, parent: type_ != "table" or name in metadata.tables}
        )
        diff = compare_metadata(ctx, metadata)
    assert diff == []
    names = sa.inspect(engine).get_table_names()
    assert "b2b_gateway_version" in names and "b2b_broker_version" in names


def test_insert_get_and_history(broker):
    ledger = Ledger(broker.engine)
    broker.write(lambda conn: ledger.insert(conn, record("ID:1")))
    got = ledger.get("ID:1", history=True, document=True)
    assert got.status == "accepted" and got.document == b"<Order/>" and got.history[0][0] == "accepted"
    assert ledger.find("acme|ID:1").message_id == "ID:1"
    assert ledger.get("ID:nope") is None and ledger.find("nope") is None


BIG = (
    b"<?xml version='1.0' encoding='UTF-8'?><Order>"
    + b"".join(b"<Line n='%d'><Item>Widget \xc3\xa9 %d</Item></Line>" % (n, n) for n in range(300))
    + b"</Order>"
)


def test_large_documents_and_replies_are_stored_compressed_and_read_back_exactly(broker):
    ledger = Ledger(broker.engine)
    reply = BIG.replace(b"Order>", b"OrderResponse>")
    doc = record("ID:big")
    doc.document = BIG
    broker.write(lambda conn: ledger.insert(conn, doc))
    broker.write(
        lambda conn: ledger.transition(
            conn, "ID:big", "replied", from_statuses=["accepted"], reply=reply, reply_type="OrderResponse"
        )
    )
    with broker.engine.connect() as c:
        stored_doc, stored_reply = c.execute(sa.select(documents.c.document, documents.c.reply)).one()
    assert stored_doc.startswith(LZ4_MAGIC) and len(stored_doc) < len(BIG) // 3
    assert stored_reply.startswith(LZ4_MAGIC) and len(stored_reply) < len(reply) // 3
    got = ledger.get("ID:big", document=True)
    assert (got.document, got.reply) == (BIG, reply)


def test_rows_stored_uncompressed_read_as_they_are(broker):
    """Rows an earlier gateway wrote (raw XML) read back unchanged; small documents stay raw."""
    ledger = Ledger(broker.engine)
    broker.write(lambda conn: ledger.insert(conn, record("ID:small")))
    old = {
        **{c.name: None for c in documents.c},
        "message_id": "ID:old",
        "partner": "acme",
        "doc_type": "Order",
        "doc_namespace": "urn:x",
        "idempotency_key": "old",
        "correlation_id": "c",
        "route": "r",
        "destination": "queue://q",
        "status": "replied",
        "received_at": 1,
        "updated_at": 2,
        "document": BIG,
        "reply": BIG,
    }
    broker.write(lambda conn: conn.execute(documents.insert().values(**old)))
    with broker.engine.connect() as c:
        assert (
            c.execute(sa.select(documents.c.document).where(documents.c.message_id == "ID:small")).scalar()
            == b"<Order/>"
        )
    assert ledger.get("ID:small", document=True).document == b"<Order/>"
    got = ledger.get("ID:old", document=True)
    assert (got.document, got.reply) == (BIG, BIG)


def test_duplicate_key_fails_the_whole_commit_message_included(broker):
    ledger = Ledger(broker.engine)
    conn = broker.connect()
    session = conn.create_session(True)
    producer = session.create_producer(Queue("q"))
    producer.send(XMLMessage("<a/>"))
    session.commit(in_transaction=[lambda c: ledger.insert(c, record("ID:a", "k"))])
    producer.send(XMLMessage("<b/>"))
    with pytest.raises(DuplicateDocumentError):
        session.commit(in_transaction=[lambda c: ledger.insert(c, record("ID:b", "k"))])
    assert [m.text for m in broker.browse(Queue("q"))] == ["<a/>"]
    with broker.engine.connect() as c:
        assert c.execute(sa.select(sa.func.count()).select_from(documents)).scalar() == 1
        assert c.execute(sa.select(sa.func.count()).select_from(events)).scalar() == 1
    conn.close()


def test_writes_through_the_driver_stay_in_the_store_transaction(broker):
    # on SQLite the ledger writes go through the driver's cursor: still in the store's transaction (a later
    # failure in the same commit rolls them back) and its errors raised as SQLAlchemy's
    ledger = Ledger(broker.engine)
    assert ledger._raw

    def then_fail(conn):
        ledger.insert(conn, record("ID:gone"))
        assert ledger.transition(conn, "ID:gone", "delivered", from_statuses=["accepted"])
        raise RuntimeError("a later operation of the same commit fails")

    with pytest.raises(StoreError, match="a later operation"):
        broker.write(then_fail)
    assert ledger.get("ID:gone") is None
    with broker.engine.connect() as c:
        assert c.execute(sa.select(sa.func.count()).select_from(events)).scalar() == 0

    broker.write(lambda conn: ledger.insert(conn, record("ID:1", "k1")))
    # the same message id, another key: not a duplicate, SQLAlchemy's IntegrityError as before
    with pytest.raises(
        StoreError,
        match=r"IntegrityError: \(sqlite3.IntegrityError\) UNIQUE constraint failed: "
        r"b2b_ledger.message_id",
    ) as info:
        broker.write(lambda conn: ledger.insert(conn, record("ID:1", "k2")))
    assert not isinstance(info.value, DuplicateDocumentError)
    with pytest.raises(DuplicateDocumentError):
        broker.write(lambda conn: ledger.insert(conn, record("ID:2", "k1")))
    assert ledger.find("k1").message_id == "ID:1" and ledger.find("k2") is None


def test_concurrent_duplicates_commit_once(broker):
    ledger = Ledger(broker.engine)
    results: list[str] = []
    barrier = threading.Barrier(16)

    def attempt(n: int) -> None:
        conn = broker.connect()
        session = conn.create_session(True)
        producer = session.create_producer(Queue("dups"))
        message = XMLMessage(f"<m n='{n}'/>")
        producer.send(message)
        barrier.wait()
        try:
            session.commit(in_transaction=[lambda c: ledger.insert(c, record(message.jms_message_id, "same"))])
            results.append("won")
        except DuplicateDocumentError:
            results.append("lost")
        finally:
            conn.close()

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["lost"] * 15 + ["won"]
    [message] = list(broker.browse(Queue("dups")))
    assert ledger.find("same").message_id == message.jms_message_id


def test_transitions_are_conditional_and_append_events(broker):
    ledger = Ledger(broker.engine)
    broker.write(lambda c: ledger.insert(c, record("ID:t")))
    moved = []
    broker.write(
        lambda c: moved.append(
            ledger.transition(c, "ID:t", "replied", from_statuses=("accepted",), reply=b"<R/>", reply_type="R")
        )
    )
    broker.write(lambda c: moved.append(ledger.transition(c, "ID:t", "delivered", from_statuses=("accepted",))))
    assert moved == [True, False]
    got = ledger.get("ID:t", history=True)
    assert got.status == "replied" and got.reply == b"<R/>" and [s for s, _ in got.history] == ["accepted", "replied"]


def test_transition_from_several_statuses_with_an_error_touches_only_its_row(broker):
    ledger = Ledger(broker.engine)
    for mid in ("ID:a", "ID:b"):
        broker.write(lambda c, mid=mid: ledger.insert(c, record(mid)))
    moved = []
    broker.write(lambda c: moved.append(ledger.transition(c, "ID:a", "delivered", from_statuses=["accepted"], at=1000)))
    broker.write(
        lambda c: moved.append(
            ledger.transition(
                c,
                "ID:a",
                "failed",
                from_statuses=("accepted", "delivered", "dead_lettered"),
                reply=b"<E/>",
                reply_type=None,
                error="x" * 3000,
                at=2000,
            )
        )
    )
    broker.write(lambda c: moved.append(ledger.transition(c, "ID:a", "replied", from_statuses=())))
    broker.write(lambda c: moved.append(ledger.transition(c, "ID:missing", "replied", from_statuses=("accepted",))))
    assert moved == [True, True, False, False]
    a = ledger.get("ID:a", history=True)
    assert (a.status, a.reply, a.reply_type, a.updated_at) == ("failed", b"<E/>", None, 2000)
    assert a.error == "x" * 2000 and a.history == [("accepted", a.received_at), ("delivered", 1000), ("failed", 2000)]
    b = ledger.get("ID:b", history=True)
    assert b.status == "accepted" and b.reply is None and b.error is None and len(b.history) == 1


def test_reconciler_moves_accepted_documents_on(broker):
    ledger = Ledger(broker.engine)
    conn = broker.connect()
    conn.start()
    session = conn.create_session(True)
    producer = session.create_producer(Queue("work"))
    ids = []
    for n in range(3):
        message = XMLMessage(f"<m n='{n}'/>")
        producer.send(message)
        doc = record(message.jms_message_id)
        session.commit(in_transaction=[lambda c, doc=doc: ledger.insert(c, doc)])
        ids.append(message.jms_message_id)
    reconciler = Reconciler(broker, ledger, batch=2)
    assert reconciler.run_once() + reconciler.run_once() == 0  # all pending
    consumer_session = conn.create_session(False, AckMode.CLIENT)
    consumer = consumer_session.create_consumer(Queue("work"))
    first = consumer.receive(2)
    first.acknowledge()
    second = consumer.receive(2)
    consumer_session.recover()  # max_deliveries=1: dead-lettered
    moved = sum(reconciler.run_once() for _ in range(3))
    assert moved == 2
    statuses = {mid: ledger.get(mid).status for mid in ids}
    assert statuses[first.jms_message_id] == "delivered"
    assert statuses[second.jms_message_id] == "dead_lettered"
    assert list(statuses.values()).count("accepted") == 1
    # replaying the dead letter puts the document back to accepted
    assert broker.replay_dead_letters(Queue("DLQ.work")) == 1
    assert reconciler.after_replay([second.jms_message_id]) == 1
    assert ledger.get(second.jms_message_id, history=True).history[-1][0] == "accepted"
    conn.close()


def test_the_status_cursor_walks_every_document_once_through_an_index_range(broker, tmp_path):
    """The reconciler's batches: every document of a status exactly once, in (updated_at, message_id)
    order, ties included; each batch a range of the status index, not a read of every row of the status
    (which grew with the backlog: 24 ms a batch behind 18,000 accepted orders)."""
    import sqlite3

    ledger = Ledger(broker.engine)
    docs = []
    for n in range(23):
        doc = record(f"ID:cursor-{n:02d}")
        doc.received_at = 1_000 + n // 5  # five documents to a millisecond
        docs.append(doc)
    broker.write(lambda c: [ledger.insert(c, d) for d in docs])
    statements = []

    def seen(conn, cursor, statement, parameters, context, executemany):
        if "FROM b2b_ledger" in statement:
            statements.append((statement, parameters))

    sa.event.listen(broker.engine, "before_cursor_execute", seen)
    try:
        walked, cursor = [], None
        while True:
            rows = ledger.in_status(("accepted",), after=cursor, limit=4)
            walked.extend(rows)
            if len(rows) < 4:
                break
            cursor = (rows[-1][2], rows[-1][0])
    finally:
        sa.event.remove(broker.engine, "before_cursor_execute", seen)
    assert [r[0] for r in walked] == sorted(d.message_id for d in docs)
    assert [r[2] for r in walked] == sorted(d.received_at for d in docs)
    statement, parameters = statements[-1]  # a batch after a cursor
    with sqlite3.connect(tmp_path / "l.db") as conn:
        plan = " ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + statement, parameters))
    assert "USING INDEX ix_b2b_ledger_status (status=? AND (updated_at,message_id)>(?,?))" in plan, plan
    assert "SCAN" not in plan, plan


def test_reconciler_runs_in_the_background_with_a_lease(broker):
    ledger = Ledger(broker.engine)
    conn = broker.connect()
    session = conn.create_session(True)
    producer = session.create_producer(Queue("bg"))
    message = XMLMessage("<m/>")
    producer.send(message)
    doc = record(message.jms_message_id)
    session.commit(in_transaction=[lambda c: ledger.insert(c, doc)])
    conn.start()
    taker = conn.create_session(False).create_consumer(Queue("bg"))
    assert taker.receive(2) is not None
    reconciler = Reconciler(broker, ledger, interval=0.05)
    reconciler.start()
    try:
        import time

        deadline = time.monotonic() + 5
        while ledger.get(doc.message_id).status != "delivered" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ledger.get(doc.message_id).status == "delivered"
    finally:
        reconciler.stop()
        conn.close()


@pytest.mark.postgres
def test_ledger_on_postgresql(postgres_schema):
    """`b2bgw db upgrade` on PostgreSQL; the driver-SQL insert and duplicate detection work there too."""
    from gateway.cli import main as cli
    from gateway.config.loader import settings_from_mapping
    from gateway.runtime.serving import open_broker

    assert cli.main(["db", "upgrade", "--url", postgres_schema]) == 0
    settings = settings_from_mapping({"store": {"url": postgres_schema, "options": {"sweep_interval": 0}}})
    broker = open_broker(settings)  # checks the ledger revision: no migration at start-up on PostgreSQL
    try:
        ledger = Ledger(broker.engine)
        conn = broker.connect()
        session = conn.create_session(True)
        producer = session.create_producer(Queue("pg"))
        message = XMLMessage("<a/>")
        producer.send(message)
        doc = record(message.jms_message_id, "pg-key")
        session.commit(in_transaction=[lambda c: ledger.insert(c, doc)])
        producer.send(XMLMessage("<b/>"))
        with pytest.raises(DuplicateDocumentError):
            session.commit(in_transaction=[lambda c: ledger.insert(c, record("ID:other", "pg-key"))])
        assert [m.text for m in broker.browse(Queue("pg"))] == ["<a/>"]
        got = ledger.get(doc.message_id, history=True, document=True)
        assert got.document == b"<Order/>" and got.history[0][0] == "accepted"
        moved = []  # the driver-SQL transition, with PostgreSQL's parameter style
        broker.write(
            lambda c: moved.append(
                ledger.transition(
                    c, doc.message_id, "failed", from_statuses=("accepted", "delivered"), reply=b"<E/>", error="no"
                )
            )
        )
        broker.write(
            lambda c: moved.append(ledger.transition(c, doc.message_id, "replied", from_statuses=("accepted",)))
        )
        assert moved == [True, False]
        got = ledger.get(doc.message_id, history=True)
        assert (got.status, got.reply, got.error) == ("failed", b"<E/>", "no")
        assert [s for s, _ in got.history] == ["accepted", "failed"]
        # the status cursor's row-value comparison, with ties on updated_at
        docs = [record(f"ID:pg-cursor-{n}") for n in range(5)]
        for doc in docs:
            doc.received_at = 7
        broker.write(lambda c: [ledger.insert(c, d) for d in docs])
        first = ledger.in_status(("accepted",), limit=2)
        rest = ledger.in_status(("accepted",), after=(first[-1][2], first[-1][0]), limit=10)
        assert [r[0] for r in first + rest] == sorted(d.message_id for d in docs)
        conn.close()
    finally:
        broker.close()


@pytest.mark.postgres
def test_postgresql_store_without_the_ledger_migration_is_refused():
    import uuid

    import psycopg

    from broker_core.sql import upgrade_database
    from gateway.config.loader import settings_from_mapping
    from gateway.errors import ConfigError
    from gateway.runtime.serving import open_broker

    url_base = os.environ.get("B2BGW_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
    dsn = url_base.replace("postgresql+psycopg://", "postgresql://")
    try:
        admin = psycopg.connect(dsn, autocommit=True, connect_timeout=3)
    except Exception as exc:
        if os.environ.get("B2BGW_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL required but not reachable: {exc}")
        pytest.skip(f"PostgreSQL not reachable: {exc}")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            url = f"{url_base}{'&' if '?' in url_base else '?'}schema={schema}"
            upgrade_database(url)  # the broker's tables only
            settings = settings_from_mapping({"store": {"url": url, "options": {"sweep_interval": 0}}})
            with pytest.raises(ConfigError) as info:
                open_broker(settings)
            assert "b2bgw db upgrade" in info.value.detail
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


def test_iso_ms_formats_milliseconds_across_seconds():
    from gateway.exchange.submission import iso_ms

    assert iso_ms(None) is None
    for epoch_ms, text in [
        (1710408600123, "2024-03-14T09:30:00.123Z"),
        (1710408600999, "2024-03-14T09:30:00.999Z"),
        (1710408601000, "2024-03-14T09:30:01.000Z"),
        (0, "1970-01-01T00:00:00.000Z"),
        (1710408600007, "2024-03-14T09:30:00.007Z"),
    ]:
        assert iso_ms(epoch_ms) == text
        assert iso_ms(epoch_ms) == text  # the second formatted last is reused


def test_reconciler_marks_an_expired_document_failed_not_delivered(broker):
    """A one-way document whose message expired before any consumer took it
    was not delivered: the ledger (and the warehouse that loads delivered
    documents) must not say it was."""
    import time

    ledger = Ledger(broker.engine)
    conn = broker.connect()
    session = conn.create_session(True)
    producer = session.create_producer(Queue("short-lived"))
    message = XMLMessage("<m/>")
    producer.send(message, time_to_live=100)
    doc = record(message.jms_message_id)
    session.commit(in_transaction=[lambda c: ledger.insert(c, doc)])
    time.sleep(0.3)
    assert broker.sweep_expired() == 1
    assert Reconciler(broker, ledger).run_once() == 1
    got = ledger.get(doc.message_id, history=True)
    assert got.status == "failed" and "expired" in got.error
    assert [status for status, _ in got.history] == ["accepted", "failed"]
    conn.close()


def _migrate(engine: sa.Engine, revision: str, down: bool = False) -> None:
    from alembic import command
    from alembic.config import Config

    from gateway.ledger.records import MIGRATIONS

    cfg = Config()
    cfg.set_main_option("script_location", MIGRATIONS)
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)
        conn.commit()


def test_rows_written_before_the_digest_migrate_and_read_without_one(tmp_path):
    """g0004 adds the digest column to a ledger with rows in it: they keep their keys, read with no digest,
    and the start-up's query for the recent ones is a range of the partial index that holds them alone."""
    import sqlite3

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    _migrate(engine, "g0003")
    old = {
        "message_id": "ID:old",
        "partner": "acme",
        "doc_type": "Order",
        "doc_namespace": "urn:x",
        "doc_id": "34",
        "idempotency_key": "acme|{urn:x}Order|34",
        "correlation_id": "c",
        "route": "r",
        "destination": "queue://q",
        "status": "accepted",
        "received_at": now_ms(),
        "updated_at": now_ms(),
        "document": b"<Order/>",
        "receipt": '{"message_id": "ID:old"}',
    }
    with engine.begin() as conn:
        conn.execute(
            sa.text(f"INSERT INTO b2b_ledger ({', '.join(old)}) VALUES ({', '.join(':' + k for k in old)})"), old
        )
    assert upgrade_ledger(engine) == head_revision()
    ledger = Ledger(engine)
    got = ledger.find("acme|{urn:x}Order|34", document=True)
    assert got.message_id == "ID:old" and got.digest is None and got.document == b"<Order/>"
    new = record("ID:new")
    new.digest = "sha256:" + "0" * 64
    with engine.begin() as conn:
        ledger.insert(conn, new)
    assert ledger.get("ID:new").digest == new.digest
    assert ledger.undigested_keys(0, 10) == [("acme|{urn:x}Order|34", old["received_at"])]
    assert ledger.undigested_keys(old["received_at"] + 1, 10) == []
    statements = []
    sa.event.listen(
        engine, "before_cursor_execute", lambda c, cur, st, params, ctx, many: statements.append((st, params))
    )
    ledger.undigested_keys(0, 10)
    statement, parameters = statements[-1]
    with sqlite3.connect(tmp_path / "old.db") as conn:
        plan = " ".join(row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + statement, parameters))
    assert "ix_b2b_ledger_undigested" in plan and "SCAN b2b_ledger" not in plan, plan
    # and back: the downgrade drops the column, the rows stay
    _migrate(engine, "g0003", down=True)
    with engine.connect() as conn:
        assert "digest" not in {c["name"] for c in sa.inspect(conn).get_columns("b2b_ledger")}
        assert conn.execute(sa.text("SELECT count(*) FROM b2b_ledger")).scalar() == 2
    assert upgrade_ledger(engine) == head_revision()
    engine.dispose()


@pytest.mark.postgres
def test_digest_and_rows_without_one_on_postgresql(postgres_schema):
    """g0004 on PostgreSQL: the digest is stored and read back; only rows without one are found as old."""
    from gateway.cli import main as cli
    from gateway.config.loader import settings_from_mapping
    from gateway.runtime.serving import open_broker

    assert cli.main(["db", "upgrade", "--url", postgres_schema]) == 0
    broker = open_broker(settings_from_mapping({"store": {"url": postgres_schema, "options": {"sweep_interval": 0}}}))
    try:
        ledger = Ledger(broker.engine)
        with_digest, without = record("ID:pg-d1", "pg-d1"), record("ID:pg-d2", "pg-d2")
        with_digest.digest = "sha256:" + "a" * 64
        broker.write(lambda c: [ledger.insert(c, with_digest), ledger.insert(c, without)])
        assert ledger.find("pg-d1").digest == with_digest.digest and ledger.find("pg-d2").digest is None
        assert [k for k, _ in ledger.undigested_keys(0, 10)] == ["pg-d2"]
    finally:
        broker.close()
