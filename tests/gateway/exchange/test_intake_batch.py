"""On the event loop (``server.intake_threads: 0``, the default), the documents that arrive together go
through the intake's stages together (parse, validate, extract, facts; each stage for all of them
before the next): every document still gets exactly its own answer or error, a request that goes away
takes nothing with it, and an invalid document's error details are worked out off the event loop."""

from __future__ import annotations

import asyncio
import threading

import pytest
from gwtest import INVOICE, ORDER_CHANGE, with_id

from gateway.errors import NoRouteError, NotWellFormedError, SchemaValidationError
from gateway.exchange import stages as intake
from ledger_contract import facts

pytestmark = pytest.mark.anyio

INVALID = ORDER_CHANGE.replace(b"<cbc:SequenceNumberID>", b"<cbc:Bogus>x</cbc:Bogus><cbc:SequenceNumberID>", 1)
NO_ROUTE = b'<?xml version="1.0"?><Quotation xmlns="urn:oasis:names:specification:ubl:schema:xsd:Quotation-2"/>'


def _partners(gw_env):
    registry = gw_env.assembly.partners
    return registry.get("globex"), registry.get("acme")


async def test_a_burst_larger_than_a_batch_gets_every_answer_and_error_its_own(gw_env):
    globex, acme = _partners(gw_env)
    gateway = gw_env.gateway
    gateway.intake_facts = "always"  # not left to the nightly load for the burst (test_intake_facts)
    bodies = []
    for i in range(intake.INTAKE_BATCH + 13):
        if i % 10 == 3:
            bodies.append((acme, INVALID, SchemaValidationError))
        elif i % 10 == 6:
            bodies.append((acme, b"<Invoice><unclosed></Invoice>", NotWellFormedError))
        elif i % 10 == 8:
            bodies.append((acme, NO_ROUTE, NoRouteError))
        else:
            bodies.append((globex, with_id(INVOICE, f"BURST-{i}"), None))
    bodies.append((globex, with_id(INVOICE, "BURST-0"), None))  # a replay of the first, in the same burst

    outcomes = await asyncio.gather(
        *(gateway.submit(partner, body) for partner, body, _ in bodies), return_exceptions=True
    )

    for i, ((_, body, error), outcome) in enumerate(zip(bodies, outcomes, strict=False)):
        if error is not None:
            assert isinstance(outcome, error), (i, outcome)
        else:
            assert not isinstance(outcome, BaseException), (i, outcome)
            expected_id = body.split(b"<cbc:ID>", 1)[1].split(b"<", 1)[0].decode()
            assert outcome.receipt["document_id"] == expected_id
    first, replay = outcomes[0], outcomes[-1]
    assert replay.message_id == first.message_id  # the replay was answered with the first's receipt
    accepted = sorted(o.receipt["document_id"] for o in outcomes[:-1] if not isinstance(o, BaseException))
    rows = gw_env.ledger_rows()
    assert sorted(row.doc_id for row in rows) == accepted  # each accepted once, nothing else stored
    assert all(row.facts is not None for row in rows)
    assert gw_env.depth("invoices.inbound") == len(accepted)


@pytest.mark.parametrize("bound", ["count", "bytes"])
async def test_documents_arriving_together_go_through_each_stage_together(gw_env, monkeypatch, bound):
    globex, _ = _partners(gw_env)
    if bound == "count":
        monkeypatch.setattr(intake, "INTAKE_BATCH", 2)
    else:  # room for two of them
        monkeypatch.setattr(intake, "INTAKE_BATCH_BYTES", 2 * len(with_id(INVOICE, "TOGETHER-0")) + 10)
    steps: list[tuple[str, str]] = []
    parse, for_ledger = intake.parse_document_text, facts.for_ledger

    def spy_parse(body, *args, **kwargs):
        steps.append(("parse", body.split(b"<cbc:ID>", 1)[1].split(b"<", 1)[0].decode()))
        return parse(body, *args, **kwargs)

    def spy_facts(root, doc_type):
        steps.append(("facts", root.findtext("{*}ID")))
        return for_ledger(root, doc_type)

    monkeypatch.setattr(intake, "parse_document_text", spy_parse)
    monkeypatch.setattr(facts, "for_ledger", spy_facts)
    ids = [f"TOGETHER-{i}" for i in range(5)]
    outcomes = await asyncio.gather(*(gw_env.gateway.submit(globex, with_id(INVOICE, i)) for i in ids))

    assert [o.receipt["document_id"] for o in outcomes] == ids
    # two at a time, each stage for both before the next
    expected = []
    for pair in (ids[0:2], ids[2:4], ids[4:]):
        expected += [("parse", i) for i in pair] + [("facts", i) for i in pair]
    assert steps == expected


async def test_a_request_that_goes_away_before_its_turn_takes_nothing_with_it(gw_env):
    globex, _ = _partners(gw_env)
    tasks = [asyncio.create_task(gw_env.gateway.submit(globex, with_id(INVOICE, f"GONE-{i}"))) for i in range(3)]
    await asyncio.sleep(0)  # each task is now waiting for the intake, which has not run yet
    tasks[1].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)

    assert isinstance(results[1], asyncio.CancelledError)
    assert [results[0].receipt["document_id"], results[2].receipt["document_id"]] == ["GONE-0", "GONE-2"]
    assert sorted(row.doc_id for row in gw_env.ledger_rows()) == ["GONE-0", "GONE-2"]


async def test_an_invalid_documents_error_details_are_worked_out_off_the_event_loop(gw_env, monkeypatch):
    _, acme = _partners(gw_env)
    gateway = gw_env.gateway
    where: list[str] = []
    explain = gateway.intake.explain_invalid

    def spy(*args, **kwargs):
        where.append(threading.current_thread().name)
        return explain(*args, **kwargs)

    monkeypatch.setattr(gateway.intake, "explain_invalid", spy)
    with pytest.raises(SchemaValidationError) as info:
        await gw_env.gateway.submit(acme, INVALID)

    assert where and threading.current_thread().name not in where
    assert any("Bogus" in error.message and error.line for error in info.value.errors)
    assert gw_env.ledger_rows() == []
