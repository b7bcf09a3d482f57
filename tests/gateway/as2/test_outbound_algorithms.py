"""What we send, for each algorithm an endpoint may choose: AES-128/256 in CBC (EnvelopedData) and GCM
(AuthEnvelopedData, RFC 5083/5084), RSA PKCS #1 v1.5 or RSA-OAEP key transport, SHA-256/384/512 signatures.

Each message is opened twice: by the gateway's own ``/as2`` (a real request, answered by its MDN, whose MIC must
be the one we computed) and by ``openssl cms -decrypt`` / ``openssl cms -verify``, which we did not write.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
from pathlib import Path

import pytest
from as2kit import OUR_ID, Pki, disposition_of, mic_of, openssl_verify_mdn, run
from asn1crypto import cms as asn1_cms
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from gwtest import INVOICE, with_id

from gateway.as2.cms import Identity
from gateway.as2.config import As2Settings
from gateway.as2.outbound import As2Endpoint, build_message
from gateway.errors import ConfigError

pytestmark = pytest.mark.anyio

ENCRYPTIONS = ("aes128_cbc", "aes256_cbc", "aes128_gcm", "aes256_gcm")
KEY_TRANSPORTS = ("rsa_pkcs1v15", "rsa_oaep")
DIGESTS = ("sha256", "sha384", "sha512")
CASES = list(itertools.product(ENCRYPTIONS, KEY_TRANSPORTS, DIGESTS))


def as_sender(pki: Pki, as2_id: str) -> As2Settings:
    """*pki*'s party as the sender: the gateway's outbound code signs with its key."""
    key = serialization.load_pem_private_key(pki.key.read_bytes(), None)
    return As2Settings(as2_id, Identity(key, x509.load_pem_x509_certificate(pki.cert.read_bytes())))


def endpoint_to(pki: Pki, as2_to: str, **choices) -> As2Endpoint:
    cert = x509.load_pem_x509_certificate(pki.cert.read_bytes())
    return As2Endpoint("https://unused.example/as2", as2_to, (cert,), cert, **choices)


def openssl_open(built, recipient: Pki, signer: Pki, folder: Path) -> tuple[bytes, bytes]:
    """Decrypt with ``openssl cms -decrypt``, then verify the detached signature over the signed part's bytes
    as sent with ``openssl cms -verify`` (its S/MIME reader would turn the part's bare LFs into CRLFs): returns
    the signed part and the content openssl verified."""
    smime = f"MIME-Version: 1.0\r\nContent-Type: {built.headers['Content-Type']}\r\n".encode()
    smime += b"Content-Transfer-Encoding: base64\r\n\r\n" + base64.encodebytes(built.body)
    signed = run(
        "openssl", "cms", "-decrypt", "-binary", "-recip", str(recipient.cert), "-inkey", str(recipient.key), data=smime
    )
    head, _, body = signed.partition(b"\r\n\r\n")
    boundary = head.split(b'boundary="')[1].split(b'"')[0]
    first, second = body.split(b"--" + boundary + b"\r\n")[1:3]
    part = first[: -len(b"\r\n")]
    signature = base64.b64decode(second.split(b"\r\n\r\n", 1)[1].split(b"\r\n--" + boundary)[0])
    (folder / "part.bin").write_bytes(part)
    (folder / "sig.der").write_bytes(signature)
    content = run(
        "openssl",
        "cms",
        "-verify",
        "-binary",
        "-noverify",
        "-nointern",
        "-certfile",
        str(signer.cert),
        "-inform",
        "DER",
        "-in",
        str(folder / "sig.der"),
        "-content",
        str(folder / "part.bin"),
    )
    return part, content


def structure(der: bytes) -> tuple[str, str, str]:
    """The CMS type, content encryption and key transport of an encrypted message, read with asn1crypto."""
    info = asn1_cms.ContentInfo.load(der)
    kind = info["content_type"].native
    data = info["content"]
    encrypted = data[
        "auth_encrypted_content_info" if kind == "authenticated_enveloped_data" else "encrypted_content_info"
    ]
    ktri = data["recipient_infos"][0].chosen
    return (
        kind,
        encrypted["content_encryption_algorithm"]["algorithm"].native,
        ktri["key_encryption_algorithm"]["algorithm"].native,
    )


@pytest.mark.parametrize(("encryption", "key_transport", "digest"), CASES)
def test_openssl_decrypts_and_verifies_what_we_send(as2_pki, tmp_path, encryption, key_transport, digest):
    endpoint = endpoint_to(
        as2_pki.globex, "GLOBEX-AS2", encryption=encryption, key_transport=key_transport, digest=digest
    )
    built = build_message(endpoint, as_sender(as2_pki.ours, OUR_ID), INVOICE, "application/xml", "<m-1@test>")
    kind, cipher, transport = structure(built.body)
    gcm = encryption.endswith("_gcm")
    assert kind == ("authenticated_enveloped_data" if gcm else "enveloped_data") and cipher == encryption
    assert transport == ("rsaes_oaep" if key_transport == "rsa_oaep" else "rsaes_pkcs1v15")
    assert ("smime-type=authEnveloped-data" if gcm else "smime-type=enveloped-data") in built.headers["Content-Type"]
    part, content = openssl_open(built, as2_pki.globex, as2_pki.ours, tmp_path)
    assert content == part and part.endswith(INVOICE)
    assert f"micalg=sha-{digest[3:]}" in built_signed_type(built, as2_pki.globex)
    # the MIC we expect back is the digest of the signed part as sent (RFC 4130 7.3.1)
    value = base64.b64encode(hashlib.new(digest, part).digest()).decode()
    assert built.mic == f"{value}, sha-{digest[3:]}"


def built_signed_type(built, recipient: Pki) -> str:
    from gateway.as2.cms import decrypt

    key = serialization.load_pem_private_key(recipient.key.read_bytes(), None)
    inner, _ = decrypt(built.body, Identity(key, x509.load_pem_x509_certificate(recipient.cert.read_bytes())))
    return inner.split(b"\r\n", 1)[0].decode()


async def test_the_gateway_accepts_what_we_send_with_every_algorithm(as2_env, as2_pki):
    """globex's side played by our outbound code (its key signs, our certificate encrypts): every message is
    accepted by /as2 with a signed MDN naming the MIC we computed."""
    sender = as_sender(as2_pki.globex, "GLOBEX-AS2")
    for i, (encryption, key_transport, digest) in enumerate(CASES):
        endpoint = endpoint_to(as2_pki.ours, OUR_ID, encryption=encryption, key_transport=key_transport, digest=digest)
        invoice = with_id(INVOICE, f"ALG-{i}")
        built = build_message(endpoint, sender, invoice, "application/xml", f"<alg-{i}@globex.test>")
        response = await as2_env.client.post("/as2", content=built.body, headers=built.headers)
        assert response.status_code == 200, (encryption, key_transport, digest, response.text)
        report = openssl_verify_mdn(response.headers["content-type"], response.content, as2_pki.ours.cert)
        assert disposition_of(report).endswith("processed"), (encryption, key_transport, digest, report)
        assert mic_of(report) == built.mic, (encryption, key_transport, digest)
    rows = as2_env.ledger_rows()
    assert len(rows) == len(CASES) and {r.doc_id for r in rows} == {f"ALG-{i}" for i in range(len(CASES))}


def test_an_endpoint_chooses_its_algorithms_in_partners_yaml(as2_pki):
    from gateway.as2.outbound import parse_endpoint
    from gateway.config.loader import load_yaml

    def endpoint(extra: str):
        text = f"url: https://p.example/as2\nas2_to: P\ncertificate: {as2_pki.globex.cert}\n{extra}"
        return parse_endpoint(load_yaml(text=text, name="partners.yaml"), None, "endpoint")

    default = endpoint("")
    assert (default.encryption, default.key_transport, default.digest) == ("aes256_cbc", "rsa_pkcs1v15", "sha256")
    chosen = endpoint("encryption: aes128_gcm\nkey_transport: rsa_oaep\ndigest: sha512\n")
    assert (chosen.encryption, chosen.key_transport, chosen.digest) == ("aes128_gcm", "rsa_oaep", "sha512")
    for wrong, key in (
        ("encryption: des_cbc\n", "encryption"),
        ("key_transport: rsa_pss\n", "key_transport"),
        ("digest: sha1\n", "digest"),
    ):
        with pytest.raises(ConfigError, match=key) as raised:
            endpoint(wrong)
        assert raised.value.line == 4  # the line of the wrong value
