"""The AS2 record of a document on the operations console and in the admin API: what was received, its MIC,
the disposition, and the MDN exactly as the partner got it."""

from __future__ import annotations

import html
import re

import pytest
from as2kit import as2_data, disposition_of, mic_of
from gwtest import INVOICE
from test_inbound import mdn_of, post_as2, signed_encrypted

from gateway.routing.partners import hash_key

pytestmark = pytest.mark.anyio

OPERATORS = {
    "alice": {"role": "operator", "hash": hash_key("alice-secret-1", ln=4)},
    "bob": {"role": "viewer", "hash": hash_key("bob-secret-22", ln=4)},
}


@pytest.fixture
async def console_env(as2_env_factory, tmp_path, as2_pki):
    data = as2_data(tmp_path, as2_pki)
    data["operators"] = OPERATORS
    async for env in as2_env_factory(data):
        yield env


async def login(env, name: str, secret: str) -> None:
    c = env.client
    form = await c.get("/console/login")
    token = c.cookies.get("b2bgw_login")
    r = await c.post("/console/login", data={"csrf": token, "name": name, "secret": secret, "next": "/console"})
    assert r.status_code == 303 and c.cookies.get("b2bgw_session"), form.text[:200]


async def test_the_document_page_shows_the_as2_record_and_serves_the_mdn_the_partner_got(console_env, as2_pki):
    env = console_env
    response, _, sent = await post_as2(env, signed_encrypted(as2_pki, INVOICE)[0])
    report = mdn_of(response, as2_pki)
    [row] = env.ledger_rows()
    await login(env, "bob", "bob-secret-22")  # a viewer reads it, like the document itself

    page = await env.client.get(f"/console/ledger/{row.message_id}")
    assert page.status_code == 200
    section = page.text[page.text.index('id="as2"') :]
    mic, _, algorithm = mic_of(report).partition(",")
    assert html.escape(sent["Message-ID"]) in section and "globex" in section
    assert disposition_of(report).endswith("processed") and ">processed</dd>" in section
    assert mic.strip() in section and algorithm.strip() in section  # sha-256
    link = html.unescape(re.search(r'href="(/admin/api/v1/documents/[^"]+/mdn\?[^"]+)"', section).group(1))

    download = await env.client.get(link)
    assert download.status_code == 200
    assert download.headers["content-disposition"].startswith("attachment;")
    assert download.headers["x-content-type-options"] == "nosniff"
    # the MIME entity as sent: the answer's MDN headers, then the very body the partner received
    head, _, body = download.content.partition(b"\r\n\r\n")
    assert body == response.content
    for name in ("content-type", "message-id", "as2-from", "as2-to"):
        assert f"{name}: {response.headers[name]}".lower().encode() in head.lower()

    detail = (await env.client.get(f"/admin/api/v1/documents/{row.message_id}")).json()
    [record] = detail["as2"]
    assert record["direction"] == "in" and record["as2_message_id"] == sent["Message-ID"]
    assert record["disposition"] == "processed" and record["mic"] == mic.strip()
    assert record["mic_algorithm"] == "sha-256" and record["mdn_bytes"] == len(download.content)

    audit = (await env.client.get("/admin/api/v1/audit?action=read-document")).json()["entries"]
    assert any("AS2 MDN (in)" in (e["detail"] or "") and e["target"] == row.message_id for e in audit)


async def test_the_mdn_download_needs_an_operator_and_an_mdn_of_that_document(console_env, as2_pki):
    env = console_env
    _, _, sent = await post_as2(env, signed_encrypted(as2_pki, INVOICE)[0])
    [row] = env.ledger_rows()
    query = {"direction": "in", "as2_message_id": sent["Message-ID"]}
    url = f"/admin/api/v1/documents/{row.message_id}/mdn"
    assert (await env.client.get(url, params=query)).status_code == 401
    await login(env, "alice", "alice-secret-1")
    assert (await env.client.get(url, params=query)).status_code == 200
    assert (await env.client.get(url, params={**query, "direction": "out"})).status_code == 404
    assert (await env.client.get(url, params={"direction": "in"})).status_code == 400
    other = "/admin/api/v1/documents/ID:not-this-one/mdn"
    assert (await env.client.get(other, params=query)).status_code == 404
