"""Partners, keys and certificate pins changed from the admin side (admin role), for the admin API and the
console alike: each checks the change against the registry served now, stores it
(:class:`gateway.routing.overlay.PartnerOverlay`), writes an audit entry (never the key) and returns the
registry to serve with it, which the caller adopts on the event loop. Other processes see the change at
their next poll of the store (``server.partners_reload``)."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from gateway.admin.access import Principal
from gateway.admin.errors import InvalidRequestError, PartnerConflictError
from gateway.errors import NotFoundError, StoreUnavailableError
from gateway.routing.overlay import ChangeConflictError, attach_overlay
from gateway.routing.partners import KEY_ID, PARTNER_ID, PartnerRegistry, generate_key, hash_key
from gateway.trust.peer import PeerCertificate

__all__ = ["add_partner", "credentials", "issue_key", "pin_certificate", "revoke_key", "unpin_certificate"]

_HEX = re.compile(r"^[0-9a-f]{64}$")


def _registry(service: Any) -> PartnerRegistry:
    return service.assembly.partners


def _overlay(service: Any) -> Any:
    registry = _registry(service)
    if registry.overlay is None:  # not attached by the serving app's start (an app served without its lifespan)
        attach_overlay(registry, service.parts()[0])
    overlay = registry.overlay
    if overlay is None:
        raise StoreUnavailableError("Partner changes need the store; the gateway is starting, retry in a moment.")
    return overlay


def _text(spec: dict[str, Any], name: str, *, required: bool = False, limit: int = 200) -> str | None:
    value = spec.get(name)
    if value is None or value == "":
        if required:
            raise InvalidRequestError(f"{name} is required.")
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise InvalidRequestError(f"{name} must be a string of at most {limit} characters.")
    return value.strip()


def _when(spec: dict[str, Any], name: str) -> int | None:
    text = _text(spec, name, limit=40)
    if text is None:
        return None
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequestError(f"{name} must be an ISO 8601 date or timestamp (2027-01-31T12:00:00Z).") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def _partner(service: Any, partner_id: str) -> Any:
    partner = _registry(service).get(partner_id)
    if partner is None:
        raise NotFoundError(f"No partner {partner_id[:100]!r}.")
    return partner


def _done(service: Any, principal: Principal, action: str, target: str, detail: str, client: str) -> PartnerRegistry:
    """The audit entry of a stored change, and the registry to serve with it."""
    service.audit.record(
        operator=principal.name, role=principal.role, action=action, target=target, detail=detail, client=client
    )
    return _overlay(service).rebuild()


def add_partner(
    service: Any, principal: Principal, spec: dict[str, Any], client: str
) -> tuple[dict[str, Any], PartnerRegistry]:
    """``{"id", "name"}``: a partner the file does not declare (it authenticates once it has a key or a pin)."""
    principal.require_admin()
    partner_id = _text(spec, "id", required=True, limit=100)
    assert partner_id is not None
    if not PARTNER_ID.match(partner_id):
        raise InvalidRequestError(
            "id must be 1-100 letters, digits, '.', '-' or '_' (starting with a letter or digit)."
        )
    name = _text(spec, "name") or partner_id
    if partner_id in _registry(service):
        raise PartnerConflictError(f"Partner {partner_id!r} exists already.")
    try:
        _overlay(service).record(principal.name, "partner-add", partner_id, data={"name": name})
    except ChangeConflictError:
        raise PartnerConflictError(f"Partner {partner_id!r} was added already.") from None
    fresh = _done(service, principal, "partner-add", partner_id, f"partner {partner_id} ({name}) added", client)
    return {"id": partner_id, "name": name}, fresh


def issue_key(
    service: Any, principal: Principal, partner_id: str, spec: dict[str, Any], client: str
) -> tuple[dict[str, Any], PartnerRegistry]:
    """``{"id", "label", "not_before", "not_after"}``: a new key for the partner; the answer holds the key,
    the only time it is shown (the store keeps its scrypt hash)."""
    principal.require_admin()
    _partner(service, partner_id)
    key_id = _text(spec, "id", required=True, limit=64)
    assert key_id is not None
    if not KEY_ID.match(key_id):
        raise InvalidRequestError("id must be 1-64 letters, digits, '-' or '_' (starting with a letter or digit).")
    registry = _registry(service)
    if key_id in registry.keys or key_id in registry.revoked:
        raise PartnerConflictError(f"Key id {key_id!r} is taken (key ids are unique, and a revoked one stays taken).")
    label = _text(spec, "label")
    not_before, not_after = _when(spec, "not_before"), _when(spec, "not_after")
    if not_before is not None and not_after is not None and not_after <= not_before:
        raise InvalidRequestError("not_after must come after not_before.")
    key = generate_key(key_id)
    data = {"hash": hash_key(key), "label": label, "not_before": not_before, "not_after": not_after}
    try:
        _overlay(service).record(principal.name, "key-issue", partner_id, key_id=key_id, data=data)
    except ChangeConflictError:
        raise PartnerConflictError(f"Key id {key_id!r} was issued already.") from None
    fresh = _done(service, principal, "key-issue", f"{partner_id} key {key_id}", f"key {key_id} issued", client)
    answer = {"partner": partner_id, "id": key_id, "label": label, "key": key}
    answer["not_before"] = spec.get("not_before") if not_before is not None else None
    answer["not_after"] = spec.get("not_after") if not_after is not None else None
    return answer, fresh


def revoke_key(
    service: Any, principal: Principal, partner_id: str, key_id: str, client: str
) -> tuple[dict[str, Any], PartnerRegistry]:
    """Revoke one of the partner's keys, declared in the file or issued here, for good."""
    principal.require_admin()
    _partner(service, partner_id)
    registry = _registry(service)
    key = registry.keys.get(key_id)
    if key is None or key.partner != partner_id:
        if key_id in registry.revoked:
            raise PartnerConflictError(f"Key {key_id!r} is revoked already.")
        raise NotFoundError(f"Partner {partner_id!r} has no key {key_id[:64]!r}.")
    _overlay(service).record(principal.name, "key-revoke", partner_id, key_id=key_id)
    fresh = _done(service, principal, "key-revoke", f"{partner_id} key {key_id}", f"key {key_id} revoked", client)
    return {"partner": partner_id, "id": key_id, "revoked": True}, fresh


def _fingerprint(spec: dict[str, Any]) -> str:
    pem = _text(spec, "pem", limit=20_000)
    if pem is not None:
        cert = PeerCertificate.from_pem(pem)
        if cert is None:
            raise InvalidRequestError("pem is not a PEM certificate.")
        return cert.sha256
    text = (_text(spec, "sha256", limit=100) or "").replace(":", "").lower()
    if not _HEX.match(text):
        raise InvalidRequestError("Name the certificate by sha256 (64 hex digits, colons allowed) or by pem.")
    return text


def pin_certificate(
    service: Any, principal: Principal, partner_id: str, spec: dict[str, Any], client: str
) -> tuple[dict[str, Any], PartnerRegistry]:
    """``{"sha256"}`` or ``{"pem"}``, and ``"label"``: pin a certificate to the partner."""
    principal.require_admin()
    _partner(service, partner_id)
    sha256 = _fingerprint(spec)
    pinned = _registry(service).trust.by_fingerprint.get(sha256)
    if pinned is not None:
        owner = "this partner" if pinned[0] == partner_id else "another partner"
        raise PartnerConflictError(f"Certificate sha256:{sha256} is pinned to {owner} already.")
    label = _text(spec, "label")
    _overlay(service).record(principal.name, "pin-add", partner_id, sha256=sha256, data={"label": label})
    fresh = _done(service, principal, "pin-add", partner_id, f"certificate sha256:{sha256} pinned", client)
    return {"partner": partner_id, "sha256": sha256, "label": label}, fresh


def unpin_certificate(
    service: Any, principal: Principal, partner_id: str, spec: dict[str, Any], client: str
) -> tuple[dict[str, Any], PartnerRegistry]:
    """``{"sha256"}`` or ``{"pem"}``: remove the partner's pin of that certificate (declared or added here)."""
    principal.require_admin()
    _partner(service, partner_id)
    sha256 = _fingerprint(spec)
    pinned = _registry(service).trust.by_fingerprint.get(sha256)
    if pinned is None or pinned[0] != partner_id:
        raise NotFoundError(f"Partner {partner_id!r} has no pin of certificate sha256:{sha256}.")
    _overlay(service).record(principal.name, "pin-remove", partner_id, sha256=sha256)
    fresh = _done(service, principal, "pin-remove", partner_id, f"certificate sha256:{sha256} unpinned", client)
    return {"partner": partner_id, "sha256": sha256, "pinned": False}, fresh


def credentials(service: Any) -> dict[str, Any]:
    """Every partner with its keys (where each comes from, its window), revoked keys and pins."""
    registry = _registry(service)
    overlay = getattr(registry, "overlay", None)
    declared = overlay.declared if overlay is not None else registry
    changes = overlay.changes() if overlay is not None else []
    revoked_by = {c.key_id: c for c in changes if c.action == "key-revoke"}
    out = []
    for pid, partner in sorted(registry.partners.items()):
        trust = registry.trust.get(pid)
        keys = []
        for key in sorted((k for k in registry.keys.values() if k.partner == pid), key=lambda k: k.id):
            window = trust.key_windows.get(key.id)
            keys.append(
                {
                    "id": key.id,
                    "source": "partners file" if key.id in declared.keys else "admin",
                    "label": window.label if window else None,
                    "not_before": window.not_before.isoformat() if window and window.not_before else None,
                    "not_after": window.not_after.isoformat() if window and window.not_after else None,
                }
            )
        revoked = [
            {"id": c.key_id, "revoked_at": c.at, "revoked_by": c.operator}
            for c in revoked_by.values()
            if c.partner == pid
        ]
        pins = [
            {"sha256": p.sha256, "label": p.window.label}
            if p.sha256
            else {"pin": p.describe(), "label": p.window.label}
            for p in trust.pins
        ]
        out.append(
            {
                "id": pid,
                "name": partner.name,
                "enabled": partner.enabled,
                "auth": trust.auth,
                "source": "partners file" if pid in declared.partners else "admin",
                "keys": keys,
                "revoked_keys": revoked,
                "certificates": pins,
            }
        )
    return {"partners": out, "version": overlay.version if overlay is not None else None}
