"""``b2bgw partners``: the partners, their authentication policy, and when each key and certificate expires;
with the changes made from the admin side when the configured store is reachable (as the gateway serves
them): keys issued there marked ``(admin)``, and each partner's revoked keys."""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Callable
from typing import Any

__all__ = ["register"]


def register(sub: Any, with_config: Callable[[argparse.ArgumentParser], argparse.ArgumentParser]) -> None:
    p = with_config(sub.add_parser("partners", help="list partners with their keys' and certificates' expiry"))
    p.set_defaults(func=cmd_partners)


def _date(value: dt.datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M") if value is not None else "-"


def _served(declared: Any, settings: Any) -> tuple[Any, list[Any]]:
    """The registry the gateway serves (the file's with the store's partner changes) and those changes; the
    file's alone, said on stderr, when the store cannot be read."""
    import sqlalchemy as sa

    from gateway.cli.support import CommandError, existing_store_engine, to_stderr
    from gateway.routing.overlay import PartnerOverlay

    try:
        engine = existing_store_engine(settings)
    except CommandError as exc:
        to_stderr(f"b2bgw partners: the partners file only ({exc})")
        return declared, []

    try:
        overlay = PartnerOverlay(engine, None, declared)
        changes = overlay.changes()
        return overlay.rebuild(), changes
    except sa.exc.SQLAlchemyError as exc:
        to_stderr(f"b2bgw partners: the partners file only (the store's partner changes: {type(exc).__name__})")
        return declared, []
    finally:
        engine.dispose()


def cmd_partners(args: argparse.Namespace) -> int:
    from gateway.cli.support import settings_for
    from gateway.routing.partners import PartnerRegistry
    from gateway.trust.expiry import credentials

    settings = settings_for(args)
    declared = PartnerRegistry.from_settings(settings)
    registry, changes = _served(declared, settings)
    revoked = [c for c in changes if c.action == "key-revoke"]
    now = dt.datetime.now(dt.UTC)
    warn = settings.trust.expiry_warning_days
    by_partner: dict[str, list[Any]] = {}
    for cred in credentials(registry):
        by_partner.setdefault(cred.partner, []).append(cred)
    for partner_id in sorted(registry.partners):
        partner = registry.partners[partner_id]
        auth = registry.trust.get(partner_id).auth if registry.trust is not None else "key"
        state = "" if partner.enabled else ", disabled"
        added = "" if partner_id in declared.partners else ", added by an admin"
        print(f"{partner_id}  ({partner.name}; auth: {auth}{state}{added})")
        for cred in by_partner.get(partner_id, []):
            days = cred.days_left(now)
            if days is None:
                note = "no expiry"
            elif days < 0:
                note = "EXPIRED"
            elif cred.not_before is not None and cred.not_before > now:
                note = "not yet valid"
            elif days <= warn:
                note = f"EXPIRES in {days:.0f} days"
            else:
                note = f"{days:.0f} days left"
            label = f" [{cred.label}]" if cred.label else ""
            source = " (admin)" if cred.kind == "key" and cred.name not in declared.keys else ""
            print(
                f"  {cred.kind:<11} {cred.name}{source}{label}  from {_date(cred.not_before)}  until "
                f"{_date(cred.not_after)}  {note}"
            )
        for change in revoked:
            if change.partner == partner_id:
                when = dt.datetime.fromtimestamp(change.at / 1000, dt.UTC)
                print(f"  {'key':<11} {change.key_id}  revoked on {_date(when)} by {change.operator}")
    return 0
