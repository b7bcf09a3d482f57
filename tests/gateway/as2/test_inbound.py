"""Receiving AS2 (RFC 4130) at POST /as2: messages made by the openssl command line, every failure class of
docs/as2.md answered with its MDN disposition or HTTP problem, idempotency by Message-ID.

The MDNs are checked from the outside: their signature with ``openssl cms -verify``, the MIC against
``hashlib`` over what ``openssl cms -sign`` signed.
"""

from __future__ import annotations

import base64
import hashlib
import time

import pytest
from as2kit import (
    OUR_ID,
    as2_data,
    as2_headers,
    cms_encrypt,
    cms_sign,
    compressed_entity,
    disposition_of,
    entity,
    make_expired_pki,
    mic_of,
    openssl_verify_mdn,
    to_http,
    zlib_bomb,
)
from gwtest import INVOICE, ORDER, with_id

pytestmark = pytest.mark.anyio
PROCESSED = "automatic-action/MDN-sent-automatically; processed"


def signed_encrypted(pki, body: bytes, *, signer=None, cipher="-aes256", md="sha256", inner: bytes | None = None):
    signed = cms_sign(inner if inner is not None else entity(body), signer or pki.globex, md=md)
    return to_http(cms_encrypt(signed, pki.ours, cipher=cipher)), signed


async def post_as2(env, http, sender="GLOBEX-AS2", **options):
    headers, body = http
    all_headers = {**as2_headers(sender, **options), **headers}
    started = time.monotonic()
    response = await env.client.post("/as2", content=body, headers=all_headers)
    return response, time.monotonic() - started, all_headers


def mdn_of(response, pki) -> bytes:
    """The MDN's report, its signature verified by openssl with our certificate."""
    assert response.status_code == 200, response.text
    return openssl_verify_mdn(response.headers["content-type"], response.content, pki.ours.cert)


def signed_mic(signed_smime: bytes, digest="sha256") -> str:
    """The MIC of RFC 4130 7.3.1 over the part openssl signed (its first body part, as sent)."""
    head, _, body = signed_smime.partition(b"\n\n")
    boundary = head.split(b'boundary="')[1].split(b'"')[0]
    first = body.split(b"--" + boundary)[1]
    first = first[first.index(b"\n") + 1 :]
    first = first[:-2] if first.endswith(b"\r\n") else first[:-1]
    return base64.b64encode(hashlib.new(digest, first).digest()).decode()


async def test_a_signed_encrypted_invoice_is_accepted_with_a_signed_mdn_and_mic(as2_env, as2_pki):
    http, signed = signed_encrypted(as2_pki, INVOICE)
    response, _, sent = await post_as2(as2_env, http)
    report = mdn_of(response, as2_pki)
    assert disposition_of(report) == PROCESSED
    assert mic_of(report) == f"{signed_mic(signed)}, sha-256"
    assert response.headers["as2-from"] == OUR_ID and response.headers["as2-to"] == "GLOBEX-AS2"
    assert f"Original-Message-ID: {sent['Message-ID']}".encode() in report
    rows = as2_env.ledger_rows()
    assert len(rows) == 1 and rows[0].partner == "globex" and rows[0].document == INVOICE
    assert as2_env.depth(rows[0].destination.removeprefix("queue://")) == 1
    # the ledger keeps the MIC, the MDN as sent and its disposition
    from gateway.as2.store import As2Store

    record = As2Store(as2_env.broker.engine, as2_env.broker).get("in", "globex", sent["Message-ID"])
    assert record.message_id == rows[0].message_id and record.disposition == "processed"
    assert record.mic == mic_of(report) and response.content in record.mdn


@pytest.mark.parametrize("cipher", ["-aes128", "-aes-256-gcm", "-aes-128-gcm"])
async def test_aes_cbc_and_gcm_are_decrypted(as2_env, as2_pki, cipher):
    http, _ = signed_encrypted(as2_pki, INVOICE, cipher=cipher)
    response, _, _ = await post_as2(as2_env, http)
    assert disposition_of(mdn_of(response, as2_pki)) == PROCESSED


async def test_a_resend_gets_the_same_mdn_and_is_enqueued_once(as2_env, as2_pki):
    http, _ = signed_encrypted(as2_pki, INVOICE)
    first, _, sent = await post_as2(as2_env, http)
    again, _, _ = await post_as2(as2_env, http, message_id=sent["Message-ID"])
    assert first.status_code == again.status_code == 200
    assert again.content == first.content  # the MDN kept in the ledger, byte for byte
    rows = as2_env.ledger_rows()
    assert len(rows) == 1 and as2_env.depth(rows[0].destination.removeprefix("queue://")) == 1


async def test_the_same_message_id_with_other_content_is_a_conflict(as2_env, as2_pki):
    http, _ = signed_encrypted(as2_pki, INVOICE)
    _, _, sent = await post_as2(as2_env, http)
    other, _ = signed_encrypted(as2_pki, with_id(INVOICE, "OTHER-1"))
    response, elapsed, _ = await post_as2(as2_env, other, message_id=sent["Message-ID"])
    report = mdn_of(response, as2_pki)
    assert (
        disposition_of(report) == "automatic-action/MDN-sent-automatically; processed/error: "
        "unexpected-processing-error"
    )
    assert b"idempotency-conflict" in report
    assert len(as2_env.ledger_rows()) == 1 and elapsed < 2


async def test_a_signature_by_another_certificate_fails_authentication(as2_env, as2_pki):
    http, _ = signed_encrypted(as2_pki, INVOICE, signer=as2_pki.stranger)
    response, elapsed, _ = await post_as2(as2_env, http)
    report = mdn_of(response, as2_pki)
    assert disposition_of(report).endswith("processed/error: authentication-failed")
    assert as2_env.ledger_rows() == [] and elapsed < 2


async def test_a_tampered_body_fails_the_integrity_check(as2_env, as2_pki):
    signed = cms_sign(entity(INVOICE), as2_pki.globex)
    tampered = signed.replace(b"<cbc:ID>", b"<cbc:ID>9", 1)
    assert tampered != signed
    http = to_http(cms_encrypt(tampered, as2_pki.ours))
    response, elapsed, _ = await post_as2(as2_env, http)
    report = mdn_of(response, as2_pki)
    assert disposition_of(report).endswith("processed/error: integrity-check-failed")
    assert b"<cbc:ID>" not in report  # nothing of the payload comes back
    assert as2_env.ledger_rows() == [] and elapsed < 2


async def test_a_message_for_another_key_fails_decryption(as2_env, as2_pki):
    signed = cms_sign(entity(INVOICE), as2_pki.globex)
    http = to_http(cms_encrypt(signed, as2_pki.stranger))
    response, elapsed, _ = await post_as2(as2_env, http)
    assert disposition_of(mdn_of(response, as2_pki)).endswith("processed/error: decryption-failed")
    assert as2_env.ledger_rows() == [] and elapsed < 2


async def test_3des_is_refused_unless_the_partner_is_allowed_it(as2_env, as2_pki):
    http, _ = signed_encrypted(as2_pki, INVOICE, cipher="-des3")
    response, _, _ = await post_as2(as2_env, http)
    report = mdn_of(response, as2_pki)
    assert disposition_of(report).endswith("processed/error: decryption-failed") and b"3DES" in report
    assert as2_env.ledger_rows() == []
    # acme's agreement allows 3DES
    signed = cms_sign(entity(ORDER), as2_pki.acme)
    response, _, _ = await post_as2(as2_env, to_http(cms_encrypt(signed, as2_pki.ours, cipher="-des3")), "ACME-AS2")
    assert disposition_of(mdn_of(response, as2_pki)) == PROCESSED


async def test_sha1_signatures_are_refused(as2_env, as2_pki):
    http, _ = signed_encrypted(as2_pki, INVOICE, md="sha1")
    response, elapsed, _ = await post_as2(as2_env, http)
    report = mdn_of(response, as2_pki)
    assert disposition_of(report).endswith("processed/error: authentication-failed") and b"SHA-1" in report
    assert as2_env.ledger_rows() == [] and elapsed < 2


async def test_an_expired_partner_certificate_fails_authentication(as2_env_factory, tmp_path, as2_pki):
    expired = make_expired_pki(tmp_path / "expired", "globex-old")
    async for env in as2_env_factory(as2_data(tmp_path, as2_pki, globex_cert=expired.cert)):
        http, _ = signed_encrypted(as2_pki, INVOICE, signer=expired)
        response, elapsed, _ = await post_as2(env, http)
        report = mdn_of(response, as2_pki)
        assert disposition_of(report).endswith("processed/error: authentication-failed")
        assert b"valid from" in report and env.ledger_rows() == [] and elapsed < 2


async def test_unknown_as2_ids_are_refused_before_any_cryptography(as2_env, as2_pki, monkeypatch):
    from gateway.as2 import cms

    def never(*args, **kwargs):
        raise AssertionError("cryptography ran for an unknown partner")

    monkeypatch.setattr(cms, "decrypt", never)
    monkeypatch.setattr(cms, "verify", never)
    http, _ = signed_encrypted(as2_pki, INVOICE)
    for options in ({"receiver": "SOMEONE-ELSE"}, {}):
        sender = "GLOBEX-AS2" if options else "NOBODY-AS2"
        response, elapsed, _ = await post_as2(as2_env, http, sender, **options)
        assert response.status_code == 403 and response.json()["code"] == "as2-unknown-partner"
        assert elapsed < 2
    assert as2_env.ledger_rows() == []


async def test_an_unsigned_message_is_refused_before_any_cryptography(as2_env, as2_pki):
    response, elapsed, _ = await post_as2(as2_env, ({"Content-Type": "application/xml"}, INVOICE))
    assert response.status_code == 403 and response.json()["code"] == "as2-unprotected" and elapsed < 2
    # encrypted but not signed: refused once decrypted, as authentication-failed
    http = to_http(cms_encrypt(entity(INVOICE), as2_pki.ours))
    response, _, _ = await post_as2(as2_env, http)
    assert disposition_of(mdn_of(response, as2_pki)).endswith("processed/error: authentication-failed")
    assert as2_env.ledger_rows() == []


async def test_a_compressed_signed_message_is_inflated(as2_env, as2_pki):
    inner = compressed_entity(entity(INVOICE))  # RFC 5402: compressed, then signed and encrypted
    http, signed = signed_encrypted(as2_pki, INVOICE, inner=inner)
    response, _, _ = await post_as2(as2_env, http)
    report = mdn_of(response, as2_pki)
    assert disposition_of(report) == PROCESSED
    assert mic_of(report) == f"{signed_mic(signed)}, sha-256"  # over what was signed: the compressed part
    assert as2_env.ledger_rows()[0].document == INVOICE


async def test_a_decompression_bomb_is_refused_after_the_limit(as2_env, as2_pki):
    limit = as2_env.assembly.settings.limits.max_bytes
    bomb = zlib_bomb(max(limit * 8, 256 << 20))
    inner = compressed_entity(b"", raw_zlib=bomb)
    assert len(inner) < limit
    http, _ = signed_encrypted(as2_pki, INVOICE, inner=inner)
    response, elapsed, _ = await post_as2(as2_env, http)
    report = mdn_of(response, as2_pki)
    assert disposition_of(report).endswith("processed/error: decompression-failed")
    assert b"as2-decompressed-too-large" in report
    assert as2_env.ledger_rows() == [] and elapsed < 2


async def test_deep_mime_nesting_is_refused(as2_env, as2_pki):
    inner = entity(INVOICE)
    for _ in range(10):
        inner = compressed_entity(inner)
    http, _ = signed_encrypted(as2_pki, INVOICE, inner=inner)
    response, elapsed, _ = await post_as2(as2_env, http)
    report = mdn_of(response, as2_pki)
    assert disposition_of(report).endswith("processed/error: unexpected-processing-error")
    assert b"as2-mime-invalid" in report and b"nests" in report
    assert as2_env.ledger_rows() == [] and elapsed < 2


async def test_a_schema_failure_is_a_processed_error_naming_the_problem_code(as2_env, as2_pki):
    broken = INVOICE.replace(b"<cbc:IssueDate>", b"<cbc:Unexpected/><cbc:IssueDate>", 1)
    http, _ = signed_encrypted(as2_pki, broken)
    response, _, _ = await post_as2(as2_env, http)
    report = mdn_of(response, as2_pki)
    assert disposition_of(report).endswith("processed/error: unexpected-processing-error")
    assert b"schema" in report.lower() and b"Unexpected" not in report
    assert as2_env.ledger_rows() == []


async def test_an_unsigned_mdn_when_none_is_asked_for_signing(as2_env, as2_pki):
    http, _ = signed_encrypted(as2_pki, INVOICE)
    response, _, _ = await post_as2(as2_env, http, signed_mdn=False)
    assert response.headers["content-type"].startswith("multipart/report")
    assert disposition_of(response.content) == PROCESSED


async def test_a_body_over_the_limit_is_refused_unread(as2_env, as2_pki):
    inbound_limit = as2_env.assembly.settings.limits.max_bytes * 2 + 64 * 1024
    headers = {
        **as2_headers("GLOBEX-AS2"),
        "Content-Type": "application/pkcs7-mime; smime-type=enveloped-data",
        "Content-Length": str(inbound_limit + 1),
    }
    response = await as2_env.client.post("/as2", content=b"x" * (inbound_limit + 1), headers=headers)
    assert response.status_code == 413


async def test_the_openapi_document_describes_post_as2(as2_env):
    document = (await as2_env.client.get("/openapi.json")).json()
    operation = document["paths"]["/as2"]["post"]
    assert {p["name"] for p in operation["parameters"]} >= {"AS2-From", "AS2-To", "Message-ID"}
    assert {"200", "400", "403", "413"} <= set(operation["responses"])
