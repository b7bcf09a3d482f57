"""Partners, keys and certificate pins changed from the admin side, folded over ``partners.yaml``.

The partners file stays the declaration; an admin may add a partner, issue it a key, revoke any key (one the
file declares too, by its id) and pin or unpin a certificate by its SHA-256 fingerprint, without editing the
file. Each change is a ``b2b_partner_changes`` row (:mod:`gateway.security.tables`), written in the store and
never rewritten; the registry a process serves is :func:`merged`: the file's registry with the rows folded
over it in order. The greatest ``seq`` is the overlay's version: every serving process polls it (the
partners watcher, every ``server.partners_reload``) and rebuilds its registry when it grew, so a revocation
reaches every process within that interval, as an edit of the file does.

What the file declares wins over an added partner of the same id; a revocation is for good (a revoked key id
stays unusable, whatever the file says later); an issued key is stored as its scrypt hash only, checked once
with scrypt and then, like a declared scrypt key, by its HMAC digest (:mod:`gateway.security.keys`).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa

from broker_core import StoreError
from broker_core.clock import now_ms
from gateway.routing.partners import ApiKey, Partner, PartnerRegistry
from gateway.security.tables import partner_changes
from gateway.trust.pins import CertificatePin, PartnerTrust, TrustRegistry, Window

__all__ = ["ACTIONS", "Change", "ChangeConflictError", "PartnerOverlay", "attach_overlay", "merged"]

log = logging.getLogger(__name__)

ACTIONS = ("partner-add", "key-issue", "key-revoke", "pin-add", "pin-remove")


class ChangeConflictError(StoreError):
    """The key id was issued, or the partner added, by another process first. A
    :class:`broker_core.StoreError`, so the store's writer hands it back as it is and fails only this write."""


@dataclass(frozen=True, slots=True)
class Change:
    """One ``b2b_partner_changes`` row."""

    seq: int
    at: int
    operator: str
    action: str
    partner: str
    key_id: str | None = None
    sha256: str | None = None
    data: dict[str, Any] | None = None


def _when(ms: Any) -> dt.datetime | None:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC) if isinstance(ms, int) else None


def merged(declared: PartnerRegistry, changes: Iterable[Change]) -> PartnerRegistry:
    """A new registry: *declared* (the partners file's) with *changes* folded over it in order."""
    partners: dict[str, Partner] = dict(declared.partners)
    keys: dict[str, ApiKey] = dict(declared.keys)
    base_trust = declared.trust
    trust: dict[str, PartnerTrust] = dict(base_trust.partners) if base_trust is not None else {}
    revoked: set[str] = set()
    pinned = {pin.sha256: pid for pid, entry in trust.items() for pin in entry.pins if pin.sha256 is not None}
    for change in changes:
        data = change.data or {}
        pid = change.partner
        if change.action == "partner-add":
            if pid not in partners:
                partners[pid] = Partner(pid, str(data.get("name") or pid))
            continue
        if pid not in partners:
            continue
        current = trust.get(pid) or PartnerTrust()
        if change.action == "key-issue" and change.key_id and change.key_id not in keys:
            keys[change.key_id] = ApiKey(change.key_id, pid, str(data["hash"]))
            window = Window(data.get("label"), _when(data.get("not_before")), _when(data.get("not_after")))
            trust[pid] = replace(current, key_windows={**current.key_windows, change.key_id: window})
        elif change.action == "key-revoke" and change.key_id:
            revoked.add(change.key_id)
        elif change.action == "pin-add" and change.sha256:
            owner = pinned.get(change.sha256)
            if owner is None:
                pin = CertificatePin(change.sha256, None, None, Window(data.get("label")))
                trust[pid] = replace(current, pins=(*current.pins, pin))
                pinned[change.sha256] = pid
            elif owner != pid:  # pinned to another partner meanwhile (the file, or another process): skipped
                log.error("certificate sha256:%s stays pinned to %r, not to %r", change.sha256, owner, pid)
        elif change.action == "pin-remove" and change.sha256:
            trust[pid] = replace(current, pins=tuple(p for p in current.pins if p.sha256 != change.sha256))
            if pinned.get(change.sha256) == pid:
                del pinned[change.sha256]
    for key_id in revoked:
        keys.pop(key_id, None)
    registry = PartnerRegistry(partners, keys)
    try:
        registry.trust = TrustRegistry(trust)
    except ValueError as exc:  # not expected (conflicting pins are skipped above): the file's, revocations kept
        log.error("partner changes not applied but for revocations: %s", exc)
        registry = PartnerRegistry(declared.partners, {k: v for k, v in declared.keys.items() if k not in revoked})
        registry.trust = base_trust
    registry.revoked = frozenset(revoked)
    return registry


def _change(row: Any) -> Change:
    return Change(
        row.seq,
        row.at,
        row.operator,
        row.action,
        row.partner,
        row.key_id,
        row.sha256,
        json.loads(row.data) if row.data else None,
    )


class PartnerOverlay:
    """The partner changes of one store: read and version polled on *engine* (a read never waits for the
    store writer's turn), written through *write* (``broker.write``: the writer's own transaction)."""

    def __init__(self, engine: sa.Engine, write: Callable[..., list[Any]] | None, declared: PartnerRegistry) -> None:
        self._engine = engine
        self._write = write
        #: the partners file's registry the changes are folded over (replaced when the file is re-read)
        self.declared = declared
        #: the version the serving registry was built from (None: not read yet)
        self.version: int | None = None

    @classmethod
    def for_broker(cls, broker: Any, declared: PartnerRegistry) -> PartnerOverlay:
        return cls(broker.engine, broker.write, declared)

    def current_version(self) -> int:
        """The greatest ``seq`` in the store (0: no change yet): one index look-up."""

        with self._engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.coalesce(sa.func.max(partner_changes.c.seq), 0))).scalar_one())

    def changes(self) -> list[Change]:
        with self._engine.connect() as conn:
            rows = conn.execute(sa.select(partner_changes).order_by(partner_changes.c.seq)).all()
        return [_change(row) for row in rows]

    def rebuild(self) -> PartnerRegistry:
        """The registry to serve now: the declared one with every stored change; remembers the version."""
        changes = self.changes()
        self.version = changes[-1].seq if changes else 0
        return merged(self.declared, changes)

    def record(
        self,
        operator: str,
        action: str,
        partner: str,
        *,
        key_id: str | None = None,
        sha256: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> int:
        """Store one change; its ``seq``. :class:`ChangeConflictError` when another process issued the same key
        id or added the same partner first (unique partial indexes)."""
        if action not in ACTIONS or self._write is None:
            raise ValueError(f"unknown partner change {action!r}")
        row = {
            "at": now_ms(),
            "operator": operator[:64],
            "action": action,
            "partner": partner,
            "key_id": key_id,
            "sha256": sha256,
            "data": json.dumps(data, separators=(",", ":")) if data else None,
        }

        def insert(conn: sa.Connection) -> int:
            try:
                return int(conn.execute(partner_changes.insert().returning(partner_changes.c.seq), row).scalar_one())
            except sa.exc.IntegrityError:
                raise ChangeConflictError(f"{action} {key_id or partner}: made by another process first") from None

        return self._write(insert)[0]


def attach_overlay(registry: PartnerRegistry, broker: Any) -> PartnerRegistry | None:
    """Give *registry* (the partners file's) the partner changes of *broker*'s store; the registry to serve
    with them (for :meth:`PartnerRegistry.adopt` on the event loop), or None without a SQL store."""
    if broker is None or getattr(broker, "engine", None) is None:
        return None
    declared = PartnerRegistry(registry.partners, registry.keys)
    declared.trust = registry.trust
    overlay = PartnerOverlay.for_broker(broker, declared)
    fresh = overlay.rebuild()
    registry.overlay = overlay
    return fresh
