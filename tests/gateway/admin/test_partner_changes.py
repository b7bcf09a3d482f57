"""Partners, keys and pins changed from the admin API (admin role): a key issued, used and revoked without a
restart, a partner added, a declared key revoked, certificates pinned and unpinned; every change audited
(never the key); viewers and operators refused; another process's registry following the store."""

from __future__ import annotations

import base64

import httpx
import pytest
import trustme
from gwtest import GLOBEX, GLOBEX_KEY, INVOICE, GatewayEnv, Responder, with_id

from gateway.errors import AuthenticationError
from gateway.http.app import create_app
from gateway.routing.overlay import PartnerOverlay
from gateway.routing.partners import PartnerRegistry, hash_key
from gateway.runtime.partners_watch import PartnersWatcher
from gateway.runtime.serving import Runtime
from gateway.trust.peer import PeerCertificate

pytestmark = pytest.mark.anyio

API = "/admin/api/v1"


def basic(name: str, secret: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{name}:{secret}".encode()).decode()}


OPERATORS = {
    "carol": {"role": "admin", "hash": hash_key("carol-secret-3", ln=4)},
    "alice": {"role": "operator", "hash": hash_key("alice-secret-1", ln=4)},
    "bob": {"role": "viewer", "hash": hash_key("bob-secret-22", ln=4)},
}
CAROL = {**basic("carol", "carol-secret-3"), "Content-Type": "application/json"}
ALICE = {**basic("alice", "alice-secret-1"), "Content-Type": "application/json"}
BOB = {**basic("bob", "bob-secret-22"), "Content-Type": "application/json"}


@pytest.fixture
async def env(make_assembly):
    assembly = make_assembly(operators=OPERATORS)
    runtime = Runtime(assembly, workers=False, etl=False, reconcile=False)
    runtime.start()
    responder = Responder(runtime.broker).start()
    app = create_app(assembly, runtime=runtime)
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, client=("10.1.2.3", 5000)), base_url="http://gw.test"
    )
    try:
        yield GatewayEnv(assembly, runtime, app, client, responder)
    finally:
        await client.aclose()
        app.state.ops.service.close()
        responder.stop()
        runtime.stop()


async def _send(env: GatewayEnv, key: str, doc_id: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/xml"}
    return await env.client.post("/v1/documents", content=with_id(INVOICE, doc_id), headers=headers)


async def _audit(env: GatewayEnv) -> list[dict]:
    r = await env.client.get(f"{API}/audit", headers=BOB)
    assert r.status_code == 200
    return r.json()["entries"]


async def test_a_key_issued_is_accepted_then_refused_once_revoked_without_a_restart(env):
    c = env.client
    r = await c.post(
        f"{API}/partners/globex/keys",
        json={"id": "globex-2027", "label": "2027", "not_after": "2099-01-01T00:00:00Z"},
        headers=CAROL,
    )
    assert r.status_code == 201, r.text
    issued = r.json()
    key = issued["key"]
    assert issued["id"] == "globex-2027" and key.startswith("globex-2027.") and issued["label"] == "2027"
    accepted = await _send(env, key, "INV-ISSUED")
    assert accepted.status_code == 202, accepted.text
    assert env.gateway.ledger.get(accepted.headers["x-message-id"]).auth == "key:globex-2027"

    listed = (await c.get(f"{API}/credentials", headers=BOB)).json()
    globex = next(p for p in listed["partners"] if p["id"] == "globex")
    assert {"id": "globex-2027", "source": "admin"}.items() <= next(
        k for k in globex["keys"] if k["id"] == "globex-2027"
    ).items()
    assert key not in str(listed) and key.split(".", 1)[1] not in str(listed)

    r = await c.post(f"{API}/partners/globex/keys/globex-2027/revoke", headers=CAROL)
    assert r.status_code == 200 and r.json()["revoked"] is True
    refused = await _send(env, key, "INV-REVOKED")
    assert refused.status_code == 401 and refused.json()["code"] == "unauthenticated"
    assert (await _send(env, GLOBEX_KEY, "INV-STILL")).status_code == 202  # the declared key still works
    again = await c.post(f"{API}/partners/globex/keys", json={"id": "globex-2027"}, headers=CAROL)
    assert again.status_code == 409 and again.json()["code"] == "partner-conflict"  # a revoked id stays taken

    entries = await _audit(env)
    by_action = {e["action"]: e for e in entries}
    assert (
        by_action["key-issue"]["operator"] == "carol" and by_action["key-issue"]["target"] == "globex key globex-2027"
    )
    assert by_action["key-revoke"]["role"] == "admin" and by_action["key-revoke"]["client"] == "10.1.2.3"
    assert all(key.split(".", 1)[1] not in str(e) for e in entries)


async def test_a_key_the_partners_file_declares_is_revoked_by_its_id(env):
    assert (
        await env.client.post("/v1/documents", content=with_id(INVOICE, "INV-D1"), headers=GLOBEX)
    ).status_code == 202
    r = await env.client.post(f"{API}/partners/globex/keys/globex-demo/revoke", headers=CAROL)
    assert r.status_code == 200, r.text
    r = await env.client.post("/v1/documents", content=with_id(INVOICE, "INV-D2"), headers=GLOBEX)
    assert r.status_code == 401
    listed = (await env.client.get(f"{API}/credentials", headers=BOB)).json()
    globex = next(p for p in listed["partners"] if p["id"] == "globex")
    assert [k["id"] for k in globex["revoked_keys"]] == ["globex-demo"]
    assert "globex-demo" not in [k["id"] for k in globex["keys"]]
    missing = await env.client.post(f"{API}/partners/globex/keys/globex-demo/revoke", headers=CAROL)
    assert missing.status_code == 409


async def test_a_partner_added_authenticates_with_its_first_key(env):
    c = env.client
    r = await c.post(f"{API}/partners", json={"id": "hooli", "name": "Hooli"}, headers=CAROL)
    assert r.status_code == 201, r.text
    assert (await c.post(f"{API}/partners", json={"id": "hooli"}, headers=CAROL)).status_code == 409
    assert (await c.post(f"{API}/partners", json={"id": "../x"}, headers=CAROL)).status_code == 400
    key = (await c.post(f"{API}/partners/hooli/keys", json={"id": "hooli-1"}, headers=CAROL)).json()["key"]
    r = await c.get("/v1/documents/ID:none", headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 404  # authenticated: no such document of its own
    listed = (await c.get(f"{API}/credentials", headers=BOB)).json()
    hooli = next(p for p in listed["partners"] if p["id"] == "hooli")
    assert hooli["source"] == "admin" and hooli["name"] == "Hooli" and hooli["keys"][0]["id"] == "hooli-1"
    assert "partner-add" in {e["action"] for e in await _audit(env)}
    assert (await c.post(f"{API}/partners/nobody/keys", json={"id": "n-1"}, headers=CAROL)).status_code == 404


async def test_certificates_are_pinned_and_unpinned_by_pem_or_fingerprint(env):
    c = env.client
    ca = trustme.CA()
    pem = ca.issue_cert("globex.example").cert_chain_pems[0].bytes().decode()
    sha256 = PeerCertificate.from_pem(pem).sha256
    r = await c.post(f"{API}/partners/globex/certificates", json={"pem": pem, "label": "globex 2027"}, headers=CAROL)
    assert r.status_code == 201 and r.json()["sha256"] == sha256
    assert env.assembly.partners.trust.by_fingerprint[sha256][0] == "globex"
    other = await c.post(f"{API}/partners/acme/certificates", json={"sha256": sha256}, headers=CAROL)
    assert other.status_code == 409 and "another partner" in other.json()["detail"]
    colons = ":".join(sha256[i : i + 2] for i in range(0, 64, 2)).upper()
    r = await c.request("DELETE", f"{API}/partners/globex/certificates", json={"sha256": colons}, headers=CAROL)
    assert r.status_code == 200 and r.json()["pinned"] is False
    assert sha256 not in env.assembly.partners.trust.by_fingerprint
    r = await c.request("DELETE", f"{API}/partners/globex/certificates", json={"sha256": sha256}, headers=CAROL)
    assert r.status_code == 404
    bad = await c.post(f"{API}/partners/globex/certificates", json={"pem": "-----BEGIN nothing"}, headers=CAROL)
    assert bad.status_code == 400
    assert {"pin-add", "pin-remove"} <= {e["action"] for e in await _audit(env)}


@pytest.mark.parametrize("who", [ALICE, BOB], ids=["operator", "viewer"])
async def test_operators_and_viewers_may_not_change_partners(env, who):
    c = env.client
    calls = [
        ("POST", f"{API}/partners", {"id": "hooli"}),
        ("POST", f"{API}/partners/globex/keys", {"id": "globex-x"}),
        ("POST", f"{API}/partners/globex/keys/globex-demo/revoke", {}),
        ("POST", f"{API}/partners/globex/certificates", {"sha256": "ab" * 32}),
        ("DELETE", f"{API}/partners/globex/certificates", {"sha256": "ab" * 32}),
    ]
    for method, path, body in calls:
        r = await c.request(method, path, json=body, headers=who)
        assert r.status_code == 403 and r.json()["code"] == "forbidden", (path, r.text)
    assert (await _send(env, GLOBEX_KEY, "INV-KEPT")).status_code == 202
    assert not {"partner-add", "key-issue", "key-revoke", "pin-add"} & {e["action"] for e in await _audit(env)}


async def test_another_process_follows_the_store_at_its_next_poll(env):
    """A second registry over the same store (as another serving process has) picks up an issued key and its
    revocation when its watcher polls, with no restart and no file change."""
    other = PartnerRegistry.from_settings(env.assembly.settings)
    declared = PartnerRegistry.from_settings(env.assembly.settings)
    other.overlay = PartnerOverlay.for_broker(env.broker, declared)
    other.adopt(other.overlay.rebuild())
    watcher = PartnersWatcher(env.assembly.settings, other, interval=0.2)
    assert watcher.check() is False  # nothing changed yet

    key = (await env.client.post(f"{API}/partners/globex/keys", json={"id": "globex-b"}, headers=CAROL)).json()["key"]
    assert "globex-b" not in other.keys
    assert watcher.check() is True
    assert other.authenticate(f"Bearer {key}").id == "globex"

    await env.client.post(f"{API}/partners/globex/keys/globex-b/revoke", headers=CAROL)
    assert other.authenticate(f"Bearer {key}").id == "globex"  # remembered until the next poll
    assert watcher.check() is True
    with pytest.raises(AuthenticationError):
        other.authenticate(f"Bearer {key}")


async def _console_login(env: GatewayEnv, name: str, secret: str) -> str:
    """Log in to the console; the session's CSRF token."""
    c = env.client
    form = await c.get("/console/login")
    token = form.cookies.get("b2bgw_login") or c.cookies.get("b2bgw_login")
    r = await c.post("/console/login", data={"csrf": token, "name": name, "secret": secret, "next": "/console"})
    assert r.status_code == 303
    return (await c.get(f"{API}/session")).json()["csrf_token"]


async def test_the_console_issues_a_key_shown_once_and_revokes_it(env):
    c = env.client
    csrf = await _console_login(env, "carol", "carol-secret-3")
    page = await c.get("/console/partners/credentials")
    assert page.status_code == 200 and 'id="partner-globex"' in page.text and "Issue key" in page.text
    form = {"csrf": csrf, "action": "issue-key", "partner": "globex", "id": "globex-web", "label": "console"}
    issued = await c.post("/console/partners/actions", data=form)
    assert issued.status_code == 200 and "shown this once" in issued.text
    key = issued.text.split('<code id="issued-key">', 1)[1].split("</code>", 1)[0]
    assert key.startswith("globex-web.")
    assert (await _send(env, key, "INV-WEB")).status_code == 202
    assert key not in (await c.get("/console/partners/credentials")).text  # never shown again

    form = {"csrf": csrf, "action": "revoke-key", "partner": "globex", "id": "globex-web"}
    revoked = await c.post("/console/partners/actions", data=form)
    assert revoked.status_code == 303 and "revoked" in revoked.headers["location"]
    assert (await _send(env, key, "INV-WEB-2")).status_code == 401
    page = await c.get("/console/partners/credentials")
    assert "globex-web" in page.text and "revoked" in page.text
    forged = await c.post("/console/partners/actions", data={**form, "csrf": "forged", "id": "globex-demo"})
    assert forged.status_code == 403 and (await _send(env, GLOBEX_KEY, "INV-WEB-3")).status_code == 202
    assert {"key-issue", "key-revoke"} <= {e["action"] for e in await _audit(env)}


async def test_the_console_refuses_partner_changes_to_an_operator(env):
    c = env.client
    csrf = await _console_login(env, "alice", "alice-secret-1")
    page = await c.get("/console/partners/credentials")
    assert page.status_code == 200 and "Issue key" not in page.text and "globex-demo" in page.text
    form = {"csrf": csrf, "action": "revoke-key", "partner": "globex", "id": "globex-demo"}
    r = await c.post("/console/partners/actions", data=form)
    assert r.status_code == 303 and "only+admins" in r.headers["location"]
    assert (await _send(env, GLOBEX_KEY, "INV-OP")).status_code == 202


async def test_a_key_id_another_process_issued_first_is_a_conflict(env):
    ca = trustme.CA()
    pem = ca.issue_cert("globex.example").cert_chain_pems[0].bytes().decode()
    r = await env.client.post(f"{API}/partners/globex/certificates", json={"pem": pem}, headers=CAROL)
    assert r.status_code == 201  # this process now serves the store's changes
    elsewhere = PartnerOverlay.for_broker(env.broker, PartnerRegistry.from_settings(env.assembly.settings))
    elsewhere.record("dave", "key-issue", "globex", key_id="globex-race", data={"hash": hash_key("x", ln=4)})
    assert "globex-race" not in env.assembly.partners.keys  # not polled yet
    r = await env.client.post(f"{API}/partners/globex/keys", json={"id": "globex-race"}, headers=CAROL)
    assert r.status_code == 409 and r.json()["code"] == "partner-conflict"
    r = await env.client.post(f"{API}/partners/globex/keys", json={"id": "globex-after"}, headers=CAROL)
    assert r.status_code == 201  # the store's writer goes on after the refused write


def test_a_pin_to_another_partner_is_skipped_and_revocations_always_hold(make_assembly):
    from gateway.routing.overlay import Change, merged

    declared = PartnerRegistry.from_settings(make_assembly().settings)
    sha = "ab" * 32
    changes = [
        Change(1, 0, "carol", "pin-add", "acme", sha256=sha),
        Change(2, 0, "dave", "pin-add", "globex", sha256=sha),  # raced the first: skipped
        Change(3, 0, "carol", "key-revoke", "globex", key_id="globex-demo"),
        Change(4, 0, "carol", "pin-remove", "acme", sha256=sha),
        Change(5, 0, "carol", "partner-add", "acme", data={"name": "not the file's"}),
    ]
    served = merged(declared, changes[:3])
    assert served.trust.by_fingerprint[sha][0] == "acme"
    assert "globex-demo" not in served.keys and served.revoked == {"globex-demo"}
    served = merged(declared, changes)
    assert sha not in served.trust.by_fingerprint
    assert served.partners["acme"].name == declared.partners["acme"].name  # the file's partner wins


def test_the_watcher_keeps_the_partners_served_while_the_store_is_away(make_assembly, tmp_path, caplog):
    import sqlalchemy as sa

    settings = make_assembly().settings
    registry = PartnerRegistry.from_settings(settings)
    empty = sa.create_engine(f"sqlite:///{tmp_path / 'no-tables.db'}")  # no b2b_partner_changes: like a lost store
    registry.overlay = PartnerOverlay(empty, None, PartnerRegistry.from_settings(settings))
    watcher = PartnersWatcher(settings, registry)
    with caplog.at_level("WARNING", logger="gateway.runtime.partners_watch"):
        assert watcher.check() is False and watcher.check() is False
    assert caplog.text.count("partner changes could not be read") == 1
    assert registry.authenticate(f"Bearer {GLOBEX_KEY}").id == "globex"
    empty.dispose()
