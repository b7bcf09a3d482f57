"""From an AS2 request to its payload: decrypt, verify, decompress, in whatever order the sender chose,
and the MIC that RFC 4130 7.3.1 asks for.

The MIC is computed over what was signed (the signed MIME part: headers and content, as sent); over the
decrypted MIME entity for an encrypted unsigned message; over the content alone for one neither signed nor
encrypted. Every step is bounded: the depth of the unwrapping, each intermediate size (checked before and after
each step), and the inflated size of compressed content.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass

from gateway.as2 import cms
from gateway.as2.config import PartnerAgreement
from gateway.as2.errors import As2AuthenticationError, As2MimeError, As2ProcessingError
from gateway.as2.mime import MimeLimits, Part, entity, split_multipart

__all__ = ["Unwrapped", "mic_value", "unwrap"]

_PKCS7_MIME = ("application/pkcs7-mime", "application/x-pkcs7-mime")
_PKCS7_SIGNATURE = ("application/pkcs7-signature", "application/x-pkcs7-signature")


@dataclass(frozen=True, slots=True)
class Unwrapped:
    """The payload and how it came."""

    payload: bytes
    content_type: str
    charset: str | None
    mic: str  # the Received-Content-MIC value: "<base64>, <micalg>"
    signed: bool
    encrypted: bool
    compressed: bool
    digest: str  # hashlib name of the MIC's digest


def mic_value(data: bytes, digest: str) -> str:
    """``<base64 digest>, <micalg>`` as an MDN's ``Received-Content-MIC`` carries it."""
    return f"{base64.b64encode(hashlib.new(digest, data).digest()).decode('ascii')}, {cms.micalg_name(digest)}"


def _bounded(data: bytes, limit: int, what: str) -> bytes:
    if len(data) > limit:
        raise As2ProcessingError(f"The {what} is larger than the {limit} bytes accepted.")
    return data


def unwrap(
    top: Part,
    agreement: PartnerAgreement,
    identity: cms.Identity,
    *,
    max_bytes: int,
    micalg: str | None,
    limits: MimeLimits,
) -> Unwrapped:
    """The payload of *top* (the request: its Content-Type and body) from *agreement*'s partner.

    *max_bytes*: the largest intermediate or final content; *micalg*: the digest the sender asked for
    (used when the message is not signed)."""
    part = top
    signed = encrypted = compressed = False
    mic_source: bytes | None = None
    digest = micalg or "sha256"
    for _ in range(limits.depth):
        kind, params = part.content_type
        if kind in _PKCS7_MIME:
            smime = params.get("smime-type", "").lower()
            der = _bounded(part.decoded(), max_bytes, "encrypted or compressed content")
            if smime == "compressed-data" or (
                not smime and der[:40].find(b"\x06\x0b\x2a\x86\x48\x86\xf7\x0d\x01\x09\x10\x01\x09") != -1
            ):
                inner = cms.decompress(der, max_bytes)
                compressed = True
            elif smime == "signed-data":
                verified, inner = cms.verify(der, None, list(agreement.certificates), allow_sha1=agreement.allow_sha1)
                inner = _bounded(inner, max_bytes, "signed content")
                signed, digest, mic_source = True, verified.digest, inner
            else:
                if encrypted or signed:
                    raise As2MimeError("Encryption inside the signed or encrypted content is not supported.")
                inner, _ = cms.decrypt(der, identity, allow_3des=agreement.allow_3des)
                encrypted = True
                if not signed:
                    mic_source = inner
            part = entity(_bounded(inner, max_bytes, "decrypted content"), limits)
            continue
        if kind == "multipart/signed":
            if signed:
                raise As2MimeError("A message is signed once.")
            parts = split_multipart(part, limits)
            if len(parts) != 2 or parts[1].content_type[0] not in _PKCS7_SIGNATURE:
                raise As2AuthenticationError(
                    "A multipart/signed message needs its content and one application/pkcs7-signature part."
                )
            signature = parts[1].decoded()
            verified, mic_source = cms.verify_part(
                signature, parts[0].raw, list(agreement.certificates), allow_sha1=agreement.allow_sha1
            )
            signed, digest = True, verified.digest
            part = parts[0]
            continue
        break
    else:
        raise As2MimeError(f"The message nests more than {limits.depth} levels.")
    if agreement.require_signature and not signed:
        raise As2AuthenticationError("The message is not signed; your agreement requires signed messages.")
    if agreement.require_encryption and not encrypted:
        raise As2ProcessingError("The message is not encrypted; your agreement requires encrypted messages.")
    payload = _bounded(part.decoded(), max_bytes, "document")
    kind, params = part.content_type
    if kind.startswith("multipart/"):
        raise As2MimeError(f"The payload must be one document, not {kind[:60]}.")
    return Unwrapped(
        payload,
        kind,
        params.get("charset"),
        mic_value(mic_source if mic_source is not None else payload, digest),
        signed,
        encrypted,
        compressed,
        digest,
    )
