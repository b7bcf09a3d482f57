"""A load's progress: its steps, their timings and Spark jobs (kept in the
run's stats), logged, and shown as a tqdm bar in runs by hand."""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["Steps"]

log = logging.getLogger(__name__)


class Steps:
    """A step-level progress bar (tqdm) for hand runs; silent otherwise."""

    def __init__(self, enabled: bool, total: int = 9) -> None:
        self.bar = None
        self.timings: dict[str, float] = {}
        self.jobs: dict[str, int] = {}
        self._t = time.perf_counter()
        self._tracker = None
        self._group = None
        self._jobs_seen = 0
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="etl", unit="step", leave=True,
                            bar_format="{desc}: {n_fmt}/{total_fmt} steps |{bar}| {elapsed} {postfix}")  # fmt: skip

    def count_jobs(self, spark, group: str) -> None:
        """Count the Spark jobs of each step (the run's jobs carry *group*)."""
        spark.sparkContext.setJobGroup(group, "b2bgw warehouse load")
        self._tracker, self._group = spark.sparkContext.statusTracker(), group

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.timings[name] = round(now - self._t, 3)
        self._t = now
        if self._tracker is not None:
            seen = len(self._tracker.getJobIdsForGroup(self._group))
            self.jobs[name], self._jobs_seen = seen - self._jobs_seen, seen
        log.info("etl: %s (%.2fs, %d Spark jobs)", name, self.timings[name], self.jobs.get(name, 0))
        if self.bar is not None:
            self.bar.set_postfix_str(name)
            self.bar.update(1)

    def docs(self, spark, total: int, done: threading.Event) -> None:
        """While the read stage runs, show documents parsed (from task progress)."""
        if self.bar is None or total <= 0:
            return
        tracker = spark.sparkContext.statusTracker()

        def poll() -> None:
            while not done.wait(0.5):
                stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
                stages = [s for s in stages if s is not None and s.numTasks]
                if stages:
                    s = stages[0]
                    self.bar.set_postfix_str(
                        f"read & parse: ~{total * s.numCompletedTasks // s.numTasks:,}/{total:,} documents"
                    )

        threading.Thread(target=poll, daemon=True).start()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
