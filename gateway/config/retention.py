"""The ``ledger.retention`` section of the configuration: the gateway's
:class:`~ledger_contract.retention.RetentionPolicy`, checked when the file is
loaded, every error at its ``file:line``::

    ledger:
      retention:
        online: 90d               # every document in a final status, counted from its last status change
        after: archive            # archive (to the warehouse, then purge) or purge
        document_types:           # per document type (the root element's name)
          Invoice: {online: 3650d}
        routes:                   # per route id (wins over its document type)
          orders-request-reply: {online: 30d, after: purge}
        tombstones: 400d          # how long a purged document's tombstone stays (410, replays refused)
        archive: ./var/warehouse  # the archive's root (default: etl.warehouse)
        schedule: "30 3 * * *"    # when the archive job runs (crontab, in ``timezone``)
        timezone: UTC
        batch: 5000               # documents per archive batch (one Parquet file per received date)
        enabled: true             # false: nothing is archived or purged (the policy still shows in db stats)

An entry of ``document_types`` or ``routes`` is a mapping of ``online`` and
``after`` (each defaulting to the section's) or just a duration.

Only documents in a final status (:data:`ledger_contract.tables.FINAL_STATUSES`:
delivered, replied, failed) are ever due, ``online`` after their last status
change; ``accepted`` and ``dead_lettered`` documents stay online whatever
their age (they still have something to happen). ``online`` may not be
shorter than ``exchange.late_reply_window``: a document that can still take a
late reply stays online. Without a ``ledger.retention`` section nothing is
ever archived or purged.
"""

from __future__ import annotations

import zoneinfo
from typing import Any

from gateway.marked import (
    check_keys,
    expect_bool,
    expect_choice,
    expect_int,
    expect_mapping,
    expect_str,
    parse_duration,
)
from ledger_contract.retention import AFTER, DEFAULT_ONLINE, RetentionPolicy, Rule

__all__ = ["parse_retention"]

_DAY = 86400.0
_KEYS = {
    "enabled",
    "online",
    "after",
    "document_types",
    "routes",
    "tombstones",
    "archive",
    "schedule",
    "timezone",
    "batch",
}


def parse_retention(
    section: Any, where: Any, *, late_reply_window: float, route_ids: dict[str, Any]
) -> RetentionPolicy:
    """The :class:`RetentionPolicy` of a marked ``ledger.retention`` mapping; :class:`~gateway.errors.ConfigError`
    at the line of the first wrong value. *route_ids*: the configured routes' ids (a rule for another is a
    mistake)."""
    retention = expect_mapping(section, where, "ledger.retention")
    check_keys(retention, _KEYS, "ledger.retention")

    def online(value: Any, at: Any, what: str) -> float:
        seconds = parse_duration(value, at, what)
        if seconds <= 0:
            raise at.error(f"{what} must be a positive duration such as 90d")
        if seconds < late_reply_window:
            raise at.error(
                f"{what} ({value}) is shorter than exchange.late_reply_window ({late_reply_window:g} s): "
                "a document that can still take a late reply stays online; make it longer"
            )
        return seconds

    default_after = "archive"
    if "after" in retention:
        default_after = expect_choice(retention["after"], retention.at("after"), "ledger.retention.after", AFTER)
    default_online = DEFAULT_ONLINE
    if "online" in retention:
        default_online = online(retention["online"], retention.at("online"), "ledger.retention.online")
    elif DEFAULT_ONLINE < late_reply_window:
        raise retention.where.error(
            "ledger.retention.online (default 90d) is shorter than "
            "exchange.late_reply_window; set ledger.retention.online"
        )
    default = Rule(default_online, default_after)

    def rules(key: str, known: dict[str, Any] | None) -> dict[str, Rule]:
        out: dict[str, Rule] = {}
        if key not in retention:
            return out
        entries = expect_mapping(retention[key], retention.at(key), f"ledger.retention.{key}")
        for name, value in entries.items():
            at = entries.at(name)
            what = f"ledger.retention.{key}.{name}"
            expect_str(name, at, f"a name in ledger.retention.{key}")
            if known is not None and name not in known:
                shown = ", ".join(sorted(known)[:10]) or "none"
                raise at.error(
                    f"ledger.retention.routes names route {name!r}, which is not configured (routes: {shown})"
                )
            if isinstance(value, dict):
                entry = expect_mapping(value, at, what)
                check_keys(entry, {"online", "after"}, what)
                seconds = (
                    online(entry["online"], entry.at("online"), f"{what}.online")
                    if "online" in entry
                    else default.online
                )
                after = (
                    expect_choice(entry["after"], entry.at("after"), f"{what}.after", AFTER)
                    if "after" in entry
                    else default.after
                )
                out[name] = Rule(seconds, after)
            else:
                out[name] = Rule(online(value, at, what), default.after)
        return out

    policy: dict[str, Any] = {
        "default": default,
        "routes": rules("routes", route_ids),
        "document_types": rules("document_types", None),
    }
    if "tombstones" in retention:
        value = retention["tombstones"]
        if value == "forever":
            policy["tombstones"] = None
        else:
            seconds = parse_duration(value, retention.at("tombstones"), "ledger.retention.tombstones")
            if seconds < _DAY:
                raise retention.at("tombstones").error(
                    "ledger.retention.tombstones must be at least 1d (or forever): while a tombstone is kept, a "
                    "replay of the purged document is refused and its partner's GET answers 410"
                )
            policy["tombstones"] = seconds
    if "archive" in retention:
        policy["archive"] = expect_str(retention["archive"], retention.at("archive"), "ledger.retention.archive")
    if "timezone" in retention:
        zone = expect_str(retention["timezone"], retention.at("timezone"), "ledger.retention.timezone")
        try:
            zoneinfo.ZoneInfo(zone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise retention.at("timezone").error(
                f"ledger.retention.timezone {zone!r} is not a time zone; use an IANA name such as UTC or Europe/Paris"
            ) from None
        policy["timezone"] = zone
    if "schedule" in retention:
        schedule = expect_str(retention["schedule"], retention.at("schedule"), "ledger.retention.schedule")
        from apscheduler.triggers.cron import CronTrigger

        try:
            CronTrigger.from_crontab(schedule, timezone=policy.get("timezone", "UTC"))
        except (ValueError, TypeError):
            raise retention.at("schedule").error(
                f"ledger.retention.schedule {schedule!r} is not a crontab expression of five fields (minute hour "
                'day month day-of-week), e.g. "30 3 * * *"'
            ) from None
        policy["schedule"] = schedule
    if "batch" in retention:
        policy["batch"] = expect_int(
            retention["batch"], retention.at("batch"), "ledger.retention.batch", minimum=100, maximum=100_000
        )
    if "enabled" in retention:
        policy["enabled"] = expect_bool(retention["enabled"], retention.at("enabled"), "ledger.retention.enabled")
    return RetentionPolicy(**policy)
