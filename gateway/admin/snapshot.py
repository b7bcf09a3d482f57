"""The destinations' counters, read from the store at most every ``admin.stats_interval``.

Counting what waits in every queue is a scan of the store's claim index;
with a million messages waiting that is a good fraction of a second. So no
page, API call or ``/metrics`` scrape ever runs it: they read the last
:class:`Snapshot`, which a background thread refreshes every interval while
anyone has looked in the last :data:`IDLE_AFTER` seconds (and not otherwise:
an unwatched gateway spends nothing on it). Only the very first look waits
for a reading. The last :data:`HISTORY` readings are kept for the console's
charts (depth and rates per destination).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from broker_core import Broker, DestinationStats

__all__ = ["Snapshot", "StatsSampler"]

log = logging.getLogger(__name__)

IDLE_AFTER = 120.0
HISTORY = 120


@dataclass
class Snapshot:
    taken_at: float  # epoch s
    took: float  # s the reading took
    destinations: list[DestinationStats]
    etl_last_run: dict[str, Any] | None = None
    by_name: dict[str, DestinationStats] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_name = {d.name: d for d in self.destinations}


class StatsSampler:
    """Keeps the latest :class:`Snapshot` of *broker*'s destinations (see the module docstring)."""

    def __init__(self, broker: Broker, interval: float = 5.0, engine: sa.Engine | None = None) -> None:
        self.broker = broker
        self.interval = interval
        self.engine = engine
        self._snapshot: Snapshot | None = None
        self._history: collections.deque[tuple[float, dict[str, tuple[int, int, int]]]] = collections.deque(
            maxlen=HISTORY
        )
        self._wanted = 0.0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="b2bgw-admin-stats", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def current(self) -> Snapshot:
        """The latest reading (the first call waits for one); keeps the sampler going for a while."""
        idle = time.monotonic() - self._wanted > IDLE_AFTER
        self._wanted = time.monotonic()
        snapshot = self._snapshot
        if snapshot is None:
            with self._lock:
                snapshot = self._snapshot or self._read()
        if idle:
            self._wake.set()
        return snapshot

    def history(self) -> list[tuple[float, dict[str, tuple[int, int, int]]]]:
        """``[(epoch s, {destination: (depth, enqueued, dequeued)})]``, oldest first."""
        return list(self._history)

    def refresh(self) -> Snapshot:
        """Read now (tests, and an operator's action that wants its effect seen at once)."""
        with self._lock:
            return self._read()

    def _read(self) -> Snapshot:
        started = time.perf_counter()
        destinations = self.broker.destinations()
        etl = self._etl_last_run()
        snapshot = Snapshot(time.time(), time.perf_counter() - started, destinations, etl)
        self._snapshot = snapshot
        self._history.append((snapshot.taken_at, {d.name: (d.depth, d.enqueued, d.dequeued) for d in destinations}))
        return snapshot

    def _etl_last_run(self) -> dict[str, Any] | None:
        if self.engine is None:
            return None
        from gateway.admin.queries import etl_runs

        try:
            runs = etl_runs(self.engine, limit=1)
        except sa.exc.SQLAlchemyError:
            return None
        return runs[0] if runs else None

    def _loop(self) -> None:
        while not self._stop.is_set():
            if time.monotonic() - self._wanted > IDLE_AFTER:
                self._wake.wait()  # nobody is looking: sleep until someone does
                self._wake.clear()
                if self._stop.is_set():
                    return
            else:
                self._stop.wait(self.interval)
                if self._stop.is_set():
                    return
            try:
                with self._lock:
                    self._read()
            except Exception:  # the store may be away a moment: keep the last reading
                log.warning("reading the destinations' counters failed", exc_info=True)
