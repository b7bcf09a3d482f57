"""``b2bgw partners``: the partners, their authentication policy, and when each key and certificate expires."""

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


def cmd_partners(args: argparse.Namespace) -> int:
    from gateway.cli.support import settings_for
    from gateway.routing.partners import PartnerRegistry
    from gateway.trust.expiry import credentials

    settings = settings_for(args)
    registry = PartnerRegistry.from_settings(settings)
    now = dt.datetime.now(dt.UTC)
    warn = settings.trust.expiry_warning_days
    by_partner: dict[str, list[Any]] = {}
    for cred in credentials(registry):
        by_partner.setdefault(cred.partner, []).append(cred)
    for partner_id in sorted(registry.partners):
        partner = registry.partners[partner_id]
        auth = registry.trust.get(partner_id).auth if registry.trust is not None else "key"
        state = "" if partner.enabled else ", disabled"
        print(f"{partner_id}  ({partner.name}; auth: {auth}{state})")
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
            print(
                f"  {cred.kind:<11} {cred.name}{label}  from {_date(cred.not_before)}  until "
                f"{_date(cred.not_after)}  {note}"
            )
    return 0
