"""Settings of the warehouse load.

They come from the ``etl:`` section of the gateway's YAML configuration
(``-c/--config FILE``, else ``$B2BGW_CONFIG``, else ``config/b2bgw.yaml`` when
present, as for the gateway's other commands) and the store URL from
its top-level ``store.url`` (the ``B2BGW_STORE_URL`` environment variable
wins, as in the gateway); ``--db-url`` and the other command-line options
override them. :data:`DEFAULTS` lists the keys of ``etl:``; the configuration
reference (docs/configuration.md) documents each, with its default and unit.
"""

from __future__ import annotations

import copy
import math
import os
import zoneinfo
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import SparkEtlError

__all__ = [
    "DEFAULT_CONFIG_FILE",
    "DEFAULT_DB_URL",
    "DEFAULTS",
    "EtlSettingError",
    "check_section",
    "load_settings",
    "resolve",
]

DEFAULT_CONFIG_FILE = "config/b2bgw.yaml"
DEFAULT_DB_URL = "sqlite:///var/b2bgw.db"

DEFAULTS: dict[str, Any] = {
    "enabled": True,  # whether `b2bgw serve` schedules the nightly load
    "schedule": "0 2 * * *",  # crontab (minute hour day month day-of-week) of the nightly run
    "timezone": "UTC",  # of the schedule and of naive --since times
    "misfire_grace_time": 3600,  # s a missed nightly run may still start late; later, it waits for the next night
    "warehouse": "./var/warehouse",  # a local directory or a Hadoop file system URI (hdfs://, s3a://)
    "spark_master": "local[2]",  # ignored when a SparkSession already exists (spark-submit)
    "spark_conf": {},  # extra Spark settings, e.g. {"spark.driver.memory": "2g"}
    # Spark partitions the window is read in; 0: one per docs_per_partition documents, 2 per core to 256
    "read_partitions": 0,
    "docs_per_partition": 5000,
    "lock_ttl": 600,  # s the warehouse lock lasts without renewal (renewed every ttl/3)
    # auto: the driver stages the window with Arrow (spark_etl.stage) when the master is local and the
    # warehouse on the local file system, else the executors read it; true insists on Arrow, false never
    "arrow_staging": "auto",
}


def load_settings(path: str | os.PathLike | None = None) -> tuple[dict[str, Any], str]:
    """``(etl settings, store url)`` from the gateway's YAML file: *path*, else
    ``$B2BGW_CONFIG``, else ``config/b2bgw.yaml``; the defaults when none is
    given and ``config/b2bgw.yaml`` does not exist. A file named explicitly
    (argument or variable) must exist."""
    data: dict[str, Any] = {}
    if path is None:
        path = os.environ.get("B2BGW_CONFIG") or None
    if path is None and Path(DEFAULT_CONFIG_FILE).exists():
        path = DEFAULT_CONFIG_FILE
    if path is not None:
        import yaml

        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: the configuration must be a mapping")
    section = data.get("etl") or {}
    if not isinstance(section, dict):
        raise ValueError(f"{path}: 'etl' must be a mapping")
    store = data.get("store") or {}
    url = store.get("url") if isinstance(store, dict) else None
    url = os.environ.get("B2BGW_STORE_URL") or url  # as the gateway does
    return resolve(section), url or DEFAULT_DB_URL


class EtlSettingError(SparkEtlError, ValueError):
    """Raised by :func:`check_section` (and so by :func:`resolve`) for an
    unknown key of the ``etl:`` section or a value it cannot take; ``key``
    names it."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def _number(value: Any, *, minimum: float, whole: bool = False, above: bool = False) -> bool:
    kinds = int if whole else (int, float)
    return (
        isinstance(value, kinds)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > minimum if above else value >= minimum)
    )


def _crontab(value: Any, timezone: Any) -> bool:
    from apscheduler.triggers.cron import CronTrigger

    try:
        CronTrigger.from_crontab(value, timezone=timezone if _timezone(timezone) else "UTC")
    except (ValueError, TypeError):
        return False
    return True


def _timezone(value: Any) -> bool:
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError):
        return False
    return True


#: key -> (the check, what the value must be)
_RULES: dict[str, tuple[Callable[[Any, dict[str, Any]], bool], str]] = {
    "enabled": (lambda v, s: isinstance(v, bool), "true or false"),
    "schedule": (
        lambda v, s: isinstance(v, str) and _crontab(v, s.get("timezone", "UTC")),
        'a crontab expression of five fields (minute hour day month day-of-week), e.g. "0 2 * * *"',
    ),
    "timezone": (lambda v, s: isinstance(v, str) and _timezone(v), "an IANA time zone name, e.g. UTC or Europe/Paris"),
    "misfire_grace_time": (lambda v, s: _number(v, minimum=0, above=True), "a number of seconds over 0"),
    "warehouse": (lambda v, s: isinstance(v, str) and v.strip() != "", "a directory or a Hadoop file system URI"),
    "spark_master": (lambda v, s: isinstance(v, str) and v.strip() != "", "a Spark master URL, e.g. local[2]"),
    "spark_conf": (
        lambda v, s: (
            isinstance(v, dict)
            and all(isinstance(k, str) and isinstance(x, (str, int, float, bool)) for k, x in v.items())
        ),
        "a mapping of Spark settings to values, e.g. {spark.driver.memory: 2g}",
    ),
    "read_partitions": (lambda v, s: _number(v, minimum=0, whole=True), "a whole number, 0 (automatic) or more"),
    "docs_per_partition": (lambda v, s: _number(v, minimum=1, whole=True), "a whole number, 1 or more"),
    "lock_ttl": (lambda v, s: _number(v, minimum=0, above=True), "a number of seconds over 0"),
    "arrow_staging": (
        lambda v, s: isinstance(v, bool) or (isinstance(v, str) and v.lower() in ("auto", "true", "false")),
        "auto, true or false",
    ),
}


def check_section(section: dict[str, Any] | None) -> None:
    """Check the ``etl:`` section's keys and values (no Spark needed); raises :class:`EtlSettingError`."""
    section = section or {}
    for key, value in section.items():
        if key not in _RULES:
            raise EtlSettingError(str(key), f"unknown etl setting {key!r} (known: {', '.join(sorted(DEFAULTS))})")
        check, must = _RULES[key]
        if not check(value, section):
            shown = repr(value)
            raise EtlSettingError(key, f"must be {must}, not {shown if len(shown) <= 80 else shown[:77] + '...'}")


def resolve(section: dict[str, Any] | None) -> dict[str, Any]:
    """The defaults overlaid with *section*, checked (:func:`check_section`)."""
    check_section(section)
    settings = copy.deepcopy(DEFAULTS)
    settings.update(section or {})
    return settings
