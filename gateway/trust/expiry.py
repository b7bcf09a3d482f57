"""What expires when: every partner's keys and pinned certificates with a ``not_after``, for
``b2bgw partners``, the ``b2bgw_credential_expiry_seconds`` gauge and a log warning ``server.expiry_warning``
days (30 by default) before the date, then every day until it is replaced."""

from __future__ import annotations

import datetime as dt
import logging
import threading
from dataclasses import dataclass
from typing import Any

from prometheus_client import Gauge

from gateway.telemetry.metrics import REGISTRY

__all__ = ["Credential", "ExpiryWatch", "credentials"]

log = logging.getLogger(__name__)

EXPIRY = Gauge(
    "b2bgw_credential_expiry_seconds",
    "Seconds until a partner's API key or pinned client certificate expires (negative: expired).",
    ["partner", "kind", "name"],
    registry=REGISTRY,
    multiprocess_mode="min",
)
#: How often the warning is repeated (and the gauge refreshed).
CHECK_EVERY = 3600.0


@dataclass(frozen=True, slots=True)
class Credential:
    """One key or pinned certificate of a partner, and its window."""

    partner: str
    kind: str  # "key" | "certificate"
    name: str  # the key id, or the pin (sha256:... / subject)
    label: str | None
    not_before: dt.datetime | None
    not_after: dt.datetime | None

    def days_left(self, now: dt.datetime) -> float | None:
        return None if self.not_after is None else (self.not_after - now).total_seconds() / 86400


def credentials(registry: Any) -> list[Credential]:
    """Every key and pinned certificate of *registry*'s partners, by partner then kind then name."""
    trust = getattr(registry, "trust", None)
    out = []
    for key in registry.keys.values():
        window = trust.key_window(key.partner, key.id) if trust is not None else None
        out.append(
            Credential(
                key.partner,
                "key",
                key.id,
                window.label if window else None,
                window.not_before if window else None,
                window.not_after if window else None,
            )
        )
    if trust is not None:
        for partner_id, entry in trust.partners.items():
            for pin in entry.pins:
                out.append(
                    Credential(
                        partner_id,
                        "certificate",
                        pin.describe(),
                        pin.window.label,
                        pin.window.not_before,
                        pin.window.not_after,
                    )
                )
    return sorted(out, key=lambda c: (c.partner, c.kind, c.name))


class ExpiryWatch:
    """Sets the gauge and logs the warnings now and every :data:`CHECK_EVERY` seconds (a daemon thread)."""

    def __init__(self, registry: Any, warn_days: int) -> None:
        self.registry = registry
        self.warn_days = warn_days
        self._stop = threading.Event()

    def check(self, now: dt.datetime | None = None) -> list[Credential]:
        """Refresh the gauge; log and return the credentials expiring within the warning period."""
        now = now or dt.datetime.now(dt.UTC)
        soon = []
        for cred in credentials(self.registry):
            if cred.not_after is None:
                continue
            EXPIRY.labels(cred.partner, cred.kind, cred.name[:100]).set((cred.not_after - now).total_seconds())
            days = cred.days_left(now)
            if days is not None and days <= self.warn_days:
                soon.append(cred)
                what = f"{cred.kind} {cred.name}" + (f" ({cred.label})" if cred.label else "")
                if days < 0:
                    log.warning(
                        "partner %s: %s expired on %s; remove it, or give the partner a new one",
                        cred.partner,
                        what,
                        cred.not_after.isoformat(),
                    )
                else:
                    log.warning(
                        "partner %s: %s expires on %s (in %.0f days); issue its successor now",
                        cred.partner,
                        what,
                        cred.not_after.isoformat(),
                        days,
                    )
        return soon

    def start(self) -> None:
        threading.Thread(target=self._run, name="b2bgw-expiry", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while True:
            try:
                self.check()
            except Exception:  # never stop warning because of one failure
                log.exception("checking expiries failed")
            if self._stop.wait(CHECK_EVERY):
                return
