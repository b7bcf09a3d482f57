"""Content-safe idempotency: a document posted again under a key already taken gets the first answer only
if it is the same document (the same digest); another document gets 409 idempotency-conflict naming the
first, and is never enqueued nor answered with the first one's receipt or reply. The default key has the
document's sender party, so two parties' documents relayed through one partner account are two documents
even when they share a number. Rows written before the ledger kept digests keep replaying."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from gwtest import (
    ACME,
    DESPATCH_ADVICE,
    GLOBEX,
    INVOICE,
    ORDER,
    REPO,
    GatewayEnv,
    Responder,
    sample_data,
    with_id,
)
from lxml import etree

from gateway.config.loader import load_yaml, settings_from_mapping
from gateway.exchange import idempotency
from gateway.exchange import submission as service
from gateway.exchange.assemble import assemble
from gateway.http.app import create_app
from gateway.routing.routes import SENDER_PARTIES
from gateway.runtime.serving import Runtime
from ledger_contract.tables import documents

pytestmark = pytest.mark.anyio

PROBLEM = "application/problem+json"
CBC = "urn:oasis:names:specification:ubl:schema:xsd:CommonBasicComponents-2"
CAC = "urn:oasis:names:specification:ubl:schema:xsd:CommonAggregateComponents-2"


def with_party(document: bytes, party_element: str, endpoint: str) -> bytes:
    """The document with the ``cbc:EndpointID`` of its *party_element* (``cac:BuyerCustomerParty``...) set."""
    start = document.index(f"<{party_element}>".encode())
    at = document.index(b"<cbc:EndpointID", start)
    begin = document.index(b">", at) + 1
    end = document.index(b"</cbc:EndpointID>", begin)
    return document[:begin] + endpoint.encode() + document[end:]


def order(buyer: str, number: str, note: str = "Information text for the whole order") -> bytes:
    doc = with_party(with_id(ORDER, number), "cac:BuyerCustomerParty", buyer)
    return doc.replace(
        b"<cbc:Note>Information text for the whole order</cbc:Note>", f"<cbc:Note>{note}</cbc:Note>".encode(), 1
    )


def despatch(supplier: str, number: str, note: str = "Two pallets; handle with care.") -> bytes:
    doc = with_party(with_id(DESPATCH_ADVICE, number), "cac:DespatchSupplierParty", supplier)
    return doc.replace(
        b"<cbc:Note>Two pallets; handle with care.</cbc:Note>", f"<cbc:Note>{note}</cbc:Note>".encode(), 1
    )


def problem(response: httpx.Response) -> dict[str, Any]:
    assert response.headers["content-type"] == PROBLEM
    body = response.json()
    assert body["status"] == response.status_code and body["type"] == f"urn:b2bgw:problem:{body['code']}"
    return body


def reply_buyer(reply: bytes) -> str:
    root = etree.fromstring(reply)
    return root.findtext(f"{{{CAC}}}BuyerCustomerParty/{{{CAC}}}Party/{{{CBC}}}EndpointID")


def assert_conflict(response: httpx.Response, first_id: str) -> dict[str, Any]:
    """A 409 naming the first document, with nothing of its answer."""
    assert response.status_code == 409, response.text
    body = problem(response)
    assert body["code"] == "idempotency-conflict"
    assert body["message_id"] == first_id and body["status_url"] == f"/v1/documents/{first_id}"
    assert first_id in body["detail"]
    assert "idempotent-replayed" not in response.headers and "x-message-id" not in response.headers
    assert b"OrderResponse" not in response.content and "location" not in response.headers
    return body


class Env:
    """A gateway on a SQLite store in tmp_path that a test can restart (a new process: nothing remembered)."""

    def __init__(
        self, make_assembly: Any, tmp_path: Any, *, sample_responder: bool = False, intake_threads: int = 0
    ) -> None:
        changes: dict[str, Any] = {}
        if sample_responder:  # the sample handler answers orders.inbound in-process
            changes["workers"] = [{"module": "gateway.samples.order_responder", "concurrency": 2}]
        if intake_threads:
            changes["server"] = load_yaml(text=f"intake_threads: {intake_threads}\n", name="server.yaml")
        self.assembly = make_assembly(sample_data(tmp_path, **changes))
        self.sample_responder = sample_responder
        self.env: GatewayEnv | None = None

    async def start(self) -> GatewayEnv:
        runtime = Runtime(self.assembly, workers=self.sample_responder, etl=False, reconcile=False)
        runtime.start()
        responder = None if self.sample_responder else Responder(runtime.broker).start()
        app = create_app(self.assembly, runtime=runtime)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test")
        self.env = GatewayEnv(self.assembly, runtime, app, client, responder)
        return self.env

    async def stop(self) -> None:
        env, self.env = self.env, None
        if env is not None:
            await env.client.aclose()
            if env.responder is not None:
                env.responder.stop()
            env.runtime.stop()

    async def restart(self) -> GatewayEnv:
        await self.stop()
        return await self.start()


@pytest.fixture
async def env(make_assembly, tmp_path) -> AsyncIterator[Env]:
    holder = Env(make_assembly, tmp_path)
    await holder.start()
    try:
        yield holder
    finally:
        await holder.stop()


async def post(env: GatewayEnv, document: bytes, headers: dict[str, str], **extra: str) -> httpx.Response:
    return await env.client.post("/v1/documents", content=document, headers={**headers, **extra})


# --------------------------------------------------------------------------- two parties, one number


async def test_two_buyers_orders_with_one_number_each_get_their_own_order_response(make_assembly, tmp_path):
    """One partner account relays the orders of two buyers that share an order number: two documents,
    two messages, and each buyer's own OrderResponse from the sample responder."""
    holder = Env(make_assembly, tmp_path, sample_responder=True)
    env = await holder.start()
    try:
        first, second = order("7300000000001", "PO-77"), order("7300000000002", "PO-77")
        a = await post(env, first, ACME)
        b = await post(env, second, ACME)
        assert a.status_code == b.status_code == 200, (a.text, b.text)
        assert "idempotent-replayed" not in b.headers
        assert a.headers["x-message-id"] != b.headers["x-message-id"]
        assert reply_buyer(a.content) == "7300000000001" and reply_buyer(b.content) == "7300000000002"
        assert b"<cbc:ID>OR-PO-77</cbc:ID>" in a.content and b"<cbc:ID>OR-PO-77</cbc:ID>" in b.content
        rows = {row.message_id: row for row in env.ledger_rows()}
        assert set(rows) == {a.headers["x-message-id"], b.headers["x-message-id"]}
        assert rows[a.headers["x-message-id"]].document == first and rows[b.headers["x-message-id"]].document == second
        assert {row.doc_id for row in rows.values()} == {"PO-77"}
        # and each one's retry is its own replay, after a restart too (read from the ledger, not remembered)
        for _ in range(2):
            again_a, again_b = await post(env, first, ACME), await post(env, second, ACME)
            assert again_a.content == a.content and again_b.content == b.content
            assert again_a.headers["idempotent-replayed"] == again_b.headers["idempotent-replayed"] == "true"
            assert again_a.headers["x-message-id"] == a.headers["x-message-id"]
            assert again_b.headers["x-message-id"] == b.headers["x-message-id"]
            env = await holder.restart()
        assert len(env.ledger_rows()) == 2
    finally:
        await holder.stop()


async def test_two_suppliers_despatch_advices_with_one_id_are_two_documents(env):
    gw = env.env
    first, second = despatch("7302347231110", "DA-9"), despatch("7302347231999", "DA-9")
    a, b = await post(gw, first, GLOBEX), await post(gw, second, GLOBEX)
    assert a.status_code == b.status_code == 202
    assert a.json()["message_id"] != b.json()["message_id"] and "idempotent-replayed" not in b.headers
    assert sorted(m.text.encode() for m in gw.messages("despatch.inbound")) == sorted([first, second])
    assert (await post(gw, second, GLOBEX)).json() == b.json()


async def test_the_party_without_an_endpoint_id_is_its_party_identification(env):
    """An invoice whose supplier has no cbc:EndpointID is keyed by its PartyIdentification/cbc:ID."""
    gw = env.env
    no_endpoint = INVOICE.replace(
        b'<cbc:EndpointID schemeID="GLN" schemeAgencyID="9">1234567890123</cbc:EndpointID>', b"", 1
    )
    other = no_endpoint.replace(
        b'<cbc:ID schemeID="ZZZ">Supp123</cbc:ID>', b'<cbc:ID schemeID="ZZZ">Supp456</cbc:ID>', 1
    )
    a, b = await post(gw, no_endpoint, GLOBEX), await post(gw, other, GLOBEX)
    assert a.status_code == b.status_code == 202, (a.text, b.text)
    assert a.json()["message_id"] != b.json()["message_id"]
    keys = sorted(row.idempotency_key for row in gw.ledger_rows())
    assert [k.rsplit("|", 1)[1] for k in keys] == ["party=ZZZ:Supp123", "party=ZZZ:Supp456"]


# --------------------------------------------------------------------------- one party, one number, changed content


async def test_same_buyer_same_number_changed_content_is_409_naming_the_first(make_assembly, tmp_path):
    holder = Env(make_assembly, tmp_path, sample_responder=True)
    env = await holder.start()
    try:
        first = await post(env, order("7300000000001", "PO-5"), ACME)
        assert first.status_code == 200
        first_id = first.headers["x-message-id"]
        changed = order("7300000000001", "PO-5", note="Deliver on Monday instead")
        body = assert_conflict(await post(env, changed, ACME, **{"X-Correlation-ID": "retry-1"}), first_id)
        assert "PO-5" in body["detail"] and "GLN:7300000000001" in body["detail"]
        # the same after a restart, where the key is no longer remembered: the ledger's unique key decides
        env = await holder.restart()
        assert_conflict(await post(env, changed, ACME), first_id)
        rows = env.ledger_rows()
        assert [r.message_id for r in rows] == [first_id] and rows[0].document == order("7300000000001", "PO-5")
        status = (await env.client.get(body["status_url"], headers=ACME)).json()
        assert status["status"] == "replied" and status["document_id"] == "PO-5"
        # the first document itself still replays
        again = await post(env, order("7300000000001", "PO-5"), ACME)
        assert again.status_code == 200 and again.content == first.content
    finally:
        await holder.stop()


async def test_409_for_a_changed_document_under_the_same_idempotency_key_header(env):
    gw = env.env
    a = await post(gw, despatch("7302347231110", "DA-1"), GLOBEX, **{"Idempotency-Key": "batch-7"})
    assert a.status_code == 202
    # another document id, but the same key: the key decides, and the content differs
    assert_conflict(
        await post(gw, despatch("7302347231110", "DA-2"), GLOBEX, **{"Idempotency-Key": "batch-7"}),
        a.json()["message_id"],
    )
    assert gw.depth("despatch.inbound") == 1
    same = await post(gw, despatch("7302347231110", "DA-1"), GLOBEX, **{"Idempotency-Key": "batch-7"})
    assert same.status_code == 202 and same.json() == a.json() and same.headers["idempotent-replayed"] == "true"


async def test_a_byte_for_byte_retry_replays_and_any_change_conflicts(env):
    """The digest is of the body as received: a retry is the same bytes; re-serialised, it is another body."""
    gw = env.env
    document = despatch("7302347231110", "DA-B")
    a = await post(gw, document, GLOBEX)
    assert (await post(gw, document, GLOBEX)).headers["idempotent-replayed"] == "true"
    for variant in (document.replace(b"<cbc:Note>", b"<cbc:Note> ", 1), document + b"\n", b"\xef\xbb\xbf" + document):
        assert_conflict(await post(gw, variant, GLOBEX), a.json()["message_id"])
    [row] = gw.ledger_rows()
    assert row.digest == service.document_digest(document) and row.digest.startswith("sha256:")


async def test_the_request_reply_replay_is_never_another_documents_reply(make_assembly, tmp_path):
    """While the first order waits for its reply, a variant is refused at once, and the retry of the
    first gets the first reply."""
    holder = Env(make_assembly, tmp_path)
    env = await holder.start()
    env.responder.mode, env.responder.delay = "late", 0.5
    try:
        first = order("7300000000001", "PO-W")
        pending = asyncio.ensure_future(post(env, first, ACME))
        await asyncio.sleep(0.2)
        variant = await post(env, order("7300000000001", "PO-W", note="changed"), ACME)
        retry = await post(env, first, ACME)
        answered = await pending
        assert answered.status_code == retry.status_code == 200 and retry.content == answered.content
        assert_conflict(variant, answered.headers["x-message-id"])
        assert len(env.responder.seen) == 1
    finally:
        await holder.stop()


# --------------------------------------------------------------------------- concurrency


@pytest.mark.parametrize("intake_threads", [0, 2])
async def test_concurrent_variants_exactly_one_is_accepted(make_assembly, tmp_path, intake_threads):
    """Several posts at once under one key, some the same document, some other ones: one is accepted; the
    copies of it replay its receipt, every other document gets 409 naming it; one message, one row."""
    holder = Env(make_assembly, tmp_path, intake_threads=intake_threads)
    gw = await holder.start()
    rng = random.Random(7 + intake_threads)
    try:
        for round_ in range(5):
            number = f"DA-C{round_}"
            variants = [despatch("7302347231110", number, note=f"variant {v}") for v in range(rng.randint(2, 4))]
            posts = [rng.choice(variants) for _ in range(rng.randint(6, 12))] + variants  # each variant at least once
            rng.shuffle(posts)
            responses = await asyncio.gather(*[post(gw, body, GLOBEX) for body in posts])
            accepted = [r for r in responses if r.status_code == 202 and "idempotent-replayed" not in r.headers]
            assert len(accepted) == 1, [r.status_code for r in responses]
            winner_id = accepted[0].json()["message_id"]
            [winner_row] = [r for r in gw.ledger_rows() if r.doc_id == number]
            assert winner_row.message_id == winner_id
            for body, response in zip(posts, responses, strict=False):
                if body == winner_row.document:
                    assert response.status_code == 202 and response.json() == accepted[0].json()
                else:
                    assert_conflict(response, winner_id)
            messages = [m for m in gw.messages("despatch.inbound") if m.get_string_property("B2BDocumentID") == number]
            assert [m.jms_message_id for m in messages] == [winner_id]
    finally:
        await holder.stop()


async def test_concurrent_request_reply_variants_one_round_trip(make_assembly, tmp_path):
    holder = Env(make_assembly, tmp_path)
    env = await holder.start()
    env.responder.mode, env.responder.delay = "late", 0.3
    try:
        variants = [order("7300000000001", "PO-CC", note=f"n{v}") for v in range(3)]
        posts = variants * 3
        responses = await asyncio.gather(*[post(env, body, ACME) for body in posts])
        [row] = env.ledger_rows()
        ok = [r for body, r in zip(posts, responses, strict=False) if body == row.document]
        assert {r.status_code for r in ok} == {200} and len({r.content for r in ok}) == 1
        assert sum("idempotent-replayed" not in r.headers for r in ok) == 1
        for body, response in zip(posts, responses, strict=False):
            if body != row.document:
                assert_conflict(response, row.message_id)
        assert len(env.responder.seen) == 1
    finally:
        await holder.stop()


# --------------------------------------------------------------------------- rows written before the digest


def _make_legacy(env: GatewayEnv) -> None:
    """Turn the ledger's rows into rows an earlier gateway wrote: no digest, the default key without the
    sender party."""
    engine = env.broker.engine
    with engine.begin() as conn:
        for message_id, key in conn.execute(sa.select(documents.c.message_id, documents.c.idempotency_key)).all():
            old = key.split("|party=", 1)[0]
            conn.execute(
                documents.update().where(documents.c.message_id == message_id).values(digest=None, idempotency_key=old)
            )


async def test_rows_without_a_digest_keep_replaying(make_assembly, tmp_path):
    holder = Env(make_assembly, tmp_path, sample_responder=True)
    env = await holder.start()
    try:
        first_order = order("7300000000001", "PO-OLD")
        o = await post(env, first_order, ACME)
        d = await post(env, despatch("7302347231110", "DA-OLD"), GLOBEX)
        h = await post(env, with_id(INVOICE, "INV-OLD"), GLOBEX, **{"Idempotency-Key": "old-key"})
        assert (o.status_code, d.status_code, h.status_code) == (200, 202, 202)
        await holder.stop()
        _make_legacy(env)
        env = await holder.start()  # the upgraded gateway: the rows are recent, their old keys are checked
        assert env.gateway.idempotency._legacy_keys is not None and len(env.gateway.idempotency._legacy_keys) == 3
        assert all("|party=" not in row.idempotency_key and row.digest is None for row in env.ledger_rows())

        # the same documents replay their first answers
        again = await post(env, first_order, ACME)
        assert again.status_code == 200 and again.content == o.content and again.headers["idempotent-replayed"]
        assert (await post(env, despatch("7302347231110", "DA-OLD"), GLOBEX)).json() == d.json()
        assert (
            await post(env, with_id(INVOICE, "INV-OLD"), GLOBEX, **{"Idempotency-Key": "old-key"})
        ).json() == h.json()
        # changed ones under the same key are refused, naming the first
        assert_conflict(
            await post(env, order("7300000000001", "PO-OLD", note="changed"), ACME), o.headers["x-message-id"]
        )
        assert_conflict(
            await post(env, despatch("7302347231110", "DA-OLD", note="changed"), GLOBEX), d.json()["message_id"]
        )
        assert_conflict(
            await post(env, with_id(INVOICE, "INV-OTHER"), GLOBEX, **{"Idempotency-Key": "old-key"}),
            h.json()["message_id"],
        )
        assert len(env.ledger_rows()) == 3
        # another buyer's order with the old one's number is a document of its own
        other = await post(env, order("7300000000002", "PO-OLD"), ACME)
        assert other.status_code == 200 and "idempotent-replayed" not in other.headers
        assert reply_buyer(other.content) == "7300000000002"
        assert len(env.ledger_rows()) == 4
        # and its retry replays it, not the old row
        assert (await post(env, order("7300000000002", "PO-OLD"), ACME)).content == other.content
    finally:
        await holder.stop()


async def test_old_keys_are_checked_only_within_the_window(make_assembly, tmp_path, monkeypatch):
    holder = Env(make_assembly, tmp_path)
    env = await holder.start()
    try:
        d = await post(env, despatch("7302347231110", "DA-WIN"), GLOBEX)
        await holder.stop()
        _make_legacy(env)
        engine = env.broker.engine
        with engine.begin() as conn:  # accepted two windows ago
            conn.execute(
                documents.update().values(received_at=documents.c.received_at - 2 * service.LEGACY_KEY_WINDOW * 1000)
            )
        env = await holder.start()
        assert env.gateway.idempotency._legacy_keys is None
        # beyond the window the old key is not looked for: the document is taken under its new key
        again = await post(env, despatch("7302347231110", "DA-WIN"), GLOBEX)
        assert again.status_code == 202 and again.json()["message_id"] != d.json()["message_id"]
        # and the window closes while the gateway runs
        await holder.stop()
        with engine.begin() as conn:
            conn.execute(
                documents.update()
                .where(documents.c.message_id == d.json()["message_id"])
                .values(received_at=service.now_ms())
            )
        env = await holder.start()
        assert env.gateway.idempotency._legacy_keys is not None
        monkeypatch.setattr(idempotency.time, "time", lambda: env.gateway.idempotency._legacy_until + 1)
        assert (
            env.gateway.idempotency.legacy_key("globex", env.assembly.routes.get("ubl-despatch-advice"), "DA-WIN")
            is None
        )
        assert env.gateway.idempotency._legacy_keys is None
    finally:
        await holder.stop()


# --------------------------------------------------------------------------- the sender party and route keys


UBL = REPO / "xml_schemas" / "ubl-2.1"
XS = "{http://www.w3.org/2001/XMLSchema}"
#: UBL 2.1 types whose issuer the standard leaves open (either side may send them) or that carry no
#: party of their own: they keep the key of partner, type and document id.
UNKEYED = {
    "BillOfLading",
    "CatalogueRequest",
    "CertificateOfOrigin",
    "ForwardingInstructions",
    "FulfilmentCancellation",
    "InstructionForReturns",
    "PackingList",
    "StockAvailabilityReport",
    "TendererQualification",
    "Waybill",
}


def test_every_sender_party_path_leads_to_a_party_in_the_ubl_schemas():
    """Each step of each SENDER_PARTIES path is an element its parent's type declares (read from the UBL 2.1
    schemas themselves), ending on a cac:PartyType with cbc:EndpointID and cac:PartyIdentification; every
    UBL 2.1 document type is either listed or one of UNKEYED."""
    cac = etree.parse(str(UBL / "common" / "UBL-CommonAggregateComponents-2.1.xsd")).getroot()
    element_type = {e.get("name"): e.get("type") for e in cac.findall(f"{XS}element")}
    types = {t.get("name"): t for t in cac.findall(f"{XS}complexType")}

    def children(type_node: etree._Element) -> set[str]:
        return {e.get("ref") for e in type_node.iter(f"{XS}element") if e.get("ref")}

    names = set()
    for xsd in sorted((UBL / "maindoc").glob("UBL-*-2.1.xsd")):
        name = xsd.name[len("UBL-") : -len("-2.1.xsd")]
        names.add(name)
        root = f"{{urn:oasis:names:specification:ubl:schema:xsd:{name}-2}}{name}"
        path = SENDER_PARTIES.get(root)
        if path is None:
            continue
        node = etree.parse(str(xsd)).getroot().find(f"{XS}complexType[@name='{name}Type']")
        for step in path.split("/"):
            assert step in children(node), (name, step)
            node = types[element_type[step.split(":")[1]]]
        assert node.get("name") == "PartyType", (name, path)
        assert {"cbc:EndpointID", "cac:PartyIdentification"} <= children(node)
    assert set(etree.QName(root).localname for root in SENDER_PARTIES) == names - UNKEYED
    assert UNKEYED <= names


@pytest.fixture
def sample_routes(make_assembly):
    return make_assembly().routes


def test_the_sender_party_is_the_endpoint_id_else_the_first_party_identification(sample_routes):
    order_route = sample_routes.get("ubl-order")
    assert order_route.sender_party_path == "cac:BuyerCustomerParty/cac:Party"
    assert order_route.extract_sender_party(etree.fromstring(ORDER)) == "GLN:7300072311115"
    spaced = ORDER.replace(b">7300072311115</cbc:EndpointID>", b">\n  7300072311115 </cbc:EndpointID>", 1)
    assert order_route.extract_sender_party(etree.fromstring(spaced)) == "GLN:7300072311115"
    blank = ORDER.replace(b">7300072311115</cbc:EndpointID>", b"> </cbc:EndpointID>", 1)
    assert order_route.extract_sender_party(etree.fromstring(blank)) == "GLN:7300070011115"
    no_scheme = ORDER.replace(
        b'<cbc:EndpointID schemeAgencyID="9" schemeID="GLN">7300072311115</cbc:EndpointID>', b"", 1
    ).replace(b'<cbc:ID schemeAgencyID="9" schemeID="GLN">7300070011115</cbc:ID>', b"<cbc:ID>7300070011115</cbc:ID>", 1)
    assert order_route.extract_sender_party(etree.fromstring(no_scheme)) == "7300070011115"
    # the seller's identifiers are not the buyer's
    start, end = ORDER.index(b"<cac:BuyerCustomerParty>"), ORDER.index(b"</cac:BuyerCustomerParty>")
    buyer_ids_gone = (
        ORDER[:start] + b"<cac:BuyerCustomerParty><cac:Party><cac:PartyName><cbc:Name>x</cbc:Name>"
        b"</cac:PartyName></cac:Party>" + ORDER[end:]
    )
    assert order_route.extract_sender_party(etree.fromstring(buyer_ids_gone)) is None
    assert sample_routes.get("ubl-invoice").extract_sender_party(etree.fromstring(INVOICE)) == "GLN:1234567890123"
    assert (
        sample_routes.get("ubl-despatch-advice").extract_sender_party(etree.fromstring(DESPATCH_ADVICE))
        == "GLN:7302347231110"
    )


def route_table(tmp_path: Any, registry: Any, extra: str) -> tuple[Any, list[Any]]:
    (tmp_path / "routes.yaml").write_text(f"""routes:
  - id: r
    partners: [globex]
    root: "{{urn:oasis:names:specification:ubl:schema:xsd:DespatchAdvice-2}}DespatchAdvice"
    destination: queue://x
{extra}""")
    data = load_yaml(text="partners: {}\n", name="main.yaml")
    data["partners"] = load_yaml(REPO / "config" / "partners.yaml")["partners"]
    data["routes"] = load_yaml(tmp_path / "routes.yaml", name="routes.yaml")["routes"]
    assembly = assemble(settings_from_mapping(data, base_dir=tmp_path), registry=registry)
    return assembly.routes, assembly.errors


@pytest.mark.parametrize(
    "extra, line, words",
    [
        ("    idempotency_key: 'cbc:ID['\n", 6, "does not compile"),
        ("    idempotency_key: [cbc:ID, cac:Nope/cbc:ID]\n", 6, "does not exist"),
        ("    idempotency_key: []\n", 6, "lists no XPath"),
        ("    idempotency_key: {xpath: cbc:ID}\n", 6, "list"),
        ("    idempotency_key: [" + ", ".join(["cbc:ID"] * 9) + "]\n", 6, "at most 8"),
    ],
)
def test_route_key_xpaths_are_checked_at_load(tmp_path, gw_registry, extra, line, words):
    _, errors = route_table(tmp_path, gw_registry, extra)
    assert errors and errors[0].file == "routes.yaml" and errors[0].line == line, [str(e) for e in errors]
    assert words in errors[0].detail


def test_route_key_xpaths_replace_the_default_key(tmp_path, gw_registry):
    routes, errors = route_table(
        tmp_path,
        gw_registry,
        "    idempotency_key: [cac:OrderReference/cbc:ID, cac:DeliveryCustomerParty/cac:Party/cbc:EndpointID]\n",
    )
    assert not errors, [str(e) for e in errors]
    route = routes.get("r")
    assert route.sender_party is None and route.key_xpath_texts == (
        "cac:OrderReference/cbc:ID",
        "cac:DeliveryCustomerParty/cac:Party/cbc:EndpointID",
    )
    assert route.extract_key_values(etree.fromstring(DESPATCH_ADVICE)) == ["34", "7300072311115"]
    single, errors = route_table(tmp_path, gw_registry, "    idempotency_key: cbc:UUID\n")
    assert not errors and single.get("r").key_xpath_texts == ("cbc:UUID",)


async def test_a_route_keyed_by_its_own_xpaths(make_assembly, tmp_path):
    """Despatch advices keyed by the order they ship and the customer they go to: another advice for the same
    order and customer conflicts, whatever its own id; another customer's is a document of its own."""
    data = sample_data(tmp_path)
    [route] = [r for r in data["routes"] if r["id"] == "ubl-despatch-advice"]
    route["idempotency_key"] = ["cac:OrderReference/cbc:ID", "cac:DeliveryCustomerParty/cac:Party/cbc:EndpointID"]
    holder = Env(lambda _data: make_assembly(data), tmp_path)
    gw = await holder.start()
    try:
        first = await post(gw, despatch("7302347231110", "DA-X1"), GLOBEX)
        assert first.status_code == 202
        body = assert_conflict(await post(gw, despatch("7302347231110", "DA-X2"), GLOBEX), first.json()["message_id"])
        assert "ubl-despatch-advice" in body["detail"]
        other_customer = with_party(despatch("7302347231110", "DA-X2"), "cac:DeliveryCustomerParty", "7300000000009")
        assert (await post(gw, other_customer, GLOBEX)).status_code == 202
        assert (await post(gw, despatch("7302347231110", "DA-X1"), GLOBEX)).json() == first.json()
        nothing = DESPATCH_ADVICE.replace(
            b"<cac:OrderReference>\n    <cbc:ID>34</cbc:ID>", b"<cac:OrderReference>\n    <cbc:ID> </cbc:ID>", 1
        )
        nothing = with_party(nothing, "cac:DeliveryCustomerParty", " ")
        assert nothing != DESPATCH_ADVICE
        # no key values at all: like a document without an id, never a replay
        answers = [await post(gw, nothing, GLOBEX) for _ in range(2)]
        assert [a.status_code for a in answers] == [202, 202] and answers[0].json() != answers[1].json()
        assert gw.depth("despatch.inbound") == 4
    finally:
        await holder.stop()


def test_keys_have_the_party_and_stay_as_before_without_one(sample_routes):
    from gateway.exchange.keys import idempotency_key as key

    route = sample_routes.get("ubl-order")
    assert key("acme", route, "34", None) == f"acme|{route.root}|34"  # the key every document had before
    assert key("acme", route, "34", None, "GLN:1") == f"acme|{route.root}|34|party=GLN:1"
    assert key("acme", route, "34", None, "GLN:1") != key("acme", route, "34", None, "GLN:2")
    assert key("acme", route, "34", "k", "GLN:1") == key("acme", route, "35", "k", "GLN:2") == "acme|key|k"
    assert key("acme", route, None, None, "GLN:1").startswith("acme|unique|")
    assert key("acme", route, "34", None, None, ["a|b", "c"]) != key("acme", route, "34", None, None, ["a", "b|c"])
    long_key = key("acme", route, "x" * 200, None, "GLN:" + "9" * 296)
    assert long_key.startswith("acme|sha256|") and len(long_key) < 100


async def test_a_row_without_its_receipt_replays_the_receipt_it_was_given(env):
    """The replay of a row whose receipt column is empty is the receipt the gateway gives, rebuilt from it."""
    gw = env.env
    first = await post(gw, despatch("7302347231110", "DA-R"), GLOBEX)
    with gw.broker.engine.begin() as conn:
        conn.execute(documents.update().values(receipt=None))
    await env.restart()
    again = await post(env.env, despatch("7302347231110", "DA-R"), GLOBEX)
    assert again.headers["idempotent-replayed"] == "true" and again.json() == first.json()
