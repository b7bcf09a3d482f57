"""The nightly load inside ``b2bgw serve``: APScheduler 3, cron trigger, lock.

Every gateway process starts a :class:`NightlyLoad`; each one's scheduler
fires at the configured time (``etl.schedule``, default ``0 2 * * *`` in
``etl.timezone``), and each then tries to take the warehouse lock for that
*slot* (the scheduled fire time): the lock is one row of ``etl_lock`` taken
with a conditional UPDATE that only one process can win, and it remembers the
last slot run, so a process whose trigger fires late (within the misfire grace
time) does not run the same night again. The process that wins runs the job
in the scheduler's worker thread; the others log that and do nothing.

Misfires: a run missed because the process was down or busy still starts if
it is at most ``misfire_grace_time`` (default 3600 s) late; several missed runs
are coalesced into one; at most one instance runs at a time in a process.
"""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Callable
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger

from . import config, state

__all__ = ["NightlyLoad"]

log = logging.getLogger(__name__)

JOB_ID = "b2bgw-etl-nightly"


class NightlyLoad:
    """``NightlyLoad(settings, db_url).start()`` ... ``.stop()``.

    *settings* is the ``etl:`` section (missing keys take their defaults).
    *runner* (for tests) replaces :func:`spark_etl.job.run`; it is called as
    ``runner(settings, db_url, lease=lease)`` with the lease already held.
    """

    def __init__(
        self, settings: dict[str, Any] | None, db_url: str, *, runner: Callable[..., Any] | None = None
    ) -> None:
        self.settings = config.resolve(settings or {})
        self.db_url = db_url
        self.runner = runner
        self.scheduler: BackgroundScheduler | None = None
        self.trigger = CronTrigger.from_crontab(self.settings["schedule"], timezone=self.settings["timezone"])
        self.last_result: Any = None

    # ------------------------------------------------------------------ scheduling

    def start(self) -> None:
        if not self.settings.get("enabled", True):
            log.info("the nightly warehouse load is disabled (etl.enabled: false)")
            return
        if self.scheduler is not None:
            return
        self.scheduler = BackgroundScheduler(timezone=self.settings["timezone"])
        self.scheduler.add_job(
            self.run_scheduled,
            trigger=self.trigger,
            id=JOB_ID,
            name="warehouse load",
            misfire_grace_time=int(self.settings["misfire_grace_time"]),
            coalesce=True,
            max_instances=1,
            replace_existing=True,
        )
        self.scheduler.start()
        log.info("nightly warehouse load scheduled (%s %s), next at %s", self.settings["schedule"],
                 self.settings["timezone"], self.next_run_time())  # fmt: skip

    def stop(self, wait: bool = True) -> None:
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=wait)
            self.scheduler = None

    def next_run_time(self) -> _dt.datetime | None:
        if self.scheduler is None:
            return None
        job = self.scheduler.get_job(JOB_ID)
        return job.next_run_time if job else None

    # ------------------------------------------------------------------ one run

    def current_slot(self, now: _dt.datetime | None = None) -> int:
        """The scheduled fire time (epoch ms) of the run starting now: the
        first fire time after ``now - misfire_grace_time``."""
        now = now or _dt.datetime.now(_dt.UTC)
        start = now - _dt.timedelta(seconds=int(self.settings["misfire_grace_time"]))
        fire = self.trigger.get_next_fire_time(None, start)
        if fire is None or fire > now:
            fire = now
        return int(fire.timestamp() * 1000)

    def run_scheduled(self, slot: int | None = None) -> bool:
        """Take the lock for this slot and run the load; False when another
        process holds the lock or already ran the slot. Never raises (the
        failure is recorded in ``etl_runs`` and logged)."""
        slot = self.current_slot() if slot is None else slot
        engine = state.open_store(self.db_url)
        lease = state.Lease(engine, ttl=float(self.settings["lock_ttl"]))
        try:
            if not lease.acquire(slot):
                log.info("warehouse load of slot %s: another gateway process has it", slot)
                return False
            try:
                if self.runner is not None:
                    self.last_result = self.runner(self.settings, self.db_url, lease=lease)
                else:
                    from .job import run

                    self.last_result = run(self.settings, self.db_url, lease=lease)
                log.info("warehouse load of slot %s: %s", slot, getattr(self.last_result, "status", "done"))
            except Exception:
                log.exception("warehouse load of slot %s failed", slot)
            finally:
                lease.release()
            return True
        finally:
            engine.dispose()
