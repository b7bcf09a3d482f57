"""Sending AS2: the ``as2`` delivery endpoint kind, and the asynchronous MDNs we receive.

:func:`send_message` makes one attempt: it builds the message (compressed, signed, encrypted as the endpoint
says), records its MIC, posts it and reads the MDN. Success only on a positive MDN whose signature verifies
with the partner's certificate and whose MIC is ours; a negative MDN or another MIC is a failed delivery with
the reason; a busy or unreachable partner a retry. The AS2 Message-ID is derived from the delivery id, the
same on every attempt, so a partner that received an attempt whose answer was lost answers the next with the
same MDN.

An asynchronous MDN (``mdn: async``) comes to our ``/as2`` later: :func:`record_mdn` verifies it, matches it by
``Original-Message-ID`` and writes it to the ledger; an attempt waiting in this process is woken, and one that
timed out finds it in the ledger on its next attempt.

:class:`OutboundRequest` and :class:`AttemptResult` are the delivery engine's (its transport interface);
they are defined here until that engine is part of the gateway, with exactly its fields.
"""

from __future__ import annotations

import asyncio
import base64
import email.utils
import hmac
import logging
import os
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx
from cryptography import x509

from gateway.as2 import cms
from gateway.as2 import mdn as mdns
from gateway.as2.config import AS2_ID, As2Settings, _ours, read_certificates, set_our_settings
from gateway.as2.errors import As2Error, As2MdnError
from gateway.as2.mime import MimeLimits
from gateway.as2.store import As2Store
from gateway.as2.unwrap import mic_value
from gateway.delivery.addresses import AddressPolicy, parse_policy
from gateway.delivery.errors import BlockedAddressError
from gateway.delivery.transport import AttemptResult, OutboundRequest
from gateway.marked import MarkedDict, Where, expect_bool, expect_choice, expect_str

__all__ = [
    "As2Endpoint",
    "As2Transport",
    "AttemptResult",
    "OutboundRequest",
    "build_message",
    "parse_endpoint",
    "record_mdn",
    "send_message",
    "set_our_settings",
]

log = logging.getLogger(__name__)

_ENDPOINT_KEYS = {
    "url",
    "as2_to",
    "certificate",
    "encryption_certificate",
    "sign",
    "encrypt",
    "compress",
    "encryption",
    "key_transport",
    "digest",
    "mdn",
    "signed_mdn",
    "mdn_url",
    "allow_addresses",
    "deny_addresses",
}
_MAX_MDN_BYTES = 256 * 1024


@dataclass(frozen=True, slots=True)
class As2Endpoint:
    """One partner's AS2 endpoint: where, to whom, and how messages are protected."""

    url: str
    as2_to: str
    certificates: tuple[x509.Certificate, ...]
    encryption_certificate: x509.Certificate
    sign: bool = True
    encrypt: bool = True
    compress: bool = False
    encryption: str = "aes256_cbc"
    key_transport: str = "rsa_pkcs1v15"
    digest: str = "sha256"
    mdn: str = "sync"  # sync | async | none
    signed_mdn: bool = True
    mdn_url: str | None = None
    #: where a message may go: the endpoint's ``allow_addresses`` / ``deny_addresses`` under the gateway's
    #: ``delivery`` lists; private, loopback and reserved addresses only when allowed (as for HTTPS endpoints)
    addresses: AddressPolicy = AddressPolicy()


def parse_endpoint(mapping: MarkedDict, where: Where, what: str) -> As2Endpoint:
    """An ``as2`` endpoint's own keys (docs/as2.md lists them); other keys are the engine's."""
    url = expect_str(mapping.get("url"), mapping.at("url"), f"{what} url")
    if not url.startswith(("http://", "https://")):
        raise mapping.at("url").error(f"{what} url must be an http:// or https:// URL")
    as2_to = expect_str(
        mapping.get("as2_to"), mapping.at("as2_to"), f"{what} as2_to", pattern=AS2_ID, hint="the partner's AS2 id"
    )

    def cert(key: str) -> list[x509.Certificate]:
        from gateway.as2.config import _path

        return read_certificates(
            _path(mapping.get(key), mapping.at(key), f"{what} {key}"), mapping.at(key), f"{what} {key}"
        )

    certs = cert("certificate")
    encryption = cert("encryption_certificate")[0] if "encryption_certificate" in mapping else certs[0]
    flags = {
        name: expect_bool(mapping.get(name, default), mapping.at(name), f"{what} {name}")
        for name, default in (("sign", True), ("encrypt", True), ("compress", False), ("signed_mdn", True))
    }
    algorithm = expect_choice(
        mapping.get("encryption", "aes256_cbc"),
        mapping.at("encryption"),
        f"{what} encryption",
        tuple(cms.ENCRYPTIONS),
    )
    key_transport = expect_choice(
        mapping.get("key_transport", "rsa_pkcs1v15"),
        mapping.at("key_transport"),
        f"{what} key_transport",
        cms.KEY_TRANSPORTS,
    )
    digest = expect_choice(
        mapping.get("digest", "sha256"), mapping.at("digest"), f"{what} digest", ("sha256", "sha384", "sha512")
    )
    mdn = expect_choice(mapping.get("mdn", "sync"), mapping.at("mdn"), f"{what} mdn", ("sync", "async", "none"))
    mdn_url = None
    if mdn == "async":
        mdn_url = expect_str(mapping.get("mdn_url"), mapping.at("mdn_url"), f"{what} mdn_url")
    return As2Endpoint(
        url,
        as2_to,
        tuple(certs),
        encryption,
        encryption=algorithm,
        key_transport=key_transport,
        digest=digest,
        mdn=mdn,
        mdn_url=mdn_url,
        addresses=parse_policy(mapping, f"{what} "),
        **flags,
    )


# --------------------------------------------------------------------------- building


@dataclass(frozen=True, slots=True)
class Built:
    headers: dict[str, str]
    body: bytes
    message_id: str
    mic: str


def message_id_for(delivery_id: str, our_id: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-._" else "_" for c in delivery_id)[:100]
    host = "".join(c if c.isalnum() or c in "-." else "_" for c in our_id)[:64]
    return f"<{safe}@{host}>"


def build_message(endpoint: As2Endpoint, ours: As2Settings, body: bytes, content_type: str, message_id: str) -> Built:
    """The AS2 message for *body*: its HTTP headers, body and the MIC we expect back."""
    if body.isascii():
        entity = f"Content-Type: {content_type}\r\nContent-Transfer-Encoding: binary\r\n\r\n".encode("latin-1") + body
    else:  # 8-bit content is signed in base64 (RFC 5751 3.1.2): receivers that read MIME as text keep it intact
        entity = f"Content-Type: {content_type}\r\nContent-Transfer-Encoding: base64\r\n\r\n".encode(
            "latin-1"
        ) + base64.encodebytes(body).replace(b"\n", b"\r\n")
    mic_source = entity
    if endpoint.compress:
        entity = (
            b"Content-Type: application/pkcs7-mime; smime-type=compressed-data; name=smime.p7z\r\n"
            b"Content-Transfer-Encoding: binary\r\n\r\n" + cms.compress(entity)
        )
        mic_source = entity
    if endpoint.sign:
        signature = base64.encodebytes(cms.sign(entity, ours.identity, digest=endpoint.digest)).replace(b"\n", b"\r\n")
        boundary = "----=_b2bgw_" + os.urandom(12).hex()
        signed_type = (
            f'multipart/signed; protocol="application/pkcs7-signature"; '
            f'micalg={cms.micalg_name(endpoint.digest)}; boundary="{boundary}"'
        )
        signed_body = (
            f"--{boundary}\r\n".encode("ascii")
            + entity
            + f"\r\n--{boundary}\r\n".encode("ascii")
            + b"Content-Type: application/pkcs7-signature; name=smime.p7s\r\n"
            b"Content-Transfer-Encoding: base64\r\nContent-Disposition: attachment; filename=smime.p7s"
            b"\r\n\r\n" + signature + f"\r\n--{boundary}--\r\n".encode("ascii")
        )
        mic_source = entity
        entity = f"Content-Type: {signed_type}\r\n\r\n".encode("ascii") + signed_body
    top_type, top_body = None, None
    if endpoint.encrypt:
        if not endpoint.sign and not endpoint.compress:
            mic_source = entity
        smime_type = "authEnveloped-data" if endpoint.encryption.endswith("_gcm") else "enveloped-data"
        top_type = f"application/pkcs7-mime; smime-type={smime_type}; name=smime.p7m"
        top_body = cms.encrypt(
            entity,
            endpoint.encryption_certificate,
            algorithm=endpoint.encryption,
            key_transport=endpoint.key_transport,
        )
        encoding = "binary"
    else:
        head, _, top_body = entity.partition(b"\r\n\r\n")
        fields = dict(line.split(": ", 1) for line in head.decode("latin-1").split("\r\n"))
        top_type = fields["Content-Type"]
        encoding = fields.get("Content-Transfer-Encoding", "binary")
        if not endpoint.sign and not endpoint.compress:
            mic_source = body
    headers = {
        "AS2-Version": "1.2",
        "AS2-From": ours.id,
        "AS2-To": endpoint.as2_to,
        "Message-ID": message_id,
        "Date": email.utils.formatdate(usegmt=True),
        "Subject": "AS2 message",
        "MIME-Version": "1.0",
        "Content-Type": top_type,
        "Content-Transfer-Encoding": encoding,
    }
    if endpoint.mdn != "none":
        headers["Disposition-Notification-To"] = ours.id
        if endpoint.signed_mdn:
            headers["Disposition-Notification-Options"] = (
                f"signed-receipt-protocol=optional, pkcs7-signature; "
                f"signed-receipt-micalg=optional, {cms.micalg_name(endpoint.digest)}"
            )
        if endpoint.mdn == "async":
            headers["Receipt-Delivery-Option"] = endpoint.mdn_url or ""
    return Built(headers, top_body, message_id, mic_value(mic_source, endpoint.digest))


# --------------------------------------------------------------------------- MDNs


def _same_mic(ours: str, theirs: str | None, alg: str | None) -> bool:
    if not theirs:
        return False
    value, _, micalg = ours.partition(",")
    return hmac.compare_digest(value.strip(), theirs.strip()) and cms.DIGESTS.get(micalg.strip()) == alg


def judge(mdn: mdns.Mdn, mic: str, endpoint: As2Endpoint, evidence: bytes, status: int | None) -> AttemptResult:
    """The outcome an MDN means for the message whose MIC is *mic*."""
    if endpoint.signed_mdn and not mdn.signed:
        return AttemptResult("failed", status, "the MDN is not signed, a signed MDN was asked for", evidence=evidence)
    if not mdn.positive:
        return AttemptResult("failed", status, f"negative MDN: {mdn.disposition[:200]}", evidence=evidence)
    if not _same_mic(mic, mdn.mic, mdn.mic_alg):
        return AttemptResult(
            "failed", status, f"MIC mismatch: ours {mic}, the MDN's {mdn.mic}, {mdn.mic_alg}", evidence=evidence
        )
    return AttemptResult("delivered", status, f"positive MDN: {mdn.disposition[:200]}", evidence=evidence)


_WAITERS: dict[tuple[str, str], asyncio.Future[tuple[mdns.Mdn, bytes]]] = {}


async def record_mdn(
    partner: Any, content_type: str, body: bytes, store: As2Store, limits: MimeLimits | None = None
) -> mdns.Mdn:
    """An asynchronous MDN from *partner*: verified, matched by ``Original-Message-ID``, kept in the ledger."""
    agreement = partner.as2
    mdn = await asyncio.to_thread(
        mdns.parse_mdn, content_type, body, list(agreement.certificates), require_signed=False, limits=limits
    )
    raw = f"Content-Type: {content_type}\r\n\r\n".encode("latin-1") + body
    if not await store.mdn_received(partner.id, mdn.original_message_id, mdn.disposition, raw):
        raise As2MdnError(f"No message {mdn.original_message_id[:200]!r} was sent to you from here.")
    waiter = _WAITERS.get((partner.id, mdn.original_message_id))
    if waiter is not None and not waiter.done():
        waiter.set_result((mdn, raw))
    return mdn


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return min(3600.0, max(0.0, float(value))) if value else None
    except ValueError:
        return None


async def send_message(
    endpoint: As2Endpoint,
    ours: As2Settings,
    request: OutboundRequest,
    *,
    client: httpx.AsyncClient | None = None,
    store: As2Store | None = None,
) -> AttemptResult:
    """Send one AS2 message for *request* and judge its MDN (see the module docstring)."""
    try:  # the address first: a blocked one is never sent to, nor recorded as sent
        target, host, extensions = await asyncio.wait_for(endpoint.addresses.pin(endpoint.url), request.timeout)
    except BlockedAddressError as exc:
        return AttemptResult("failed", None, exc.detail)
    except (TimeoutError, OSError) as exc:
        return AttemptResult("retry", None, f"{endpoint.url} does not resolve: {type(exc).__name__}")
    message_id = message_id_for(request.delivery_id, ours.id)
    built = await asyncio.to_thread(build_message, endpoint, ours, request.body, request.content_type, message_id)
    if store is not None:
        existing = await asyncio.to_thread(store.get, "out", request.partner, message_id)
        if existing is None:
            await store.record_sent(request.partner, message_id, request.delivery_id, built.mic)
        elif existing.mdn is not None:  # an asynchronous MDN came after an earlier attempt gave up waiting
            mdn = await asyncio.to_thread(
                mdns.parse_mdn, *_split(existing.mdn), list(endpoint.certificates), require_signed=endpoint.signed_mdn
            )
            return judge(mdn, existing.mic or built.mic, endpoint, existing.mdn, None)
    waiter = None
    if endpoint.mdn == "async":
        waiter = asyncio.get_running_loop().create_future()
        _WAITERS[(request.partner, message_id)] = waiter
    own = client is None
    client = client or httpx.AsyncClient(follow_redirects=False, timeout=request.timeout)
    try:
        try:
            response = await asyncio.wait_for(
                client.post(
                    target,
                    content=built.body,
                    headers={**built.headers, "host": host},
                    timeout=request.timeout,
                    extensions=extensions,
                ),
                request.timeout,
            )
        except (TimeoutError, httpx.HTTPError, OSError) as exc:
            return AttemptResult("retry", None, f"no answer from {endpoint.url}: {type(exc).__name__}")
        status = response.status_code
        if status == 429 or status >= 500:
            return AttemptResult("retry", status, f"HTTP {status}", retry_after=_retry_after(response))
        if status >= 300:
            return AttemptResult("failed", status, f"HTTP {status}: {response.text[:200]}")
        if endpoint.mdn == "none":
            return AttemptResult("delivered", status, "accepted (no MDN asked for)")
        if endpoint.mdn == "async":
            try:
                mdn, raw = await asyncio.wait_for(waiter, request.timeout)  # type: ignore[arg-type]
            except TimeoutError:
                return AttemptResult("retry", status, "sent; the asynchronous MDN has not come yet")
            return judge(mdn, built.mic, endpoint, raw, status)
        body = response.content[: _MAX_MDN_BYTES + 1]
        if len(body) > _MAX_MDN_BYTES:
            return AttemptResult("failed", status, "the MDN is larger than 256 KiB")
        content_type = response.headers.get("content-type", "")
        raw = f"Content-Type: {content_type}\r\n\r\n".encode("latin-1") + body
        try:
            mdn = await asyncio.to_thread(
                mdns.parse_mdn, content_type, body, list(endpoint.certificates), require_signed=endpoint.signed_mdn
            )
        except As2Error as exc:
            return AttemptResult("failed", status, f"the MDN does not verify: {exc.detail}", evidence=raw)
        if store is not None:
            await store.mdn_received(request.partner, message_id, mdn.disposition, raw)
        return judge(mdn, built.mic, endpoint, raw, status)
    finally:
        if waiter is not None:
            _WAITERS.pop((request.partner, message_id), None)
        if own:
            await client.aclose()


def _split(mime: bytes) -> tuple[str, bytes]:
    head, _, body = mime.partition(b"\r\n\r\n")
    return head.decode("latin-1").partition(":")[2].strip(), body


class As2Transport:
    """The delivery engine's transport of kind ``as2``."""

    kind: ClassVar[str] = "as2"

    def __init__(self, endpoint: As2Endpoint, ours: As2Settings | None = None, store: As2Store | None = None) -> None:
        self.endpoint = endpoint
        self.ours = ours
        self.store = store
        self._client = httpx.AsyncClient(follow_redirects=False)

    async def send(self, request: OutboundRequest) -> AttemptResult:
        return await send_message(self.endpoint, self.ours or _ours(), request, client=self._client, store=self.store)

    async def aclose(self) -> None:
        await self._client.aclose()


def register() -> bool:
    """Register the ``as2`` kind with the delivery engine when it is part of the gateway."""
    from gateway.delivery.transport import register_transport

    register_transport("as2", parse_endpoint, As2Transport)
    return True
