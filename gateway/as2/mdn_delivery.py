"""Asynchronous MDNs as deliveries: the ``as2-mdn`` endpoint kind, and each AS2 partner's ``as2-mdn`` endpoint.

An MDN asked for with ``Receipt-Delivery-Option`` is queued on the partner's ``as2-mdn`` endpoint once the
document is committed, so the delivery engine retries it, keeps its timeline and lets operators replay it like
any delivery. The endpoint exists for every partner whose agreement lists ``as2.async_mdn_urls``; its engine
keys (``max_attempts``, ``backoff`` ...) may be set under ``endpoints: as2-mdn:``. The URL comes with each
delivery (it is the partner's input), so every attempt checks it against the agreement's URLs and address
policy again, connects to the address it checked, follows no redirect and reads at most 64 KiB of the answer.
The delivery's body is the MDN as the ledger keeps it: its MIME headers (AS2 headers, Message-ID,
Content-Type with its boundary) become the request's headers, its body is posted byte for byte.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import httpx

from gateway.as2.config import PartnerAgreement, our_mdn_timeout
from gateway.delivery.config import EndpointConfig, PartnerDelivery
from gateway.delivery.errors import BlockedAddressError
from gateway.delivery.https import attempt_failure, classify, post_checked
from gateway.delivery.outbox import queue_delivery_async
from gateway.delivery.transport import AttemptResult, OutboundRequest, register_transport
from gateway.errors import clip
from gateway.marked import MarkedDict, Where, check_keys, expect_mapping

__all__ = ["MDN_ENDPOINT", "MDN_KIND", "As2MdnTransport", "MdnEndpoint", "queue_mdn", "register", "with_mdn_endpoint"]

#: the endpoint's name in every AS2 partner's endpoints, and its kind
MDN_ENDPOINT = MDN_KIND = "as2-mdn"
_MAX_ANSWER_BYTES = 64 * 1024  # of the answer to an MDN (its body means nothing to us)
_USER_AGENT = "b2bgw-as2/1"


@dataclass(frozen=True, slots=True)
class MdnEndpoint:
    """An ``as2-mdn`` endpoint: the partner's agreement, whose URLs and address policy every attempt checks."""

    agreement: PartnerAgreement | None = None

    @property
    def timeout(self) -> float:
        """What one attempt may take in all (``as2.mdn_timeout``); the engine reads it."""
        return our_mdn_timeout()


def parse_mdn_endpoint(mapping: MarkedDict, where: Where, what: str) -> MdnEndpoint:
    """An ``as2-mdn`` endpoint has no keys of its own: its URL comes with each MDN, its checks from ``as2:``."""
    check_keys(mapping, {"kind"}, what)
    return MdnEndpoint()


def with_mdn_endpoint(partner: str, delivery: PartnerDelivery, agreement: Any, entry: MarkedDict) -> PartnerDelivery:
    """*delivery* with the partner's ``as2-mdn`` endpoint when its agreement lists ``async_mdn_urls`` (its
    engine keys from ``endpoints: as2-mdn:`` when given there). ConfigError for an ``as2-mdn`` misused."""
    where = expect_mapping(entry.get("endpoints"), entry.at("endpoints"), f"partner {partner!r} endpoints").at
    for name, endpoint in delivery.endpoints.items():
        if (name == MDN_ENDPOINT) != (endpoint.kind == MDN_KIND):
            raise where(name).error(
                f"partner {partner!r} endpoint {name!r}: the endpoint named {MDN_ENDPOINT!r} is the one of kind "
                f"{MDN_KIND!r} (where asynchronous AS2 MDNs go), and it is the only one of that kind"
            )
    configured = delivery.endpoints.get(MDN_ENDPOINT)
    if agreement is None or not agreement.async_mdn_urls:
        if configured is not None:
            raise where(MDN_ENDPOINT).error(
                f"partner {partner!r} endpoint {MDN_ENDPOINT!r}: asynchronous MDNs go only to the partner's "
                "as2.async_mdn_urls, and none are configured"
            )
        return delivery
    base = configured or EndpointConfig(partner, MDN_ENDPOINT, MDN_KIND, None)
    endpoints = {**delivery.endpoints, MDN_ENDPOINT: replace(base, transport=MdnEndpoint(agreement), implicit=True)}
    return replace(delivery, endpoints=endpoints)


def split_mdn(mime: bytes) -> tuple[dict[str, str], bytes]:
    """The MDN's MIME headers (the request's headers) and its body, byte for byte."""
    head, _, body = mime.partition(b"\r\n\r\n")
    headers: dict[str, str] = {}
    for line in head.split(b"\r\n"):
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip():
            headers[name.strip()] = value.strip()
    return headers, body


async def queue_mdn(broker: Any, endpoint: EndpointConfig, mdn_mime: bytes, url: str, original: str) -> str:
    """Queue the MDN of the AS2 message *original* for *url* (durably); returns the delivery's id."""
    headers, _ = split_mdn(mdn_mime)
    return await queue_delivery_async(
        broker,
        endpoint,
        mdn_mime,
        content_type=headers.get("Content-Type", "multipart/report"),
        source=f"AS2 MDN of {clip(original, 200)}",
        doc_type="AS2 MDN",
        target=url,
    )


class As2MdnTransport:
    """The delivery engine's transport of kind ``as2-mdn``: one POST of an MDN per attempt."""

    kind: ClassVar[str] = MDN_KIND

    def __init__(self, endpoint: MdnEndpoint) -> None:
        self.endpoint = endpoint
        self._client = httpx.AsyncClient(
            follow_redirects=False,
            trust_env=False,
            timeout=httpx.Timeout(endpoint.timeout),
            limits=httpx.Limits(max_connections=16, max_keepalive_connections=4),
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def send(self, request: OutboundRequest) -> AttemptResult:
        agreement = self.endpoint.agreement
        url = request.target
        if agreement is None or not url:
            return AttemptResult("failed", None, "the delivery names no Receipt-Delivery-Option URL")
        refusal = agreement.async_mdn_refusal(url)
        if refusal is not None:
            return AttemptResult("failed", None, clip(f"not sent: {refusal}", 300))
        headers, body = split_mdn(request.body)
        headers["User-Agent"] = _USER_AGENT
        try:
            async with asyncio.timeout(request.timeout):
                status, location, retry_after, text = await post_checked(
                    self._client, url, headers, body, agreement.async_mdn_addresses, _MAX_ANSWER_BYTES
                )
        except (TimeoutError, BlockedAddressError, httpx.HTTPError, OSError) as exc:
            return attempt_failure(exc, request.timeout)
        outcome = classify(status)
        if 300 <= status < 400:
            detail = f"{status} from {url}: redirect to {location or 'nowhere'} not followed"
        else:
            detail = f"{status} from {url}" + (f": {text}" if text else "")
        honoured = retry_after if status in (429, 503) else None
        return AttemptResult(outcome, status, clip(detail, 300), honoured)  # type: ignore[arg-type]


def register() -> bool:
    """Register the ``as2-mdn`` kind with the delivery engine."""
    register_transport(MDN_KIND, parse_mdn_endpoint, As2MdnTransport)
    return True
