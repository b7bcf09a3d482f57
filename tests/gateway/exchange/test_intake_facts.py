"""``server.intake_facts``: when the gateway extracts the warehouse facts at intake.

``always`` for every document of a loaded type; ``when_idle`` (the default) unless the intake is
saturated (``intake.INTAKE_BUSY`` documents or more waiting for it together) or the document is over
``intake.FACTS_MAX_BYTES``, when they are left to the nightly load, which extracts them from the stored XML; ``never``. Whatever the policy, every
document gets the same answer, message and ledger row but for the facts."""

from __future__ import annotations

import asyncio
import json

import pytest
import sqlalchemy as sa
from gwtest import DESPATCH_ADVICE, INVOICE, with_id
from lxml import etree

from gateway.config.loader import ConfigError, load_yaml, settings_from_mapping
from gateway.exchange import stages as intake
from gateway.exchange.submission import Gateway
from gateway.runtime.serving import Runtime
from ledger_contract import facts
from ledger_contract.tables import unpack_xml

pytestmark = pytest.mark.anyio


def test_the_setting(tmp_path):
    assert settings_from_mapping({}, base_dir=tmp_path).intake_facts == "when_idle"
    for value in ("always", "when_idle", "never"):
        data = load_yaml(text=f"server:\n  intake_facts: {value}\n", name="s.yaml")
        assert settings_from_mapping(data, base_dir=tmp_path).intake_facts == value
    for bad in ("sometimes", "true", "1"):
        with pytest.raises(ConfigError) as info:
            settings_from_mapping(load_yaml(text=f"server:\n  intake_facts: {bad}\n", name="s.yaml"), base_dir=tmp_path)
        assert info.value.line == 2 and "server.intake_facts" in info.value.detail
        assert "always, when_idle, never" in info.value.detail


async def test_a_gateway_refuses_an_unknown_policy(gw_env):
    with pytest.raises(ValueError, match="intake_facts"):
        Gateway(gw_env.assembly, gw_env.runtime.broker, intake_facts="later")


def _rows(gw_env) -> dict[str, tuple]:
    with gw_env.runtime.broker.engine.connect() as conn:
        return {
            row.doc_id: (row.facts, row.facts_version, unpack_xml(row.document))
            for row in conn.execute(sa.text("SELECT doc_id, facts, facts_version, document FROM b2b_ledger"))
        }


async def _one_by_one(gw_env, prefix: str, n: int) -> list:
    globex = gw_env.assembly.partners.get("globex")
    return [await gw_env.gateway.submit(globex, with_id(INVOICE, f"{prefix}-{i}")) for i in range(n)]


async def _burst(gw_env, prefix: str, n: int) -> list:
    globex = gw_env.assembly.partners.get("globex")
    return await asyncio.gather(*(gw_env.gateway.submit(globex, with_id(INVOICE, f"{prefix}-{i}")) for i in range(n)))


async def test_when_idle_documents_arriving_alone_get_their_facts(gw_env):
    assert gw_env.gateway.intake_facts == "when_idle"
    await _one_by_one(gw_env, "ALONE", 3)
    rows = _rows(gw_env)
    assert len(rows) == 3
    for _doc_id, (stored, version, document) in rows.items():
        assert stored is not None and version == facts.VERSION
        # the facts are those of the document stored with them
        assert json.loads(stored) == json.loads(facts.for_ledger(etree.fromstring(document), "Invoice"))
    assert gw_env.gateway.facts_deferred == 0


async def test_when_idle_a_saturated_intake_leaves_the_facts_to_the_nightly_load(gw_env):
    n = intake.INTAKE_BUSY * 3
    outcomes = await _burst(gw_env, "BURST", n)  # all waiting for the event loop's intake together
    assert [o.receipt["document_id"] for o in outcomes] == [f"BURST-{i}" for i in range(n)]
    rows = _rows(gw_env)
    assert len(rows) == n
    assert all(stored is None and version is None for stored, version, _ in rows.values())
    assert gw_env.gateway.facts_deferred == n
    # the documents are stored whole all the same: the load extracts the facts from them
    assert all(b"<cbc:ID>BURST-" in document for _, _, document in rows.values())
    # once the burst is over, a document arriving alone gets its facts again
    await _one_by_one(gw_env, "AFTER", 1)
    assert _rows(gw_env)["AFTER-0"][0] is not None


async def test_a_batch_under_the_threshold_is_not_saturated(gw_env):
    await _burst(gw_env, "FEW", intake.INTAKE_BUSY - 1)
    assert all(stored is not None for stored, _, _ in _rows(gw_env).values())
    assert gw_env.gateway.facts_deferred == 0


async def test_always_extracts_them_even_when_saturated(gw_env):
    gw_env.gateway.intake_facts = "always"
    await _burst(gw_env, "BURST", intake.INTAKE_BUSY * 3)
    assert all(stored is not None for stored, _, _ in _rows(gw_env).values())
    assert gw_env.gateway.facts_deferred == 0


async def test_never_leaves_them_all_to_the_load(gw_env):
    gw_env.gateway.intake_facts = "never"
    await _one_by_one(gw_env, "ALONE", 2)
    assert all(stored is None for stored, _, _ in _rows(gw_env).values())
    assert gw_env.gateway.facts_deferred == 0  # not deferred for saturation: never wanted


async def test_a_document_type_the_warehouse_does_not_load_is_not_counted(gw_env):
    globex = gw_env.assembly.partners.get("globex")
    await asyncio.gather(
        *(gw_env.gateway.submit(globex, with_id(DESPATCH_ADVICE, f"DA-{i}")) for i in range(intake.INTAKE_BUSY * 2))
    )
    assert gw_env.gateway.facts_deferred == 0


async def test_on_intake_threads_a_queue_behind_them_is_saturation(make_assembly, monkeypatch):
    assembly = make_assembly(server=load_yaml(text="intake_threads: 1\n", name="server.yaml"))
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    try:
        gateway = runtime.gateway
        globex = assembly.partners.get("globex")
        await gateway.submit(globex, with_id(INVOICE, "ALONE"))
        n = intake.INTAKE_BUSY * 4
        await asyncio.gather(*(gateway.submit(globex, with_id(INVOICE, f"Q-{i}")) for i in range(n)))
        with runtime.broker.engine.connect() as conn:
            stored = dict(conn.execute(sa.text("SELECT doc_id, facts FROM b2b_ledger")).all())
        assert stored["ALONE"] is not None
        deferred = [doc_id for doc_id, value in stored.items() if value is None]
        # the first INTAKE_BUSY found the thread's queue short enough; those queued behind them did not
        assert set(f"Q-{i}" for i in range(intake.INTAKE_BUSY)).isdisjoint(deferred)
        assert len(deferred) == gateway.facts_deferred > 0
    finally:
        runtime.stop()


def _large_invoice(doc_id: str) -> bytes:
    """The example invoice with enough notes to pass intake.FACTS_MAX_BYTES (valid: cbc:Note repeats)."""
    notes = b"<cbc:Note>" + b"n" * 1000 + b"</cbc:Note>"
    document = with_id(INVOICE, doc_id)
    return document.replace(b"<cbc:Note>", notes * (intake.FACTS_MAX_BYTES // len(notes) + 1) + b"<cbc:Note>", 1)


async def test_when_idle_a_large_document_leaves_its_facts_to_the_nightly_load(gw_env):
    globex = gw_env.assembly.partners.get("globex")
    large = _large_invoice("LARGE")
    assert len(large) > intake.FACTS_MAX_BYTES
    outcome = await gw_env.gateway.submit(globex, large)
    assert outcome.receipt["document_id"] == "LARGE"
    stored, version, document = _rows(gw_env)["LARGE"]
    assert stored is None and version is None and gw_env.gateway.facts_deferred == 1
    assert document == large  # stored whole: the load extracts the facts from it
    await _one_by_one(gw_env, "SMALL", 1)
    assert _rows(gw_env)["SMALL-0"][0] is not None


async def test_always_extracts_the_facts_of_a_large_document(gw_env):
    gw_env.gateway.intake_facts = "always"
    globex = gw_env.assembly.partners.get("globex")
    await gw_env.gateway.submit(globex, _large_invoice("LARGE"))
    stored, _, document = _rows(gw_env)["LARGE"]
    assert json.loads(stored) == json.loads(facts.for_ledger(etree.fromstring(document), "Invoice"))
