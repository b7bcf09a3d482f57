"""The archive job on a schedule, inside the gateway (``ledger.retention``'s
``schedule``)."""

from __future__ import annotations

import datetime as _dt
import logging
import threading
from typing import Any

import sqlalchemy as sa

from ledger_contract.retention import RetentionPolicy

from .. import state
from .job import run
from .model import LEASE_NAME, ArchiveResult, Write

log = logging.getLogger(__name__)


class ArchiveSchedule:
    """The archive job inside ``b2bgw serve``: an APScheduler cron job (``ledger.retention.schedule``); each
    process that fires it tries the ``archive`` lease for that slot, and the one that wins runs it."""

    JOB_ID = "b2bgw-archive"

    def __init__(
        self,
        policy: RetentionPolicy,
        db_url: str,
        *,
        engine: sa.Engine,
        write: Write,
        root: str,
        wait_for_warehouse: bool,
        misfire_grace_time: int = 3600,
        purge_write: Write | None = None,
    ) -> None:
        from apscheduler.triggers.cron import CronTrigger

        self.policy, self.db_url, self.engine, self.write, self.root = policy, db_url, engine, write, root
        self.wait_for_warehouse = wait_for_warehouse
        self.purge_write = purge_write
        self.misfire = misfire_grace_time
        self.trigger = CronTrigger.from_crontab(policy.schedule, timezone=policy.timezone)
        self.scheduler: Any = None
        self.last_result: ArchiveResult | None = None
        self._stopping = threading.Event()

    def start(self) -> None:
        from apscheduler.schedulers.background import BackgroundScheduler

        if self.scheduler is not None or not self.policy.enabled:
            return
        self.scheduler = BackgroundScheduler(timezone=self.policy.timezone)
        self.scheduler.add_job(
            self.run_scheduled,
            trigger=self.trigger,
            id=self.JOB_ID,
            name="ledger archive",
            misfire_grace_time=self.misfire,
            coalesce=True,
            max_instances=1,
            replace_existing=True,
        )
        self.scheduler.start()
        job = self.scheduler.get_job(self.JOB_ID)
        log.info(
            "ledger archive scheduled (%s %s), next at %s",
            self.policy.schedule,
            self.policy.timezone,
            job.next_run_time if job else None,
        )

    def stop(self, wait: bool = True) -> None:
        self._stopping.set()  # a run in progress ends at its next step
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=wait)
            self.scheduler = None

    def run_scheduled(self, slot: int | None = None) -> bool:
        """Take the lease for this slot and run the job; False when another process has it. Never raises
        (a failure is recorded in ``b2b_archive_runs`` and logged)."""
        now = _dt.datetime.now(_dt.UTC)
        if slot is None:
            fire = self.trigger.get_next_fire_time(None, now - _dt.timedelta(seconds=self.misfire))
            slot = int(min(fire or now, now).timestamp() * 1000)
        etl_engine = state.open_store(self.db_url)
        lease = state.Lease(etl_engine, ttl=600.0, name=LEASE_NAME)
        try:
            if not lease.acquire(slot):
                log.info("ledger archive of slot %s: another gateway process has it", slot)
                return False
            try:
                self.last_result = run(
                    self.policy,
                    engine=self.engine,
                    write=self.write,
                    root=self.root,
                    wait_for_warehouse=self.wait_for_warehouse,
                    lease=lease,
                    stop=self._stopping.is_set,
                    purge_write=self.purge_write,
                )
                r = self.last_result
                log.info(
                    "ledger archive run %s: %d archived, %d purged, %d waiting for the warehouse load, "
                    "%d tombstones expired in %.1f s",
                    r.run_id,
                    r.archived,
                    r.purged,
                    r.waiting,
                    r.tombstones_expired,
                    r.seconds,
                )
            except Exception:
                log.exception("ledger archive of slot %s failed", slot)
            finally:
                lease.release()
            return True
        finally:
            etl_engine.dispose()
