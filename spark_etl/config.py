"""Settings of the warehouse load.

They come from the ``etl:`` section of the gateway's YAML configuration
(``config/b2bgw.yaml`` by default, or ``--config FILE``) and the store URL from
its top-level ``store.url`` (default ``sqlite:///var/b2bgw.db``; the
``B2BGW_STORE_URL`` environment variable wins, as in the gateway); ``--db-url``
and the other command-line options override them. Keys of ``etl:``:

``enabled`` (true)
    whether ``b2bgw serve`` schedules the nightly load.
``schedule`` ("0 2 * * *")
    crontab expression (minute hour day month day-of-week) of the nightly run.
``timezone`` ("UTC")
    time zone of the schedule and of naive ``--since`` times.
``misfire_grace_time`` (3600)
    seconds a missed nightly run may still start late (the process was down or
    busy at 02:00); later than that, it is skipped until the next night.
``warehouse`` ("./var/warehouse")
    the warehouse root: a local directory or any Hadoop file system URI
    (``hdfs://...``, ``s3a://...``: the cluster must provide that file system).
``spark_master`` ("local[2]")
    the Spark master; ignored when a SparkSession already exists (``spark-submit``).
``spark_conf`` ({})
    extra Spark settings, e.g. ``{"spark.driver.memory": "2g"}``.
``read_partitions`` (0 = automatic)
    Spark partitions the ledger window is read in (automatic: one per
    ``docs_per_partition`` documents, at least 2 per core, at most 256).
``docs_per_partition`` (5000)
``lock_ttl`` (600)
    seconds the warehouse lock lasts without renewal (renewed every ttl/3).
``arrow_staging`` ("auto")
    ``auto``: with a local master and a warehouse on the local file system,
    the driver reads the window and stages the new fact rows as Parquet with
    Arrow (:mod:`spark_etl.stage`); otherwise the executors read it with the
    Data Source. ``true`` insists on the first, ``false`` forces the second.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_CONFIG_FILE", "DEFAULT_DB_URL", "DEFAULTS", "load_settings", "resolve"]

DEFAULT_CONFIG_FILE = "config/b2bgw.yaml"
DEFAULT_DB_URL = "sqlite:///var/b2bgw.db"

DEFAULTS: dict[str, Any] = {
    "enabled": True,
    "schedule": "0 2 * * *",
    "timezone": "UTC",
    "misfire_grace_time": 3600,
    "warehouse": "./var/warehouse",
    "spark_master": "local[2]",
    "spark_conf": {},
    "read_partitions": 0,
    "docs_per_partition": 5000,
    "lock_ttl": 600,
    "arrow_staging": "auto",
}


def load_settings(path: str | os.PathLike | None = None) -> tuple[dict[str, Any], str]:
    """``(etl settings, store url)`` from the gateway's YAML file; the defaults
    when *path* is None and ``config/b2bgw.yaml`` does not exist. A file given
    explicitly must exist."""
    data: dict[str, Any] = {}
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


def resolve(section: dict[str, Any] | None) -> dict[str, Any]:
    """The defaults overlaid with *section*; unknown keys are refused."""
    settings = copy.deepcopy(DEFAULTS)
    for key, value in (section or {}).items():
        if key not in DEFAULTS:
            raise ValueError(f"unknown etl setting {key!r} (known: {', '.join(sorted(DEFAULTS))})")
        settings[key] = value
    return settings
