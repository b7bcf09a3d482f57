"""Keeping ledger statuses in step with the broker.

A one-way document is ``accepted`` when its message is stored; what happens next happens inside the broker,
which :meth:`broker_core.Broker.message_status` reports. :class:`Reconciler` asks it, in batches of up to
500, about the documents still ``accepted`` and moves them on: ``gone`` (consumed and acknowledged) to
``delivered``, ``dead_lettered`` to ``dead_lettered``, ``expired`` to ``failed`` (the reason in ``error``);
``pending`` and ``in_flight`` are asked again next time. A ``dead_lettered`` document whose message is back
in its queue (``b2bgw dlq replay``) is ``accepted`` again. Every move is conditional on the status read
(:meth:`gateway.ledger.records.Ledger.transition`), so that the reconciler never overwrites a reply that raced it.
(The broker remembers expired messages for ``expired_retention``: a document still ``accepted`` after that,
with its message gone, reads as delivered.)

It runs in a background thread every ``interval`` seconds, at most ``batches_per_pass`` batches a time (a
backlog nobody consumes is walked through over several passes rather than rescanned whole), under the store
lease ``b2bgw-reconciler``, so that one gateway process of several does the work. ``GET
/v1/documents/{id}`` refreshes a single document the same way (:meth:`Reconciler.refresh`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any

from broker_core import Broker
from gateway.ledger.records import Ledger

__all__ = ["Reconciler", "LEASE_NAME"]

log = logging.getLogger(__name__)

LEASE_NAME = "b2bgw-reconciler"
#: The error recorded on a document whose message expired undelivered.
EXPIRED = "expired: no consumer took the message within the route's time_to_live; it was not delivered"
BATCH = 500


class Reconciler:
    """Moves ledger statuses on from what the broker says (see the module docstring)."""

    def __init__(
        self, broker: Broker, ledger: Ledger, *, interval: float = 2.0, batch: int = BATCH, batches_per_pass: int = 2
    ) -> None:
        self.broker = broker
        self.ledger = ledger
        self.interval = interval
        self.batch = batch
        self.batches_per_pass = batches_per_pass
        self._cursor: tuple[int, str] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        #: documents moved on so far
        self.moved = 0

    # ----------------------------------------------------------------- one pass

    def refresh(self, documents: Iterable[tuple[str, str]]) -> int:
        """Update ``(message_id, status)`` documents from the broker; returns how many moved."""
        docs = list(documents)
        if not docs:
            return 0
        where = self.broker.message_status([mid for mid, _ in docs])
        ledger = self.ledger
        moves: list[tuple[str, str, tuple[str, ...], str | None]] = []
        for message_id, status in docs:
            now = where.get(message_id, "gone")
            if status == "accepted":
                if now == "gone":
                    moves.append((message_id, "delivered", ("accepted",), None))
                elif now == "dead_lettered":
                    moves.append((message_id, "dead_lettered", ("accepted",), None))
                elif now == "expired":
                    moves.append((message_id, "failed", ("accepted",), EXPIRED))
            elif status == "dead_lettered" and now in ("pending", "in_flight"):
                moves.append((message_id, "accepted", ("dead_lettered",), None))
        if not moves:
            return 0
        applied = [0]

        def apply(conn: Any) -> None:
            applied[0] = 0
            for message_id, status, from_statuses, error in moves:
                if ledger.transition(conn, message_id, status, from_statuses=from_statuses, error=error):
                    applied[0] += 1

        self.broker.write(apply)
        with self._lock:
            self.moved += applied[0]
        return applied[0]

    def run_once(self) -> int:
        """One batch of ``accepted`` documents, continuing where the last pass stopped."""
        with self._lock:
            cursor = self._cursor
        rows = self.ledger.in_status(("accepted",), after=cursor, limit=self.batch)
        with self._lock:
            self._cursor = (rows[-1][2], rows[-1][0]) if len(rows) == self.batch else None
        return self.refresh((mid, status) for mid, _, _, status in rows)

    def after_replay(self, message_ids: Sequence[str]) -> int:
        """Put documents whose dead-lettered messages were replayed back to ``accepted``."""
        return self.refresh((mid, "dead_lettered") for mid in message_ids)

    # ----------------------------------------------------------------- background thread

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="b2bgw-reconciler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
        if not self.broker.closed:
            try:
                self.broker.release_lease(LEASE_NAME)
            except Exception:  # it expires anyway
                pass

    def _leader(self) -> bool:
        return self.broker.acquire_lease(LEASE_NAME, max(self.interval * 3, 5.0))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if not self._leader():
                    continue
                for _ in range(self.batches_per_pass):  # bounded work per pass; the cursor goes on next time
                    if self._stop.is_set():
                        break
                    self.run_once()
                    if self._cursor is None:
                        break
            except Exception:  # keep reconciling; say why
                if self._stop.is_set() or self.broker.closed:
                    return
                log.warning("reconciling ledger statuses failed; retrying in %.1f s", self.interval, exc_info=True)
