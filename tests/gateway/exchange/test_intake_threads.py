"""The intake (parse, route, validate, properties, facts) runs on the gateway's intake threads
(``server.intake_threads``) or, with 0 (the default), on the event loop: the HTTP answers, the stored
documents, their facts and the message properties are the same either way, and so are the errors."""

from __future__ import annotations

import json
import os
import threading

import httpx
import pytest
import sqlalchemy as sa
from gwtest import ACME, DESPATCH_ADVICE, GLOBEX, INVOICE, ORDER_CANCELLATION, ORDER_CHANGE, with_id

from broker_core import Queue
from gateway.config.loader import ConfigError, load_yaml, settings_from_mapping
from gateway.http.app import create_app
from gateway.runtime.serving import Runtime
from ledger_contract import facts
from ledger_contract.tables import unpack_xml

pytestmark = pytest.mark.anyio

DOCUMENTS = [
    ("OrderChange", ORDER_CHANGE, ACME), ("OrderCancellation", ORDER_CANCELLATION, ACME),
    ("Invoice", INVOICE, GLOBEX), ("DespatchAdvice", DESPATCH_ADVICE, GLOBEX),
]  # fmt: skip
INVALID = ORDER_CHANGE.replace(b"<cbc:SequenceNumberID>", b"<cbc:Bogus>x</cbc:Bogus><cbc:SequenceNumberID>", 1)
NO_ROUTE = b'<?xml version="1.0"?><Quotation xmlns="urn:oasis:names:specification:ubl:schema:xsd:Quotation-2"/>'
NOT_WELL_FORMED = b"<Invoice><unclosed></Invoice>"


def test_intake_threads_setting(tmp_path):
    assert settings_from_mapping({}, base_dir=tmp_path).intake_threads == 0
    data = load_yaml(text="server:\n  intake_threads: 2\n", name="s.yaml")
    assert settings_from_mapping(data, base_dir=tmp_path).intake_threads == 2
    for bad in ("-1", "65", "two"):
        with pytest.raises(ConfigError) as info:
            settings_from_mapping(
                load_yaml(text=f"server:\n  intake_threads: {bad}\n", name="s.yaml"), base_dir=tmp_path
            )
        assert info.value.line == 2 and "server.intake_threads" in info.value.detail


async def _run(make_assembly, threads: int, monkeypatch) -> dict:
    """Post the documents (and three refused ones) to a gateway with *threads* intake threads."""
    # the invalid document's full report within the longest budget: a busy machine must not answer with
    # libxml2's errors in one run and the full report in the other
    assembly = make_assembly(
        server=load_yaml(text=f"intake_threads: {threads}\nexplain_timeout: 10s\n", name="server.yaml")
    )
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    where: list[str] = []
    real = facts.for_ledger

    def spy(root, doc_type):
        where.append(threading.current_thread().name)
        return real(root, doc_type)

    monkeypatch.setattr(facts, "for_ledger", spy)
    try:
        app = create_app(assembly, runtime=runtime)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test") as client:
            answers = {}
            for name, document, headers in DOCUMENTS:
                response = await client.post("/v1/documents", content=document, headers=headers)
                assert response.status_code == 202, response.text
                answers[name] = response.json()
            replay = await client.post("/v1/documents", content=INVOICE, headers=GLOBEX)
            errors = {}
            for name, document in [("invalid", INVALID), ("no-route", NO_ROUTE), ("not-well-formed", NOT_WELL_FORMED)]:
                response = await client.post("/v1/documents", content=document, headers=ACME)
                errors[name] = (response.status_code, response.headers["content-type"], response.json())
        rows = {}
        with runtime.broker.engine.connect() as conn:
            for row in conn.execute(
                sa.text("SELECT doc_type, doc_id, document, facts, facts_version, receipt FROM b2b_ledger")
            ):
                rows[row.doc_type] = (row.doc_id, unpack_xml(row.document), row.facts, row.facts_version)
        messages = {}
        for destination in sorted(
            {r.destination for r in assembly.routes if isinstance(r.destination, Queue)}, key=str
        ):
            for message in runtime.broker.browse(destination):
                messages[(message.jms_type, message.get_string_property("B2BDocumentID"))] = (
                    message.text,
                    sorted((name, message.get_object_property(name)) for name in message.property_names()),
                )
        return {
            "answers": answers,
            "replay": (
                replay.status_code,
                replay.headers.get("idempotent-replayed"),
                replay.json()["message_id"] == answers["Invoice"]["message_id"],
            ),
            "errors": errors,
            "rows": rows,
            "messages": messages,
            "where": where,
        }
    finally:
        monkeypatch.undo()
        runtime.stop()


def _comparable(answer: dict) -> dict:
    return {k: v for k, v in answer.items() if k not in ("message_id", "received_at", "status_url", "correlation_id")}


async def test_the_same_answers_documents_and_facts_with_or_without_intake_threads(make_assembly, monkeypatch):
    loop_thread = threading.current_thread().name
    inline = await _run(make_assembly, 0, monkeypatch)
    threaded = await _run(make_assembly, 2, monkeypatch)

    assert {k: _comparable(v) for k, v in inline["answers"].items()} == {
        k: _comparable(v) for k, v in threaded["answers"].items()
    }
    assert inline["replay"] == threaded["replay"] == (202, "true", True)
    assert inline["errors"] == threaded["errors"]
    assert [s for s, _, _ in inline["errors"].values()] == [400, 422, 400]
    assert inline["rows"] == threaded["rows"]
    assert inline["messages"] == threaded["messages"]
    assert {doc_type for doc_type, _ in threaded["messages"]} == {name for name, _, _ in DOCUMENTS}
    assert set(inline["rows"]) == {name for name, _, _ in DOCUMENTS}
    for name, (_, document, stored_facts, version) in threaded["rows"].items():
        original = next(d for n, d, _ in DOCUMENTS if n == name)
        assert document == original
        if name in facts.LOADED_TYPES:
            assert stored_facts is not None and version == facts.VERSION
            assert json.loads(stored_facts)["kind"] in facts.KINDS.values()
        else:
            assert (stored_facts, version) == (None, None)
    # where the intake ran: the event loop's thread, or an intake thread
    assert inline["where"] and set(inline["where"]) == {loop_thread}
    assert threaded["where"] and all(name.startswith("b2bgw-intake") for name in threaded["where"])


async def test_intake_threads_take_concurrent_documents(gw_env):
    ids = [f"INV-{i}" for i in range(20)]
    import asyncio

    responses = await asyncio.gather(
        *[gw_env.client.post("/v1/documents", content=with_id(INVOICE, i), headers=GLOBEX) for i in ids]
    )
    assert [r.status_code for r in responses] == [202] * len(ids)
    assert sorted(r.json()["document_id"] for r in responses) == sorted(ids)
    assert len({r.json()["message_id"] for r in responses}) == len(ids)
    assert sorted(row.doc_id for row in gw_env.ledger_rows()) == sorted(ids)


def test_uuid7_str_is_a_version_7_uuid_of_now_in_every_thread():
    """RFC 9562, 5.7: version 7, the RFC's variant, the Unix time in milliseconds in the first 48 bits."""
    import time
    import uuid
    from concurrent.futures import ThreadPoolExecutor

    from gateway.exchange.ids import uuid7_str

    def many(_: int) -> list[str]:
        return [uuid7_str() for _ in range(700)]  # more than one 4 KiB pool of random bytes

    before = time.time_ns() // 1_000_000
    with ThreadPoolExecutor(4) as pool:
        ids = [i for chunk in pool.map(many, range(4)) for i in chunk]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids) == 2800
    for text in ids:
        parsed = uuid.UUID(text)
        assert str(parsed) == text and parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert before <= parsed.int >> 80 <= after


def test_uuid7_str_sorts_by_time_and_keeps_74_random_bits():
    import time
    import uuid

    from gateway.exchange.ids import uuid7_str

    earlier = uuid7_str()
    time.sleep(0.002)
    later = [uuid7_str() for _ in range(2000)]
    assert all(earlier < text for text in later)  # the text sorts as the time does: the index grows at its end
    random_parts = [uuid.UUID(text).int & ~(((1 << 48) - 1) << 80) & ~(0xF << 76) & ~(0x3 << 62) for text in later]
    assert len(set(random_parts)) == len(later)
    # rand_b (bits 0-61) and rand_a (bits 64-75): each of the 74 bits is set in about half of the ids
    for bit in [*range(62), *range(64, 76)]:
        ones = sum(part >> bit & 1 for part in random_parts)
        assert 800 < ones < 1200, f"bit {bit} is set in {ones} of {len(later)} ids"


async def test_a_generated_correlation_id_is_a_uuid(gw_env):
    import uuid

    response = await gw_env.client.post("/v1/documents", content=INVOICE, headers=GLOBEX)
    assert response.status_code == 202
    correlation = response.json()["correlation_id"]
    assert uuid.UUID(correlation).version == 7 and response.headers["x-correlation-id"] == correlation


async def test_serve_freezes_what_the_start_up_made(make_assembly):
    import gc

    app = create_app(make_assembly(), workers=False, etl=False, reconcile=False, freeze_gc=True)
    gc.unfreeze()
    try:
        async with app.router.lifespan_context(app):
            frozen = gc.get_freeze_count()
            assert frozen > 1000  # the broker, store, engine and gateway the lifespan started
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test") as client:
                response = await client.post("/v1/documents", content=INVOICE, headers=GLOBEX)
                assert response.status_code == 202, response.text
    finally:
        gc.unfreeze()


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="thread priorities are a POSIX feature")
async def test_a_large_document_is_taken_in_on_a_lower_priority_thread(gw_env, monkeypatch):
    """Without intake workers (none ready, or settings they cannot rebuild), a body over INLINE_MAX_BYTES
    runs through the intake on the large-document threads, niced, so that the small documents behind it keep
    the CPU; small documents never run there."""
    monkeypatch.setattr(gw_env.gateway.intake, "intake_workers", None)
    from gateway.exchange import stages as intake
    from gateway.exchange.stages import INLINE_MAX_BYTES, LARGE_NICE

    seen: list[tuple[str, int]] = []

    def spying(real):
        def spy(*args, **kwargs):
            seen.append((threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
            return real(*args, **kwargs)

        return spy

    monkeypatch.setattr(intake, "parse_document_text", spying(intake.parse_document_text))
    monkeypatch.setattr(intake, "parse_and_validate", spying(intake.parse_and_validate))
    start = INVOICE.index(b"<cac:InvoiceLine>")
    line = INVOICE[start : INVOICE.index(b"</cac:InvoiceLine>") + len(b"</cac:InvoiceLine>")]
    large = INVOICE[:start] + line * (INLINE_MAX_BYTES // len(line) + 10) + INVOICE[start:]
    assert len(large) > INLINE_MAX_BYTES

    small = await gw_env.client.post("/v1/documents", content=with_id(INVOICE, "SMALL-1"), headers=GLOBEX)
    answer = await gw_env.client.post("/v1/documents", content=with_id(large, "LARGE-1"), headers=GLOBEX)
    assert (small.status_code, answer.status_code) == (202, 202), answer.text
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert seen[0] == (threading.current_thread().name, base)
    name, nice = seen[1]
    assert name.startswith("b2bgw-large") and nice == min(19, base + LARGE_NICE)
    assert sorted(row.doc_id for row in gw_env.ledger_rows()) == ["LARGE-1", "SMALL-1"]
