"""The archive's table, the records its job and its readers return, and where it lives."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from ledger_contract.retention import RetentionPolicy

ARCHIVE_TABLE = "archive_document"
PARTITION = "received_date"
LEASE_NAME = "archive"
#: Rows per Parquet row group: what :func:`get` reads to return one document.
ROW_GROUP = 1000

Write = Callable[[Callable[[sa.Connection], Any]], Any]


@dataclass
class ArchiveResult:
    run_id: int
    status: str
    archived: int = 0
    purged: int = 0
    waiting: int = 0
    tombstones_expired: int = 0
    bytes: int = 0
    batches: int = 0
    recovered: int = 0
    vacuumed_pages: int = 0
    seconds: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class ArchivedDocument:
    """One document as the archive holds it (:func:`get`)."""

    message_id: str
    record: dict[str, Any]
    request: bytes
    reply: bytes | None
    history: list[dict[str, Any]]
    archived_at: _dt.datetime
    file: str


def archive_root(policy: RetentionPolicy | None, etl_settings: dict[str, Any] | None) -> str:
    """Where the archive lives: ``ledger.retention.archive``, else the warehouse (``etl.warehouse``)."""
    if policy is not None and policy.archive:
        return policy.archive
    from ..config import DEFAULTS

    return str((etl_settings or {}).get("warehouse") or DEFAULTS["warehouse"])
