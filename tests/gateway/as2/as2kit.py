"""Helpers of the AS2 tests: certificates and messages made WITHOUT the gateway's code.

Keys and certificates come from the ``openssl`` command line (an expired one from ``trustme``'s CA); signed
and encrypted messages from ``openssl cms``; CMS CompressedData from asn1crypto and zlib right here (Debian's
openssl has no zlib, and the gateway's own compression must not build what it is tested on).
"""

from __future__ import annotations

import base64
import datetime as dt
import subprocess
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asn1crypto import cms as asn1_cms
from gwtest import sample_data

from gateway.config.loader import load_yaml

OUR_ID = "B2BGW-TEST"


def run(*args: str, data: bytes | None = None) -> bytes:
    return subprocess.run(args, input=data, capture_output=True, check=True, timeout=60).stdout


@dataclass
class Pki:
    """Key and certificate files of one party."""

    key: Path
    cert: Path


def make_pki(folder: Path, name: str, *, days: int = 30) -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    key, cert = folder / f"{name}.key", folder / f"{name}.crt"
    run(
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(key),
        "-out",
        str(cert),
        "-days",
        str(days),
        "-subj",
        f"/CN={name}",
        "-sha256",
    )
    return Pki(key, cert)


def make_expired_pki(folder: Path, name: str) -> Pki:
    """A certificate whose validity ended yesterday (trustme's CA issues it)."""
    import trustme

    ca = trustme.CA()
    leaf = ca.issue_cert(
        f"{name}.example",
        not_before=dt.datetime.now(dt.UTC) - dt.timedelta(days=30),
        not_after=dt.datetime.now(dt.UTC) - dt.timedelta(days=1),
    )
    folder.mkdir(parents=True, exist_ok=True)
    key, cert = folder / f"{name}.key", folder / f"{name}.crt"
    leaf.private_key_pem.write_to_path(str(key))
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    return Pki(key, cert)


def entity(body: bytes, content_type: str = "application/xml") -> bytes:
    return f"Content-Type: {content_type}\r\n\r\n".encode() + body


def cms_sign(data: bytes, signer: Pki, *, md: str = "sha256") -> bytes:
    """S/MIME multipart/signed (detached) of the MIME entity *data*."""
    return run(
        "openssl",
        "cms",
        "-sign",
        "-binary",
        "-md",
        md,
        "-signer",
        str(signer.cert),
        "-inkey",
        str(signer.key),
        data=data,
    )


def cms_encrypt(data: bytes, recipient: Pki, *, cipher: str = "-aes256") -> bytes:
    """S/MIME application/pkcs7-mime (base64) of the MIME entity *data*."""
    return run("openssl", "cms", "-encrypt", "-binary", cipher, "-recip", str(recipient.cert), data=data)


def compressed_entity(data: bytes, *, raw_zlib: bytes | None = None) -> bytes:
    """An application/pkcs7-mime; smime-type=compressed-data entity of *data* (RFC 3274), made here."""
    content = raw_zlib if raw_zlib is not None else zlib.compress(data)
    der = asn1_cms.ContentInfo(
        {
            "content_type": "compressed_data",
            "content": asn1_cms.CompressedData(
                {
                    "version": "v0",
                    "compression_algorithm": {"algorithm": "zlib"},
                    "encap_content_info": {"content_type": "data", "content": content},
                }
            ),
        }
    ).dump()
    return (
        b"Content-Type: application/pkcs7-mime; smime-type=compressed-data; name=smime.p7z\r\n"
        b"Content-Transfer-Encoding: base64\r\n\r\n" + base64.encodebytes(der).replace(b"\n", b"\r\n")
    )


def zlib_bomb(size: int) -> bytes:
    """zlib data inflating to *size* zero bytes."""
    out = zlib.compressobj(9)
    chunk = bytes(1 << 20)
    parts = [out.compress(chunk) for _ in range(size >> 20)]
    return b"".join(parts) + out.flush()


def to_http(smime: bytes) -> tuple[dict[str, str], bytes]:
    """The top-level headers of an S/MIME message (as openssl writes it) and its body."""
    for sep in (b"\r\n\r\n", b"\n\n"):
        if sep in smime:
            head, _, body = smime.partition(sep)
            break
    headers = {}
    for line in head.decode("latin-1").replace("\r\n", "\n").split("\n"):
        if line.startswith((" ", "\t")):
            last = list(headers)[-1]
            headers[last] += " " + line.strip()
        elif ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip()] = value.strip()
    keep = {k: v for k, v in headers.items() if k.lower() in ("content-type", "content-transfer-encoding")}
    return keep, body


def as2_headers(
    sender: str,
    *,
    receiver: str = OUR_ID,
    message_id: str | None = None,
    signed_mdn: bool = True,
    mdn: bool = True,
    micalg: str = "sha-256",
    async_url: str | None = None,
) -> dict[str, str]:
    headers = {
        "AS2-Version": "1.2",
        "AS2-From": sender,
        "AS2-To": receiver,
        "Message-ID": message_id or f"<{uuid.uuid4().hex}@{sender}>",
        "MIME-Version": "1.0",
    }
    if mdn:
        headers["Disposition-Notification-To"] = "edi@partner.example"
    if signed_mdn:
        headers["Disposition-Notification-Options"] = (
            f"signed-receipt-protocol=optional, pkcs7-signature; signed-receipt-micalg=optional, {micalg}"
        )
    if async_url:
        headers["Receipt-Delivery-Option"] = async_url
    return headers


def openssl_verify_mdn(content_type: str, body: bytes, signer_cert: Path) -> bytes:
    """Verify a signed MDN with ``openssl cms -verify`` (as an S/MIME message); returns the signed content."""
    smime = f"MIME-Version: 1.0\r\nContent-Type: {content_type}\r\n\r\n".encode() + body
    # -nointern: only the certificate given may have signed it; -noverify: it is self-signed, not from a CA
    return run("openssl", "cms", "-verify", "-noverify", "-nointern", "-certfile", str(signer_cert), data=smime)


def disposition_of(mdn_text: bytes) -> str:
    for line in mdn_text.decode("latin-1").replace("\r\n", "\n").split("\n"):
        if line.lower().startswith("disposition:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError("no Disposition in the MDN")


def mic_of(mdn_text: bytes) -> str | None:
    for line in mdn_text.decode("latin-1").replace("\r\n", "\n").split("\n"):
        if line.lower().startswith("received-content-mic:"):
            return line.split(":", 1)[1].strip()
    return None


@dataclass
class As2Pki:
    ours: Pki
    globex: Pki
    acme: Pki
    stranger: Pki
    folder: Path


def as2_data(
    tmp_path: Path,
    pki: As2Pki,
    *,
    globex_cert: Path | None = None,
    async_mdn_urls: list[str] | None = None,
    async_mdn_allow_addresses: list[str] | None = None,
) -> Any:
    data = sample_data(tmp_path)
    extra = load_yaml(
        text=f"""
as2:
  id: {OUR_ID}
  key: {pki.ours.key}
  certificate: {pki.ours.cert}
globex:
  id: GLOBEX-AS2
  certificate: {globex_cert or pki.globex.cert}
acme:
  id: ACME-AS2
  certificate: {pki.acme.cert}
  require_encryption: false
  allow_3des: true
""",
        name="as2-test.yaml",
    )
    data["as2"] = extra["as2"]
    if async_mdn_urls is not None:
        extra["globex"]["async_mdn_urls"] = async_mdn_urls
    if async_mdn_allow_addresses is not None:
        extra["globex"]["async_mdn_allow_addresses"] = async_mdn_allow_addresses
    data["partners"]["globex"]["as2"] = extra["globex"]
    data["partners"]["acme"]["as2"] = extra["acme"]
    return data
