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
    inbound = As2Inbound(assembly.settings.as2, assembly.partners, max_document_bytes=assembly.settings.limits.max_bytes)
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
            status, raw_headers, body = await inbound.handle(headers, request.stream(), declared,
                                                             gateway().submit, store)
        finally:
            limiter.release(partner)
        response = Response(body, status_code=status)
        response.raw_headers = raw_headers
        return response

    post_as2.__doc__ = "POST /as2: an AS2 message (RFC 4130), answered with its MDN"
    return post_as2
