"""A request's partner, by that partner's ``auth`` policy (:mod:`gateway.trust.pins`).

Every refusal is the same 401 as a wrong key (``unauthenticated``), whatever failed: no key for a
certificate-only partner, a certificate pinned to another partner than the key's, a certificate no partner
pinned where one is required. The only other answer is ``key-expired``, for a *genuine* key used outside its
window (the secret checked first, so it tells nothing to someone who does not hold the key).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import gateway.routing.partners as partners_module
from gateway.errors import AuthenticationError
from gateway.telemetry.logs import bind
from gateway.trust.errors import KeyExpiredError
from gateway.trust.peer import client_certificate
from gateway.trust.pins import EMPTY_TRUST, TrustRegistry

__all__ = ["Identity", "authenticate", "authenticated", "client_address"]

#: The detail of a wrong key's 401, so that a certificate of another partner is answered alike.
_KEY_DETAIL = getattr(partners_module, "_AUTH_DETAIL", None)
_CERT_DETAIL = (
    "Authenticate with the client certificate pinned for your partner account, or with the header "
    "'Authorization: Bearer <API key>' if your account uses keys."
)


@dataclass(frozen=True, slots=True)
class Identity:
    """How a request's partner was authenticated: ``key:<key id>``, ``certificate:sha256:<fingerprint>``,
    or both joined with ``+`` (what logs and the ledger record)."""

    partner: Any
    method: str


def client_address(scope: Any) -> str | None:
    """The client's address (failed authentications are counted and throttled by it)."""
    client = scope.get("client") if scope is not None else None
    return str(client[0]) if client else None


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


async def authenticate(registry: Any, scope: Any, authorization: str | None) -> Identity:
    """The partner of a request with *scope* and ``Authorization`` value *authorization*, or
    AuthenticationError (KeyExpiredError for a genuine key outside its window)."""
    trust: TrustRegistry = getattr(registry, "trust", None) or EMPTY_TRUST
    cert = client_certificate(scope) if scope is not None else None
    pinned = trust.pinned(cert) if cert is not None else None
    now = _now()
    if pinned is not None and not pinned[1].window.valid_at(now):
        pinned = None  # outside its window: as if not pinned
    if authorization is None:
        if pinned is None:
            raise AuthenticationError(_CERT_DETAIL if cert is not None else None)
        partner = registry.get(pinned[0])
        if partner is None or not partner.enabled or trust.get(partner.id).auth != "certificate":
            raise AuthenticationError(_CERT_DETAIL if partner is not None and partner.enabled else None)
        return Identity(partner, f"certificate:sha256:{cert.sha256}")  # type: ignore[union-attr]
    partner = await registry.authenticate_async(authorization, client_address(scope))
    policy = trust.get(partner.id)
    if policy.auth == "certificate" and pinned is None:
        raise AuthenticationError(_CERT_DETAIL)
    if pinned is not None and pinned[0] != partner.id:
        raise AuthenticationError(_KEY_DETAIL)  # a certificate of another partner: like a wrong key
    if policy.auth == "both" and pinned is None:
        raise AuthenticationError(_CERT_DETAIL)
    key_id = authorization.strip().partition(" ")[2].strip().split(".", 1)[0]
    window = trust.key_window(partner.id, key_id)
    if window is not None and not window.valid_at(now):
        raise KeyExpiredError()
    method = f"key:{key_id}"
    if pinned is not None:
        method += f"+certificate:sha256:{cert.sha256}"  # type: ignore[union-attr]
    return Identity(partner, method)


async def authenticated(registry: Any, scope: Any, authorization: str | None) -> Identity:
    """:func:`authenticate`, the partner and how it was authenticated set in the request's log context."""
    identity = await authenticate(registry, scope, authorization)
    bind(partner=identity.partner.id, auth=identity.method)
    return identity
