"""Receiving AS2 (RFC 4130) at ``POST /as2``: from the request to the MDN.

In order: the AS2 headers and the partner (an unknown AS2 id pair, or a message that is plainly neither signed
nor encrypted when the agreement requires it, is refused with an HTTP problem before any cryptography); the
body, bounded; decryption, signature and decompression (:mod:`gateway.as2.unwrap`, in a thread); then the
payload takes the path of a document posted over HTTP, :meth:`gateway.exchange.submission.Gateway.submit`,
with the AS2 Message-ID as its idempotency key. The MDN says what happened: ``processed``, or
``processed/error: <modifier>`` naming our problem code; it is kept in the ledger (:mod:`gateway.as2.store`)
after the document was committed, so a resend gets the same MDN again and the document is never enqueued
twice. A busy or unavailable gateway answers an HTTP problem and no MDN: the partner's software resends.

A message whose content is an MDN (``multipart/report``, signed or not) is the asynchronous MDN of a message we
sent: it is verified and matched by ``Original-Message-ID`` (:func:`gateway.as2.outbound.record_mdn`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gateway.as2 import mdn as mdns
from gateway.as2.config import As2Settings
from gateway.as2.errors import (
    As2Error,
    As2HeaderError,
    As2ProcessingError,
    As2UnknownPartnerError,
    As2UnsignedError,
)
from gateway.as2.mime import MimeLimits, Part, split_multipart
from gateway.as2.store import PROCESSED, As2Store
from gateway.as2.unwrap import Unwrapped, unwrap
from gateway.delivery.errors import BlockedAddressError
from gateway.errors import (
    BackendError,
    GatewayError,
    IdempotencyConflictError,
    ReplyTimeoutError,
    StoreUnavailableError,
    TooManyRequestsError,
    UnsupportedMediaTypeError,
)
from gateway.intake.xmlsafe import check_media_type, read_body

__all__ = ["As2Inbound", "RawAnswer"]

log = logging.getLogger(__name__)

RawAnswer = tuple[int, list[tuple[bytes, bytes]], bytes]
#: the errors a partner's software should answer by sending again later: no MDN is made for them
_RETRY = (TooManyRequestsError, StoreUnavailableError, BackendError, ReplyTimeoutError)
_MAX_HEADER = 998  # RFC 5322's line length: the most of any AS2 header we read


def _as2_id(value: str | None, name: str) -> str:
    if value is None or not value.strip():
        raise As2HeaderError(f"The {name} header is missing.")
    value = value.strip()
    if len(value) > 130:
        raise As2HeaderError(f"The {name} header is longer than an AS2 id may be (128 characters).")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return value


@dataclass(frozen=True, slots=True)
class _Request:
    partner: Any  # gateway.routing.partners.Partner
    message_id: str
    content_type: str
    options: str | None
    receipt_to: str | None
    async_url: str | None


class As2Inbound:
    """The ``/as2`` endpoint's work for one gateway: ``handle`` answers one request."""

    def __init__(
        self, settings: As2Settings, partners: Any, *, max_document_bytes: int, limits: MimeLimits | None = None
    ) -> None:
        self.settings = settings
        self.by_as2_id = {p.as2.id: p for p in partners.partners.values() if p.as2 is not None}
        self.max_document_bytes = max_document_bytes
        self.max_message_bytes = settings.max_message_bytes or (max_document_bytes * 2 + 64 * 1024)
        self.limits = limits or MimeLimits()

    # ----------------------------------------------------------------- request

    def partner_of(self, headers: Any) -> Any:
        """The partner the request's AS2 headers name (As2UnknownPartnerError otherwise)."""
        return self._request(headers).partner

    def _request(self, headers: Any) -> _Request:
        sender = _as2_id(headers.get("as2-from"), "AS2-From")
        recipient = _as2_id(headers.get("as2-to"), "AS2-To")
        partner = self.by_as2_id.get(sender)
        if partner is None or not partner.enabled or recipient != self.settings.id:
            raise As2UnknownPartnerError(
                f"AS2-From {sender[:130]!r} to AS2-To {recipient[:130]!r} is not an agreement configured here; "
                f"our AS2 id is {self.settings.id!r}."
            )
        message_id = (headers.get("message-id") or "").strip()
        if not message_id or len(message_id) > _MAX_HEADER or not message_id.isprintable():
            raise As2HeaderError("The Message-ID header is missing or malformed (RFC 5322: <id@host>).")
        content_type = (headers.get("content-type") or "").strip()
        if not content_type or len(content_type) > _MAX_HEADER:
            raise As2HeaderError("The Content-Type header is missing or too long.")
        kind = content_type.split(";", 1)[0].strip().lower()
        agreement = partner.as2
        mdn_kinds = ("multipart/report", "multipart/signed")
        if (
            agreement.require_encryption
            and kind not in ("application/pkcs7-mime", "application/x-pkcs7-mime")
            and kind not in mdn_kinds
        ):
            raise As2UnsignedError(
                f"Your agreement requires encrypted messages (application/pkcs7-mime); this one is {kind[:60]}."
            )
        if agreement.require_signature and kind not in (
            "application/pkcs7-mime",
            "application/x-pkcs7-mime",
            "multipart/signed",
            "multipart/report",
        ):
            raise As2UnsignedError(f"Your agreement requires signed messages; this one is {kind[:60]}.")
        receipt_to = headers.get("disposition-notification-to")
        async_url = headers.get("receipt-delivery-option")
        options = headers.get("disposition-notification-options")
        return _Request(
            partner,
            message_id,
            content_type,
            options[:_MAX_HEADER] if options else None,
            receipt_to[:_MAX_HEADER] if receipt_to else None,
            async_url.strip()[:_MAX_HEADER] if async_url else None,
        )

    async def handle(
        self,
        headers: Any,
        chunks: AsyncIterator[bytes],
        declared_length: int | None,
        submit: Callable[..., Awaitable[Any]],
        store: Callable[[], As2Store],
    ) -> RawAnswer:
        """Answer one AS2 request; *submit* is the gateway's :meth:`Gateway.submit`, *store* the AS2 ledger."""
        request = self._request(headers)
        body = await read_body(chunks, self.max_message_bytes, declared_length=declared_length)
        top = Part(
            [
                ("content-type", request.content_type),
                ("content-transfer-encoding", headers.get("content-transfer-encoding") or "binary"),
            ],
            body,
            body,
        )
        if self._is_mdn(top):
            from gateway.as2.outbound import record_mdn

            await record_mdn(request.partner, request.content_type, body, store(), self.limits)
            return 200, [(b"content-length", b"0")], b""
        agreement = request.partner.as2
        micalg = mdns.requested_micalg(request.options, agreement.allow_sha1)
        try:
            unwrapped = await asyncio.to_thread(
                unwrap,
                top,
                agreement,
                self.settings.identity,
                max_bytes=self.max_document_bytes,
                micalg=micalg,
                limits=self.limits,
            )
        except As2ProcessingError as exc:
            log.info("AS2 %s from %s refused: %s", request.message_id[:200], request.partner.id, exc.code)
            return await self._answer(
                request,
                store,
                None,
                None,
                f"processed/error: {exc.disposition}",
                f"The message was not processed: {exc.code}. {exc.detail}",
            )
        return await self._accept(request, unwrapped, submit, store)

    def _is_mdn(self, top: Part) -> bool:
        kind, _ = top.content_type
        if kind == "multipart/report":
            return True
        if kind == "multipart/signed":
            try:
                parts = split_multipart(top, self.limits)
            except As2Error:
                return False
            return bool(parts) and parts[0].content_type[0] == "multipart/report"
        return False

    async def _accept(
        self,
        request: _Request,
        unwrapped: Unwrapped,
        submit: Callable[..., Awaitable[Any]],
        store: Callable[[], As2Store],
    ) -> RawAnswer:
        partner = request.partner
        previous = await asyncio.to_thread(store().get, "in", partner.id, request.message_id)
        if previous is not None and previous.disposition == PROCESSED and previous.mdn is not None:
            if previous.mic == unwrapped.mic:  # a resend: the same MDN again
                return await self._send(request, previous.mdn, store, note=True)
            return await self._answer(
                request,
                store,
                unwrapped.mic,
                None,
                "processed/error: unexpected-processing-error",
                f"The message was not processed: {IdempotencyConflictError.code}. Message-ID "
                "was already used for another message; send a new message with a new "
                "Message-ID.",
                keep=False,
            )
        try:
            charset = check_media_type(
                unwrapped.content_type + (f"; charset={unwrapped.charset}" if unwrapped.charset else "")
            )
            outcome = await submit(
                partner, unwrapped.payload, charset=charset, idempotency_key=_idempotency_key(request.message_id)
            )
        except _RETRY:
            raise
        except IdempotencyConflictError as exc:
            return await self._answer(
                request,
                store,
                unwrapped.mic,
                None,
                "processed/error: unexpected-processing-error",
                f"The message was not processed: {exc.code}. Message-ID was already used for "
                "another message; send a new message with a new Message-ID.",
                keep=False,
            )
        except UnsupportedMediaTypeError as exc:
            return await self._answer(
                request,
                store,
                unwrapped.mic,
                None,
                "processed/error: unexpected-processing-error",
                f"The message was not processed: {exc.code}. Send an XML document (application/xml).",
            )
        except GatewayError as exc:
            return await self._answer(
                request,
                store,
                unwrapped.mic,
                None,
                "processed/error: unexpected-processing-error",
                f"The document was refused: {exc.code} (HTTP {exc.status}). {type(exc).default_detail}",
            )
        return await self._answer(
            request,
            store,
            unwrapped.mic,
            outcome.message_id,
            PROCESSED,
            f"The document was received and accepted as message {outcome.message_id}.",
        )

    async def _answer(
        self,
        request: _Request,
        store: Callable[[], As2Store],
        mic: str | None,
        message_id: str | None,
        disposition: str,
        text: str,
        *,
        keep: bool = True,
    ) -> RawAnswer:
        partner = request.partner
        agreement = partner.as2
        signed = mdns.wants_signed_mdn(request.options)
        digest = mdns.requested_micalg(request.options, agreement.allow_sha1) or "sha256"
        mdn = await asyncio.to_thread(
            mdns.build_mdn,
            our_id=self.settings.id,
            partner_id=agreement.id,
            original_message_id=request.message_id,
            disposition=disposition,
            text=text,
            mic=mic,
            signer=self.settings.identity if signed else None,
            digest=digest,
        )
        raw = mdn.mime
        if keep:
            try:
                record = await store().record_received(
                    partner.id, request.message_id, message_id, mic, disposition, raw, self._route(request)
                )
                raw = record.mdn or raw  # a concurrent twin's accepted MDN stands
            except Exception:  # the document is committed; its MDN is made again on a resend
                log.exception("the MDN of AS2 message %s could not be kept in the ledger", request.message_id[:200])
                if disposition == PROCESSED:
                    raise StoreUnavailableError() from None
        return await self._send(request, raw, store, note=False)

    def _route(self, request: _Request) -> str:
        """How the MDN goes to the partner, or why it does not (the ledger's ``mdn_delivery``)."""
        if request.receipt_to is None:
            return "none asked for (no Disposition-Notification-To)"
        if not request.async_url:
            return "in the HTTP answer"
        refusal = request.partner.as2.async_mdn_refusal(request.async_url)
        if refusal is not None:
            return f"not sent: {refusal}"
        return f"queueing for {request.async_url[:200]}"

    async def _send(
        self, request: _Request, mdn_mime: bytes, store: Callable[[], As2Store], *, note: bool
    ) -> RawAnswer:
        """The MDN in the HTTP answer, or (``Receipt-Delivery-Option``) queued as a delivery and 200 now.

        An asynchronous MDN goes only to a URL the partner's agreement lists and an address its policy allows:
        the URL is the partner's input. Otherwise the message stays processed, no MDN is sent (RFC 3798 2.1:
        sending one is never required; the partner's software resends or alerts when none comes) and the
        ledger says why. *note* records how it went for a resend (a first answer's row already says)."""
        if request.receipt_to is None:
            return 200, [(b"content-length", b"0")], b""  # no MDN asked for
        if request.async_url:
            partner = request.partner
            refusal = partner.as2.async_mdn_refusal(request.async_url)
            if refusal is not None:
                log.warning(
                    "asynchronous MDN of AS2 %s from %s not sent: %s", request.message_id[:200], partner.id, refusal
                )
                if note:
                    await self._note(store, request, f"not sent: {refusal}")
                return 200, [(b"content-length", b"0")], b""
            await self._queue_mdn(request, mdn_mime, store)
            return 200, [(b"content-length", b"0")], b""
        head, _, body = mdn_mime.partition(b"\r\n\r\n")
        raw_headers = [
            (name.lower(), value) for name, _, value in (line.partition(b": ") for line in head.split(b"\r\n"))
        ]
        raw_headers.append((b"content-length", str(len(body)).encode("latin-1")))
        return 200, raw_headers, body

    async def _queue_mdn(self, request: _Request, mdn_mime: bytes, store: Callable[[], As2Store]) -> None:
        """Queue the MDN on the partner's ``as2-mdn`` endpoint, unless its URL's host is at a refused address
        now (each attempt checks again). A store that fails here answers 503: the partner resends, and the
        resend queues the MDN kept with the document."""
        from gateway.as2.mdn_delivery import MDN_ENDPOINT, queue_mdn

        url = request.async_url
        assert url is not None
        partner = request.partner
        blocked = await self._blocked(url, partner.as2.async_mdn_addresses)
        if blocked is not None:
            log.warning("asynchronous MDN to %s not sent: %s", url[:200], blocked)
            await self._note(store, request, f"not sent to {url[:120]}: {blocked}")
            return
        endpoint = partner.delivery.endpoints.get(MDN_ENDPOINT)
        if endpoint is None:  # never: an agreement that lists URLs has the endpoint
            await self._note(store, request, f"not sent: partner {partner.id!r} has no {MDN_ENDPOINT} endpoint")
            return
        try:
            delivery_id = await queue_mdn(store().broker, endpoint, mdn_mime, url, request.message_id)
        except Exception:
            log.exception("the asynchronous MDN of AS2 message %s could not be queued", request.message_id[:200])
            raise StoreUnavailableError() from None
        await self._note(store, request, f"queued as delivery {delivery_id} for {url[:200]}")

    async def _blocked(self, url: str, addresses: Any) -> str | None:
        """Why *url*'s host may not be connected to, or None (also when it does not resolve now: the delivery's
        attempts resolve it again)."""
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            async with asyncio.timeout(self.settings.mdn_timeout):
                await addresses.resolve(parts.hostname or "", port)
        except BlockedAddressError as exc:
            return exc.detail
        except (TimeoutError, OSError):
            return None
        return None

    async def _note(self, store: Callable[[], As2Store], request: _Request, how: str) -> None:
        try:
            await store().mdn_delivered(request.partner.id, request.message_id, how)
        except Exception:  # a note for the operators; the message and its MDN are kept already
            log.exception("how the MDN of AS2 message %s went could not be noted", request.message_id[:200])


def _idempotency_key(message_id: str) -> str:
    import hashlib

    key = "as2:" + message_id.strip("<>")
    if len(key) <= 200 and key.isascii() and key.isprintable():
        return key
    return "as2:sha256:" + hashlib.sha256(message_id.encode("utf-8", "replace")).hexdigest()
