"""Prometheus metrics of the ledger's retention, read from the store (every gateway process sees the same;
the archive job may have run in any of them, or from ``b2bgw archive run``).

:class:`LifecycleCollector` is a prometheus_client collector: register it on the registry the metrics
endpoint serves (``registry.register(LifecycleCollector(engine))``). It reads the store at most once per
``ttl`` seconds (a scrape in between gets the last reading), a handful of small queries: the last archive
run, the journal's totals, and the oldest online document of each final status (ends of the ledger's
status index, never a scan). The metrics (``b2bgw_archive_*``, ``b2bgw_ledger_tombstones``,
``b2bgw_ledger_oldest_final_age_seconds``) are listed in docs/retention.md.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ledger_contract.tables import FINAL_STATUSES, archive_batches, archive_runs, documents

__all__ = ["LifecycleCollector"]


class LifecycleCollector(Collector):
    """The retention metrics of the store behind *engine* (see the module docstring)."""

    def __init__(self, engine: sa.Engine, *, ttl: float = 15.0) -> None:
        self.engine = engine
        self.ttl = ttl
        self._lock = threading.Lock()
        self._reading: dict[str, Any] | None = None
        self._read_at = 0.0

    def reading(self) -> dict[str, Any]:
        """The figures (read from the store at most once per ``ttl``)."""
        with self._lock:
            if self._reading is None or time.monotonic() - self._read_at >= self.ttl:
                self._reading = self._read()
                self._read_at = time.monotonic()
            return self._reading

    def _read(self) -> dict[str, Any]:
        out: dict[str, Any] = {"last": None, "kinds": {}, "bytes": 0, "unfinished": 0, "tombstones": 0, "oldest": None}
        with self.engine.connect() as conn:
            if not sa.inspect(conn).has_table(archive_runs.name):
                conn.rollback()
                return out
            last = conn.execute(sa.select(archive_runs).order_by(archive_runs.c.run_id.desc()).limit(1)).first()
            out["last"] = dict(last._mapping) if last is not None else None
            for kind, _documents, purged, size in conn.execute(
                sa.select(
                    archive_batches.c.kind,
                    sa.func.sum(archive_batches.c.documents),
                    sa.func.sum(archive_batches.c.purged),
                    sa.func.sum(archive_batches.c.bytes),
                )
                .where(archive_batches.c.status.in_(("purged", "expired")))
                .group_by(archive_batches.c.kind)
            ):
                out["kinds"][kind] = int(purged or 0)
                out["bytes"] += int(size or 0)
            out["unfinished"] = int(
                conn.execute(
                    sa.select(sa.func.count())
                    .select_from(archive_batches)
                    .where(archive_batches.c.status.in_(("writing", "written", "verified")))
                ).scalar_one()
            )
            out["tombstones"] = int(
                conn.execute(
                    sa.select(sa.func.sum(archive_batches.c.purged)).where(archive_batches.c.status == "purged")
                ).scalar()
                or 0
            )
            oldest = None
            for status in FINAL_STATUSES:
                at = conn.execute(
                    sa.select(documents.c.updated_at)
                    .where(documents.c.status == status)
                    .order_by(documents.c.updated_at)
                    .limit(1)
                ).scalar()
                if at is not None and (oldest is None or at < oldest):
                    oldest = int(at)
            out["oldest"] = oldest
            conn.rollback()
        return out

    def collect(self) -> Iterator[Any]:
        r = self.reading()
        last = r["last"]
        success = GaugeMetricFamily("b2bgw_archive_last_run_success", "1 when the last archive run succeeded.")
        stamp = GaugeMetricFamily(
            "b2bgw_archive_last_run_timestamp_seconds", "When the last archive run finished (started, while it runs)."
        )
        duration = GaugeMetricFamily("b2bgw_archive_last_run_duration_seconds", "How long the last archive run took.")
        handled = GaugeMetricFamily(
            "b2bgw_archive_last_run_documents", "Documents the last archive run handled.", labels=["outcome"]
        )
        if last is not None:
            success.add_metric([], 1.0 if last["status"] == "succeeded" else 0.0)
            end = last["finished_at"] or last["started_at"]
            stamp.add_metric([], end / 1000)
            if last["finished_at"]:
                duration.add_metric([], (last["finished_at"] - last["started_at"]) / 1000)
            for outcome in ("archived", "purged", "waiting", "tombstones_expired"):
                handled.add_metric([outcome], float(last[outcome] or 0))
        yield from (success, stamp, duration, handled)
        total = CounterMetricFamily(
            "b2bgw_archive_documents", "Documents archived or purged by every run so far.", labels=["kind"]
        )
        for kind in ("archive", "purge"):
            total.add_metric([kind], float(r["kinds"].get(kind, 0)))
        yield total
        yield CounterMetricFamily("b2bgw_archive_bytes", "Bytes of Parquet the archive has written.", value=r["bytes"])
        yield GaugeMetricFamily(
            "b2bgw_archive_unfinished_batches", "Archive batches a crashed run left.", value=r["unfinished"]
        )
        yield GaugeMetricFamily(
            "b2bgw_ledger_tombstones", "Tombstones of purged documents kept.", value=r["tombstones"]
        )
        oldest = GaugeMetricFamily(
            "b2bgw_ledger_oldest_final_age_seconds", "Age of the oldest document online in a final status."
        )
        if r["oldest"] is not None:
            oldest.add_metric([], max(0.0, time.time() - r["oldest"] / 1000))
        yield oldest
