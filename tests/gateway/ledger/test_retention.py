"""The partner's side of retention: a document archived (or purged) by the ledger's retention policy answers
``410 Gone`` to its own partner (RFC 9110 §15.5.11: the resource is gone, knowingly and for good) with a
problem saying when, and ``404`` to any other partner, exactly as before (another partner's documents are
never told apart from missing ones). A replay across the retention boundary: within it, the first answer
again; after the purge, while the tombstone is kept, never accepted as a new document (409
``archived-replay`` naming the first, or the conflict for another document under its key); after the
tombstone's time, a new document. Only documents in a final status are ever due."""

from __future__ import annotations

import time
from typing import Any

import pytest
import sqlalchemy as sa
from gwtest import ACME, GLOBEX, INVOICE, ORDER, GatewayEnv, with_id

from broker_core import Queue
from ledger_contract.retention import RetentionPolicy, Rule
from ledger_contract.tables import documents, tombstones
from spark_etl import archive

pytestmark = pytest.mark.anyio

PROBLEM = "application/problem+json"
DAY_MS = 86_400_000


def policy(**changes: Any) -> RetentionPolicy:
    values: dict[str, Any] = {"default": Rule(90 * 86400.0, "archive"), "tombstones": 400 * 86400.0}
    values.update(changes)
    return RetentionPolicy(**values)


def run_archive(
    env: GatewayEnv, tmp_path: Any, *, days: float = 91, pol: RetentionPolicy | None = None, **kw: Any
) -> archive.ArchiveResult:
    """The archive job on the gateway's own store, as if *days* had passed."""
    store = env.broker
    return archive.run(
        pol or policy(),
        engine=store.engine,
        write=archive.store_writer(store),
        root=str(tmp_path / "warehouse"),
        wait_for_warehouse=False,
        now=int(time.time() * 1000 + days * DAY_MS),
        **kw,
    )


async def deliver_invoices(env: GatewayEnv) -> None:
    """Consume and acknowledge what waits in invoices.inbound, then let the reconciler mark it delivered."""
    conn = env.broker.connect()
    conn.start()
    try:
        consumer = conn.create_session(False).create_consumer(Queue("invoices.inbound"))
        while consumer.receive(0.2) is not None:
            pass
    finally:
        conn.close()
    assert env.runtime.reconciler is not None
    env.runtime.reconciler.run_once()


async def post(env: GatewayEnv, body: bytes, headers: dict[str, str], **extra: str) -> Any:
    return await env.client.post("/v1/documents", content=body, headers={**headers, **extra})


def assert_problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM)
    body = response.json()
    assert body["code"] == code and body["status"] == status
    return body


def is_iso(text: str) -> bool:
    import datetime

    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).tzinfo is not None


async def test_archived_document_answers_410_to_its_partner_and_404_to_another(gw_env, tmp_path):
    answered = await post(gw_env, with_id(ORDER, "RET-1"), ACME)
    assert answered.status_code == 200
    message_id = answered.headers["x-message-id"]
    before = await gw_env.client.get(f"/v1/documents/{message_id}", headers=ACME)
    assert before.status_code == 200 and before.json()["status"] == "replied"

    result = run_archive(gw_env, tmp_path)
    assert result.archived == result.purged == 1

    gone = await gw_env.client.get(f"/v1/documents/{message_id}", headers=ACME)
    body = assert_problem(gone, 410, "document-archived")
    assert body["message_id"] == message_id
    assert body["status_url"] == f"/v1/documents/{message_id}"
    assert is_iso(body["archived_at"]) and is_iso(body["received_at"])
    assert body["received_at"] <= body["archived_at"]
    assert "archive" in body["detail"]
    reply = await gw_env.client.get(f"/v1/documents/{message_id}/reply", headers=ACME)
    assert_problem(reply, 410, "document-archived")
    # another partner cannot tell it from a document that never existed
    other = await gw_env.client.get(f"/v1/documents/{message_id}", headers=GLOBEX)
    never = await gw_env.client.get("/v1/documents/ID:never-accepted-1", headers=GLOBEX)
    assert_problem(other, 404, "not-found")
    assert_problem(never, 404, "not-found")
    assert other.json()["title"] == never.json()["title"]


async def test_replay_within_retention_gets_first_answer_after_purge_refused(gw_env, tmp_path):
    first = await post(gw_env, with_id(ORDER, "RET-2"), ACME)
    assert first.status_code == 200
    again = await post(gw_env, with_id(ORDER, "RET-2"), ACME)
    assert again.status_code == 200 and again.headers.get("idempotent-replayed") == "true"
    assert again.content == first.content

    # not yet due: the replay still gets the first answer
    assert run_archive(gw_env, tmp_path, days=89).purged == 0
    assert (await post(gw_env, with_id(ORDER, "RET-2"), ACME)).status_code == 200

    assert run_archive(gw_env, tmp_path, days=91).purged == 1
    enqueued = len(gw_env.responder.seen)
    replay = await post(gw_env, with_id(ORDER, "RET-2"), ACME)
    body = assert_problem(replay, 409, "archived-replay")
    assert body["message_id"] == first.headers["x-message-id"]
    assert is_iso(body["archived_at"])
    assert len(gw_env.responder.seen) == enqueued  # nothing was enqueued
    # another document under the same key: the conflict it always was, naming the first
    changed = with_id(ORDER, "RET-2").replace(b"Information text for the whole order", b"A different note", 1)
    conflict = await post(gw_env, changed, ACME)
    assert assert_problem(conflict, 409, "idempotency-conflict")["message_id"] == first.headers["x-message-id"]
    rows = [r for r in gw_env.ledger_rows() if r.doc_id == "RET-2"]
    assert rows == []


async def test_replay_with_idempotency_key_header_after_purge(gw_env, tmp_path):
    first = await post(gw_env, INVOICE, GLOBEX, **{"Idempotency-Key": "inv-ret-3"})
    assert first.status_code == 202
    await deliver_invoices(gw_env)
    assert run_archive(gw_env, tmp_path).purged == 1
    replay = await post(gw_env, INVOICE, GLOBEX, **{"Idempotency-Key": "inv-ret-3"})
    assert assert_problem(replay, 409, "archived-replay")["message_id"] == first.json()["message_id"]
    assert gw_env.depth("invoices.inbound") == 0
    # the same body under a key of its own is a new document
    fresh = await post(gw_env, INVOICE, GLOBEX, **{"Idempotency-Key": "inv-ret-3b"})
    assert fresh.status_code == 202


async def test_replay_after_the_tombstone_expires_is_a_new_document(gw_env, tmp_path):
    first = await post(gw_env, INVOICE, GLOBEX, **{"Idempotency-Key": "inv-ret-4"})
    await deliver_invoices(gw_env)
    assert run_archive(gw_env, tmp_path, days=91).purged == 1
    # the tombstone is kept 400 days from the purge
    assert run_archive(gw_env, tmp_path, days=91 + 399).tombstones_expired == 0
    replay = await post(gw_env, INVOICE, GLOBEX, **{"Idempotency-Key": "inv-ret-4"})
    assert_problem(replay, 409, "archived-replay")
    assert run_archive(gw_env, tmp_path, days=91 + 401).tombstones_expired == 1
    again = await post(gw_env, INVOICE, GLOBEX, **{"Idempotency-Key": "inv-ret-4"})
    assert again.status_code == 202 and again.json()["message_id"] != first.json()["message_id"]
    gone = await gw_env.client.get(first.headers["location"], headers=GLOBEX)
    assert_problem(gone, 404, "not-found")


async def test_documents_not_in_a_final_status_stay_online(gw_env, tmp_path):
    waiting = await post(gw_env, with_id(INVOICE, "INV-WAIT"), GLOBEX)  # nobody consumes it: accepted
    assert waiting.status_code == 202
    result = run_archive(gw_env, tmp_path, days=3650)
    assert result.purged == 0
    status = await gw_env.client.get(waiting.headers["location"], headers=GLOBEX)
    assert status.status_code == 200 and status.json()["status"] == "accepted"


async def test_rules_per_route_and_document_type(gw_env, tmp_path):
    order = await post(gw_env, with_id(ORDER, "RET-6"), ACME)
    invoice = await post(gw_env, with_id(INVOICE, "INV-6"), GLOBEX)
    await deliver_invoices(gw_env)
    pol = policy(
        document_types={"Invoice": Rule(400 * 86400.0, "archive")}, routes={"ubl-order": Rule(30 * 86400.0, "purge")}
    )
    result = run_archive(gw_env, tmp_path, days=31, pol=pol)
    assert (result.archived, result.purged) == (0, 1)  # the order, purged without an archive copy
    gone = await gw_env.client.get(order.headers["content-location"], headers=ACME)
    assert "without an archive copy" in assert_problem(gone, 410, "document-archived")["detail"]
    assert (await gw_env.client.get(invoice.headers["location"], headers=GLOBEX)).status_code == 200
    assert run_archive(gw_env, tmp_path, days=399, pol=pol).purged == 0
    result = run_archive(gw_env, tmp_path, days=401, pol=pol)
    assert (result.archived, result.purged) == (1, 1)
    assert_problem(await gw_env.client.get(invoice.headers["location"], headers=GLOBEX), 410, "document-archived")


async def test_warehouse_load_not_caught_up_keeps_documents_online(gw_env, tmp_path):
    await post(gw_env, with_id(ORDER, "RET-7"), ACME)
    store = gw_env.broker
    common = dict(
        engine=store.engine,
        write=archive.store_writer(store),
        root=str(tmp_path / "wh"),
        now=int(time.time() * 1000 + 91 * DAY_MS),
    )
    result = archive.run(policy(), wait_for_warehouse=True, **common)  # the load never ran in this store
    assert (result.purged, result.waiting) == (0, 1)
    with store.engine.begin() as conn:  # the load has read every event so far
        top = conn.execute(sa.text("SELECT max(seq) FROM b2b_ledger_events")).scalar()
        conn.execute(
            sa.text(
                "INSERT INTO etl_runs (mode, status, owner, started_at, seq_from, seq_to) "
                "VALUES ('incremental', 'succeeded', 't', 0, 0, :s)"
            ),
            {"s": top},
        )
    result = archive.run(policy(), wait_for_warehouse=True, **common)
    assert (result.purged, result.waiting) == (1, 0)


async def test_replay_racing_the_purge_is_never_enqueued(gw_env, tmp_path):
    """A replay whose key this process remembers (it skips the ledger insert) after the purge: refused."""
    first = await post(gw_env, with_id(ORDER, "RET-8"), ACME)
    assert first.status_code == 200
    assert gw_env.gateway.idempotency._recent  # the key is remembered, as after any accepted document
    run_archive(gw_env, tmp_path)
    seen = len(gw_env.responder.seen)
    replay = await post(gw_env, with_id(ORDER, "RET-8"), ACME)
    assert_problem(replay, 409, "archived-replay")
    assert len(gw_env.responder.seen) == seen


def test_ledger_refuses_a_tombstoned_key_on_postgresql(postgres_schema):
    """The insert's own check (PostgreSQL: in the INSERT statement) refuses a key a tombstone holds."""
    from broker_core import Broker
    from gateway.ledger.records import DuplicateDocumentError, Ledger, NewDocument, upgrade_ledger
    from ledger_contract.lifecycle import purge

    broker = Broker.open(postgres_schema, sweep_interval=0)
    try:
        upgrade_ledger(broker.engine)
        ledger = Ledger(broker.engine)

        def doc(mid: str, key: str) -> NewDocument:
            return NewDocument(
                message_id=mid,
                partner="acme",
                doc_type="Order",
                doc_namespace="ns",
                doc_id="1",
                idempotency_key=key,
                correlation_id="c",
                route="r",
                destination="queue://q",
                received_at=1000,
                document=b"<a/>",
                receipt="{}",
                digest="sha256:x",
            )

        broker.write(lambda conn: ledger.insert(conn, doc("ID:1", "k1")))
        with broker.engine.connect() as conn:
            updated = conn.execute(sa.select(documents.c.updated_at)).scalar()
        broker.write(lambda conn: purge(conn, [("ID:1", updated)], 1, True, 2000))
        with pytest.raises(DuplicateDocumentError):
            broker.write(lambda conn: ledger.insert(conn, doc("ID:2", "k1")))
        broker.write(lambda conn: ledger.insert(conn, doc("ID:3", "k2")))  # another key: accepted
        with broker.engine.connect() as conn:
            assert conn.execute(sa.select(documents.c.message_id)).scalars().all() == ["ID:3"]
            assert conn.execute(sa.select(tombstones.c.message_id)).scalars().all() == ["ID:1"]
        assert ledger.tombstone("ID:1").partner == "acme"
        assert ledger.tombstone_for_key("k1").message_id == "ID:1"
    finally:
        broker.close()
