"""CMS (RFC 5652) for AS2: decrypt EnvelopedData and AuthEnvelopedData, verify SignedData, inflate CompressedData,
and the signing and encryption of what the gateway sends.

``asn1crypto`` parses and builds the structures and ``cryptography`` does every cryptographic operation (RSA,
AES, 3DES, digests); nothing here implements a cipher. ``cryptography`` builds signatures, but its envelopes are
AES-CBC with PKCS #1 v1.5 only, and it neither verifies signatures nor opens AES-GCM envelopes, hence the few
functions below (see docs/as2.md, "Why these libraries").
Every function refuses what the partner's agreement does not allow (3DES, SHA-1) with the error whose
disposition RFC 4130 names.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import os
import zlib
from dataclasses import dataclass

from asn1crypto import cms
from asn1crypto import core as asn1_core
from asn1crypto import x509 as asn1_x509
from cryptography import x509
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, padding, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric import padding as asym_padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.serialization import pkcs7

from gateway.as2.errors import (
    As2AuthenticationError,
    As2DecompressionError,
    As2DecompressionLimitError,
    As2DecryptionError,
    As2IntegrityError,
)

__all__ = [
    "DIGESTS",
    "ENCRYPTIONS",
    "Identity",
    "KEY_TRANSPORTS",
    "Verified",
    "compress",
    "decompress",
    "decrypt",
    "encrypt",
    "micalg_name",
    "sign",
    "verify",
    "verify_part",
]

#: AS2 ``micalg`` names (RFC 5751 3.4.3.2 and RFC 4130's older spellings) -> hashlib names
DIGESTS = {
    "sha-256": "sha256",
    "sha256": "sha256",
    "sha-384": "sha384",
    "sha384": "sha384",
    "sha-512": "sha512",
    "sha512": "sha512",
    "sha-1": "sha1",
    "sha1": "sha1",
}
_HASHES = {"sha1": hashes.SHA1, "sha256": hashes.SHA256, "sha384": hashes.SHA384, "sha512": hashes.SHA512}
_CBC = {"aes128_cbc": 16, "aes192_cbc": 24, "aes256_cbc": 32}
_GCM = {"aes128_gcm": 16, "aes192_gcm": 24, "aes256_gcm": 32}


def micalg_name(hash_name: str) -> str:
    """The ``micalg`` spelling of a hashlib name (``sha256`` -> ``sha-256``)."""
    return "sha-" + hash_name[3:] if hash_name.startswith("sha") else hash_name


@dataclass(frozen=True, slots=True)
class Identity:
    """A private key with its certificate (ours, to decrypt and sign)."""

    key: rsa.RSAPrivateKey
    certificate: x509.Certificate


@dataclass(frozen=True, slots=True)
class Verified:
    """A verified signature: the digest algorithm (hashlib name) and the certificate that verified it."""

    digest: str
    certificate: x509.Certificate


def _content_info(der: bytes, what: str, error: type[Exception]) -> cms.ContentInfo:
    try:
        info = cms.ContentInfo.load(der, strict=True)
        info["content_type"].native  # noqa: B018 - parse now, fail here
        return info
    except Exception:  # any malformed structure is the partner's
        raise error(f"The {what} is not a well-formed CMS structure.") from None


# --------------------------------------------------------------------------- decryption


def _matches(rid: cms.RecipientIdentifier, certificate: x509.Certificate) -> bool:
    if rid.name == "issuer_and_serial_number":
        return rid.chosen["serial_number"].native == certificate.serial_number and rid.chosen[
            "issuer"
        ].dump() == _asn1_name(certificate.issuer)
    if rid.name == "subject_key_identifier":
        try:
            ski = certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value.digest
        except x509.ExtensionNotFound:
            return False
        return rid.chosen.native == ski
    return False


def _asn1_name(name: x509.Name) -> bytes:
    return name.public_bytes()


def _content_key(recipients: cms.RecipientInfos, identity: Identity) -> bytes:
    for info in recipients:
        if info.name != "ktri":
            continue
        ktri = info.chosen
        if not _matches(ktri["rid"], identity.certificate):
            continue
        algorithm = ktri["key_encryption_algorithm"]
        name = algorithm["algorithm"].native
        encrypted = ktri["encrypted_key"].native
        try:
            if name == "rsaes_pkcs1v15" or name == "rsa":
                return identity.key.decrypt(encrypted, asym_padding.PKCS1v15())
            if name == "rsaes_oaep":
                params = algorithm["parameters"]
                hash_name = params["hash_algorithm"]["algorithm"].native if params.native else "sha1"
                mgf_hash = params["mask_gen_algorithm"]["parameters"]["algorithm"].native if params.native else "sha1"
                return identity.key.decrypt(
                    encrypted,
                    asym_padding.OAEP(
                        mgf=asym_padding.MGF1(_HASHES[mgf_hash]()), algorithm=_HASHES[hash_name](), label=None
                    ),
                )
        except (ValueError, KeyError):
            raise As2DecryptionError("The content key could not be decrypted with our key.") from None
        raise As2DecryptionError(f"Key transport {name} is not supported; use RSA (PKCS #1 v1.5 or OAEP).")
    raise As2DecryptionError(
        "The message is not encrypted for our certificate; encrypt it with the certificate `b2bgw as2 cert` prints."
    )


def decrypt(der: bytes, identity: Identity, *, allow_3des: bool = False) -> tuple[bytes, str]:
    """The content of an EnvelopedData or AuthEnvelopedData *der* for *identity*, and the cipher's name."""
    info = _content_info(der, "encrypted message", As2DecryptionError)
    kind = info["content_type"].native
    if kind not in ("enveloped_data", "authenticated_enveloped_data"):
        raise As2DecryptionError(f"An encrypted message must be CMS EnvelopedData; got {kind}.")
    try:
        data = info["content"]
        encrypted = data[
            "auth_encrypted_content_info" if kind == "authenticated_enveloped_data" else "encrypted_content_info"
        ]
        algorithm = encrypted["content_encryption_algorithm"]
        name = algorithm["algorithm"].native
        ciphertext = encrypted["encrypted_content"].native or b""
    except Exception:
        raise As2DecryptionError("The EnvelopedData is malformed.") from None
    if name == "tripledes_3key" and not allow_3des:
        raise As2DecryptionError("3DES is not allowed for this partner; encrypt with AES-128 or AES-256 (CBC or GCM).")
    if name not in _CBC and name not in _GCM and name != "tripledes_3key":
        raise As2DecryptionError(f"Content encryption {name} is not supported; use AES-128 or AES-256 (CBC or GCM).")
    key = _content_key(data["recipient_infos"], identity)
    try:
        if name in _GCM:
            if len(key) != _GCM[name]:
                raise ValueError
            native = algorithm["parameters"].native
            if isinstance(native, bytes):  # PKIjs writes the bare nonce instead of GCMParameters
                nonce, tag_len = native, 16
            else:  # GCMParameters (RFC 5084): nonce, tag length
                params = list(dict(native).values())
                nonce, tag_len = params[0], params[1] if len(params) > 1 and params[1] else 12
            if kind == "enveloped_data":  # AES-GCM in EnvelopedData (PKIjs, WebCrypto): the tag ends the ciphertext
                return AESGCM(key).decrypt(nonce, ciphertext, None), name
            mac = data["mac"].native
            if len(mac) != tag_len:
                raise ValueError
            aad = data["auth_attrs"].untag().dump() if data["auth_attrs"].native else b""
            if aad:
                aad = b"\x31" + aad[1:]
            return AESGCM(key).decrypt(nonce, ciphertext + mac, aad or None), name
        iv = algorithm["parameters"].native
        if name in _CBC:
            if len(key) != _CBC[name]:
                raise ValueError
            cipher, block = algorithms.AES(key), 128
        else:
            from cryptography.hazmat.decrepit.ciphers.algorithms import TripleDES

            cipher, block = TripleDES(key), 64
        decryptor = Cipher(cipher, modes.CBC(iv)).decryptor()
        padded = decryptor.update(ciphertext) + decryptor.finalize()
        unpadder = padding.PKCS7(block).unpadder()
        return unpadder.update(padded) + unpadder.finalize(), name
    except (ValueError, TypeError, KeyError, InvalidTag):
        raise As2DecryptionError("The message could not be decrypted (wrong key or damaged content).") from None


#: the content encryption algorithms we send, and their key sizes
ENCRYPTIONS = {"aes128_cbc": 16, "aes256_cbc": 32, "aes128_gcm": 16, "aes256_gcm": 32}
#: the key transports we send: RSA PKCS #1 v1.5, or RSA-OAEP with SHA-256 and MGF1-SHA-256 (RFC 4055, RFC 8551)
KEY_TRANSPORTS = ("rsa_pkcs1v15", "rsa_oaep")


class _GcmParameters(asn1_core.Sequence):
    """GCMParameters (RFC 5084): the nonce and the tag length."""

    _fields = [("aes_nonce", asn1_core.OctetString), ("aes_icvlen", asn1_core.Integer, {"default": 12})]


def _recipient_info(key: bytes, recipient: x509.Certificate, key_transport: str) -> cms.RecipientInfo:
    public = recipient.public_key()
    if not isinstance(public, rsa.RSAPublicKey):
        raise ValueError("the recipient's certificate must have an RSA key")
    if key_transport == "rsa_oaep":
        encrypted = public.encrypt(
            key, asym_padding.OAEP(mgf=asym_padding.MGF1(hashes.SHA256()), algorithm=hashes.SHA256(), label=None)
        )
        algorithm = {
            "algorithm": "rsaes_oaep",
            "parameters": {
                "hash_algorithm": {"algorithm": "sha256"},
                "mask_gen_algorithm": {"algorithm": "mgf1", "parameters": {"algorithm": "sha256"}},
            },
        }
    elif key_transport == "rsa_pkcs1v15":
        encrypted = public.encrypt(key, asym_padding.PKCS1v15())
        algorithm = {"algorithm": "rsaes_pkcs1v15"}
    else:
        raise ValueError(f"unknown key transport {key_transport!r}")
    certificate = asn1_x509.Certificate.load(recipient.public_bytes(serialization.Encoding.DER))
    return cms.RecipientInfo(
        name="ktri",
        value={
            "version": "v0",
            "rid": cms.RecipientIdentifier(
                name="issuer_and_serial_number",
                value={"issuer": certificate.issuer, "serial_number": certificate.serial_number},
            ),
            "key_encryption_algorithm": algorithm,
            "encrypted_key": encrypted,
        },
    )


def encrypt(
    content: bytes,
    recipient: x509.Certificate,
    *,
    algorithm: str = "aes256_cbc",
    key_transport: str = "rsa_pkcs1v15",
) -> bytes:
    """The CMS DER of *content* encrypted for *recipient*: EnvelopedData for AES-CBC, AuthEnvelopedData
    (RFC 5083, RFC 5084) for AES-GCM; the content key sent with RSA PKCS #1 v1.5 or RSA-OAEP."""
    size = ENCRYPTIONS.get(algorithm)
    if size is None:
        raise ValueError(f"unknown content encryption {algorithm!r}")
    key = os.urandom(size)
    recipients = [_recipient_info(key, recipient, key_transport)]
    if algorithm in _GCM:
        nonce = os.urandom(12)
        sealed = AESGCM(key).encrypt(nonce, content, None)
        data = cms.AuthEnvelopedData(
            {
                "version": "v0",
                "recipient_infos": recipients,
                "auth_encrypted_content_info": {
                    "content_type": "data",
                    "content_encryption_algorithm": {
                        "algorithm": algorithm,
                        "parameters": _GcmParameters({"aes_nonce": nonce, "aes_icvlen": 16}),
                    },
                    "encrypted_content": sealed[:-16],
                },
                "mac": sealed[-16:],
            }
        )
        return cms.ContentInfo({"content_type": "authenticated_enveloped_data", "content": data}).dump()
    iv = os.urandom(16)
    padder = padding.PKCS7(128).padder()
    padded = padder.update(content) + padder.finalize()
    encryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
    data = cms.EnvelopedData(
        {
            "version": "v0",
            "recipient_infos": recipients,
            "encrypted_content_info": {
                "content_type": "data",
                "content_encryption_algorithm": {"algorithm": algorithm, "parameters": iv},
                "encrypted_content": encryptor.update(padded) + encryptor.finalize(),
            },
        }
    )
    return cms.ContentInfo({"content_type": "enveloped_data", "content": data}).dump()


# --------------------------------------------------------------------------- signatures


def _signed_attrs_der(signed_attrs: cms.CMSAttributes) -> bytes:
    raw = signed_attrs.untag().dump(force=False)
    return b"\x31" + raw[1:]  # the signature covers them as a SET OF, not as the [0] IMPLICIT field


def _check_validity(certificate: x509.Certificate, now: dt.datetime) -> None:
    if not certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc:
        raise As2AuthenticationError(
            f"The partner's certificate (serial {certificate.serial_number:x}) is valid from "
            f"{certificate.not_valid_before_utc:%Y-%m-%d} to {certificate.not_valid_after_utc:%Y-%m-%d}, not now; "
            "exchange a current certificate."
        )


def _verify_with(
    certificate: x509.Certificate, signature: bytes, data: bytes, digest: str, signature_algorithm: str, params: object
) -> bool:
    public = certificate.public_key()
    try:
        if isinstance(public, rsa.RSAPublicKey):
            if signature_algorithm == "rsassa_pss":
                public.verify(
                    signature,
                    data,
                    asym_padding.PSS(asym_padding.MGF1(_HASHES[digest]()), asym_padding.PSS.AUTO),
                    _HASHES[digest](),
                )
            else:
                public.verify(signature, data, asym_padding.PKCS1v15(), _HASHES[digest]())
        elif isinstance(public, ec.EllipticCurvePublicKey):
            public.verify(signature, data, ec.ECDSA(_HASHES[digest]()))
        else:
            return False
    except InvalidSignature:
        return False
    return True


def verify(
    der: bytes,
    content: bytes | None,
    certificates: list[x509.Certificate],
    *,
    allow_sha1: bool = False,
    now: dt.datetime | None = None,
) -> tuple[Verified, bytes]:
    """Verify the SignedData *der* over *content* (detached) or over its own encapsulated content.

    Returns what verified and the signed content. The signer must be one of *certificates* (the partner's, from
    the configuration: certificates carried in the message are never trusted), valid now."""
    info = _content_info(der, "signature", As2AuthenticationError)
    if info["content_type"].native != "signed_data":
        raise As2AuthenticationError("The signature part must be CMS SignedData.")
    try:
        signed = info["content"]
        signers = list(signed["signer_infos"])
        if content is None:
            content = signed["encap_content_info"]["content"].native
            if content is None:
                raise ValueError
    except Exception:
        raise As2AuthenticationError("The SignedData is malformed or carries no content.") from None
    if not signers:
        raise As2AuthenticationError("The SignedData has no signer.")
    now = now or dt.datetime.now(dt.UTC)
    problem: Exception | None = None
    for signer in signers[:4]:
        try:
            digest = signer["digest_algorithm"]["algorithm"].native
            if digest == "sha1" and not allow_sha1:
                raise As2AuthenticationError("SHA-1 signatures are not allowed for this partner; sign with SHA-256.")
            if digest not in _HASHES:
                raise As2AuthenticationError(f"Digest {digest} is not supported; sign with SHA-256, -384 or -512.")
            candidates = [c for c in certificates if _matches(signer["sid"], c)]
            if not candidates:
                raise As2AuthenticationError(
                    "The message is not signed with the certificate configured for this partner."
                )
            signature = signer["signature"].native
            sig_alg = signer["signature_algorithm"]["algorithm"].native
            content_digest = hashlib.new(digest, content).digest()
            attrs = signer["signed_attrs"]
            if attrs.native:
                declared = None
                for attr in attrs:
                    if attr["type"].native == "message_digest":
                        declared = attr["values"][0].native
                if declared is None or not hmac.compare_digest(declared, content_digest):
                    raise As2IntegrityError(
                        "The content does not match its signed digest: it was changed after signing."
                    )
                data = _signed_attrs_der(attrs)
            else:
                data = content
            for certificate in candidates:
                _check_validity(certificate, now)
                if _verify_with(certificate, signature, data, digest, sig_alg, None):
                    return Verified(digest, certificate), content
            raise As2AuthenticationError("The signature does not verify with the partner's certificate.")
        except (As2AuthenticationError, As2IntegrityError) as exc:
            problem = exc
        except Exception:  # a malformed signer
            problem = As2AuthenticationError("The SignedData's signer information is malformed.")
    assert problem is not None
    raise problem


def verify_part(
    der: bytes,
    raw: bytes,
    certificates: list[x509.Certificate],
    *,
    allow_sha1: bool = False,
    now: dt.datetime | None = None,
) -> tuple[Verified, bytes]:
    """Verify a detached signature over a MIME part's bytes *raw*; returns what verified and the bytes signed.

    Two sender habits are tolerated, for the digest only (the signature must still verify): a part signed with
    CRLF line ends and sent with LF ones, and a part sent with one CRLF more before the next boundary than it
    was signed with (libas2's MDNs)."""
    candidates = [raw]
    if raw.endswith(b"\r\n"):
        candidates.append(raw[:-2])
    canonical = raw.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    if canonical != raw:
        candidates.append(canonical)
    problem: As2IntegrityError | None = None
    for candidate in candidates:
        try:
            return verify(der, candidate, certificates, allow_sha1=allow_sha1, now=now)
        except As2IntegrityError as exc:
            problem = problem or exc
    assert problem is not None
    raise problem


def sign(content: bytes, identity: Identity, *, digest: str = "sha256") -> bytes:
    """A detached SignedData (DER) over *content* (already canonical: signed as is)."""
    builder = (
        pkcs7.PKCS7SignatureBuilder()
        .set_data(content)
        .add_signer(identity.certificate, identity.key, _HASHES[digest]())
    )
    return builder.sign(serialization.Encoding.DER, [pkcs7.PKCS7Options.DetachedSignature, pkcs7.PKCS7Options.Binary])


# --------------------------------------------------------------------------- compression (RFC 3274, RFC 5402)


def decompress(der: bytes, limit: int) -> bytes:
    """The content of the CompressedData *der*, inflated to at most *limit* bytes.

    A bomb is refused once the output passes *limit*: no more than that is ever produced."""
    info = _content_info(der, "compressed message", As2DecompressionError)
    if info["content_type"].native != "compressed_data":
        raise As2DecompressionError("A compressed message must be CMS CompressedData.")
    try:
        data = info["content"]
        algorithm = data["compression_algorithm"]["algorithm"].native
        compressed = data["encap_content_info"]["content"].native or b""
    except Exception:
        raise As2DecompressionError("The CompressedData is malformed.") from None
    if algorithm != "zlib":
        raise As2DecompressionError(f"Compression {algorithm} is not supported; use zlib (RFC 3274).")
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(compressed, limit + 1)
    except zlib.error:
        raise As2DecompressionError("The compressed content is damaged.") from None
    if len(out) > limit:
        raise As2DecompressionLimitError(limit)
    if not inflater.eof:
        raise As2DecompressionError("The compressed content is truncated.")
    return out


def compress(content: bytes) -> bytes:
    """CompressedData DER of *content* (zlib)."""
    return cms.ContentInfo(
        {
            "content_type": "compressed_data",
            "content": cms.CompressedData(
                {
                    "version": "v0",
                    "compression_algorithm": {"algorithm": "zlib"},
                    "encap_content_info": {"content_type": "data", "content": zlib.compress(content)},
                }
            ),
        }
    ).dump()
