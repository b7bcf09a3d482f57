"""``POST /as2`` on the gateway's app: the request handed to :class:`gateway.as2.inbound.As2Inbound` with the
gateway's :meth:`~gateway.exchange.submission.Gateway.submit` and ledger, under the partner's request limits."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.as2.inbound import As2Inbound
from gateway.as2.store import As2Store

__all__ = ["as2_endpoint"]


def as2_endpoint(assembly: Any, gateway: Callable[[], Any], limiter: Any) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint for *assembly*'s ``as2:`` settings and AS2 partners; *gateway* returns the running Gateway."""
    inbound = As2Inbound(
        assembly.settings.as2, assembly.partners, max_document_bytes=assembly.settings.limits.max_bytes
    )
    stores: dict[int, As2Store] = {}

    def store() -> As2Store:
        gw = gateway()
        found = stores.get(id(gw.ledger.engine))
        if found is None:
            found = stores[id(gw.ledger.engine)] = As2Store(gw.ledger.engine, gw.broker)
        return found

    async def post_as2(request: Request) -> Response:
        headers = request.headers
        partner = inbound.partner_of(headers)
        await limiter.admit(partner)
        try:
            length = headers.get("content-length")
            declared = int(length) if length and length.isdigit() else None
            status, raw_headers, body = await inbound.handle(
                headers, request.stream(), declared, gateway().submit, store
            )
        finally:
            limiter.release(partner)
        response = Response(body, status_code=status)
        response.raw_headers = raw_headers
        return response

    post_as2.__doc__ = "POST /as2: an AS2 message (RFC 4130), answered with its MDN"
    return post_as2


def as2_openapi_path() -> dict[str, Any]:
    """``POST /as2`` in the OpenAPI document (added when the ``as2:`` section is configured)."""
    problem = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}

    def header(name: str, description: str, required: bool = True) -> dict[str, Any]:
        return {
            "name": name,
            "in": "header",
            "required": required,
            "description": description,
            "schema": {"type": "string", "maxLength": 998},
        }

    return {
        "post": {
            "operationId": "postAs2Message",
            "summary": "Receive an AS2 message (RFC 4130), answered with its MDN",
            "description": "Signed, encrypted and optionally compressed message from a partner identified by its AS2 "
            "ids and certificates (no API key). The MDN is the answer's body (synchronous) or is posted "
            "to Receipt-Delivery-Option (asynchronous: the answer is empty). See docs/as2.md.",
            "security": [],
            "parameters": [
                header("AS2-From", "the partner's AS2 id"),
                header("AS2-To", "our AS2 id"),
                header("Message-ID", "the message's id (<id@host>): the idempotency key"),
                header("Disposition-Notification-To", "asks for an MDN", False),
                header("Disposition-Notification-Options", "asks for a signed MDN and its MIC algorithm", False),
                header("Receipt-Delivery-Option", "the URL of an asynchronous MDN", False),
            ],
            "requestBody": {
                "required": True,
                "content": {
                    "application/pkcs7-mime": {"schema": {"type": "string", "format": "binary"}},
                    "multipart/signed": {"schema": {"type": "string", "format": "binary"}},
                    "multipart/report": {"schema": {"type": "string", "format": "binary"}},
                },
            },
            "responses": {
                "200": {
                    "description": "The MDN (multipart/signed or multipart/report), or empty (asynchronous MDN, "
                    "or none asked for).",
                    "content": {
                        "multipart/signed": {"schema": {"type": "string"}},
                        "multipart/report": {"schema": {"type": "string"}},
                    },
                },
                "400": {"description": "as2-header-invalid, as2-mdn-invalid", "content": problem},
                "403": {"description": "as2-unknown-partner, as2-unprotected", "content": problem},
                "413": {"description": "document-too-large", "content": problem},
                "429": {"description": "rate-limited, too-many-concurrent-requests", "content": problem},
                "503": {"description": "store-unavailable, gateway-busy: no MDN, send again", "content": problem},
            },
        }
    }
