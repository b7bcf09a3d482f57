"""The SQL store's life among other processes: heartbeats and shared
statistics, waking on other processes' commits, reclaiming what dead
instances held, and named leases."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

import sqlalchemy as sa

from ..clock import now_ms
from ..sql import split_url
from ._common import _CHANNEL, _IN_FLIGHT
from ._schema import box_depth, consumers, entries, instances, leases, subscriptions, temporaries
from ._wakeups import LocalWakeups
from ._wakeups import supported as _local_wakeups_supported
from ._writer import Batch

log = logging.getLogger(__name__)

#: SQLite: seconds between looks for other processes' commits when they also wake us with datagrams.
SAFETY_POLL_INTERVAL = 0.5


class _Liveness:
    """Part of :class:`SQLStore`: its background threads and what other processes see of it."""

    def _start_local_wakeups(self) -> None:
        """SQLite: the socket other processes of this host wake us on (see ``_wakeups``)."""
        if not self._local_wakeups or not _local_wakeups_supported():
            return
        try:
            self._wakeups = LocalWakeups(self.instance_id)
        except OSError as exc:
            log.info("no wake-up socket (%s); other processes' messages are found by polling", exc)
            return
        self._refresh_peers()
        self._wakeups.announce()
        if not self._poll_interval_set:  # polling is only the safety net now (each look costs CPU)
            self.poll_interval = SAFETY_POLL_INTERVAL

    def _refresh_peers(self) -> None:
        """The other broker processes of this host (from ``b2b_instances``), for the wake-ups."""
        if self._wakeups is None:
            return
        with self.engine.connect() as conn:
            ids = (
                conn.execute(
                    sa.select(instances.c.id).where(
                        instances.c.host == socket.gethostname()[:200], instances.c.id != self.instance_id
                    )
                )
                .scalars()
                .all()
            )
        self._wakeups.set_peers(ids)

    def _housekeeping_loop(self) -> None:
        """Heartbeats go on their own connection, never queued behind the
        writer's batches, so a busy process is not presumed dead."""
        last_reap = time.monotonic()
        engine = self.engine.execution_options(b2b_write=True)
        while not self._stop.wait(self.heartbeat_interval):
            try:
                if self._pg:
                    self._heartbeat(engine)
                else:  # SQLite has one write lock: queue behind the writer rather than starve waiting for it
                    self._write(self._op_heartbeat, wait=False, durable=False)
                if time.monotonic() - last_reap >= max(self.heartbeat_interval, self.lease_timeout / 4):
                    last_reap = time.monotonic()
                    self._write(self._op_reap, wait=False, durable=False)
                self._refresh_peers()
            except Exception:
                if self._closed:
                    return
                log.warning("store heartbeat failed; retrying", exc_info=True)

    def _heartbeat(self, engine: sa.Engine) -> None:
        with engine.begin() as conn:
            done = self._heartbeat_in(conn)
        if done is not None:
            done()

    def _op_heartbeat(self, batch: Batch) -> None:
        done = self._heartbeat_in(batch.conn)
        if done is not None:
            batch.after_commit.append(done)

    def _heartbeat_in(self, conn: sa.Connection) -> Callable[[], None] | None:
        """Refresh our heartbeat; re-register if another process reaped us. Returns what to note once
        the transaction committed (the counts and consumers it shared), if anything."""
        if self._stop.is_set():  # closing: goodbye removes the row, nothing may re-add it
            return None
        now = now_ms()
        updated = conn.execute(
            instances.update().where(instances.c.id == self.instance_id).values(heartbeat=now)
        ).rowcount
        if not updated:
            log.warning(
                "this broker instance (%s) was presumed dead by another process; the messages it held "
                "are being redelivered",
                self.instance_id,
            )
            conn.execute(
                instances.insert(),
                {
                    "id": self.instance_id,
                    "host": socket.gethostname()[:200],
                    "pid": os.getpid(),
                    "started": now,
                    "heartbeat": now,
                },
            )
            self._published_consumers = {}  # the reaper deleted them
        return self._share_stats(conn)

    def _share_stats(self, conn: sa.Connection) -> Callable[[], None] | None:
        """Add this process's new counts to ``b2b_box_counters`` and publish its consumers (if they changed)
        in ``b2b_consumers``, in the heartbeat's transaction; returns what to note once it committed."""
        deltas = self._share_counts(conn)
        counts = self._consumer_counts
        current = {box: n for box, n in (counts() if counts is not None else {}).items() if n > 0}
        changed = current != self._published_consumers
        if changed:
            conn.execute(consumers.delete().where(consumers.c.instance == self.instance_id))
            if current:
                conn.execute(
                    consumers.insert(),
                    [{"instance": self.instance_id, "box": box, "consumers": n} for box, n in sorted(current.items())],
                )
        if not (deltas or changed):
            return None

        def done() -> None:
            if deltas:
                self._counters.shared(deltas)
            if changed:
                self._published_consumers = current

        return done

    def _share_counts(self, conn: sa.Connection) -> dict[str, list[int]]:
        """Add the counts not yet shared to ``b2b_box_counters`` (in the caller's transaction); returns
        them, for :meth:`_Counters.shared` once it committed."""
        deltas = self._counters.unshared()
        if deltas:
            mark = self._sql._mark
            self._sql.run(
                conn,
                (
                    "INSERT INTO b2b_box_counters (box, enqueued, dequeued, expired, dead_lettered, redelivered) "
                    f"VALUES ({mark}, {mark}, {mark}, {mark}, {mark}, {mark}) ON CONFLICT (box) DO UPDATE SET "
                    "enqueued = b2b_box_counters.enqueued + excluded.enqueued, "
                    "dequeued = b2b_box_counters.dequeued + excluded.dequeued, "
                    "expired = b2b_box_counters.expired + excluded.expired, "
                    "dead_lettered = b2b_box_counters.dead_lettered + excluded.dead_lettered, "
                    "redelivered = b2b_box_counters.redelivered + excluded.redelivered"
                ),
                [(box, *delta) for box, delta in sorted(deltas.items())],
                many=True,
            )
        return deltas

    def _share_stats_at_goodbye(self, batch: Batch) -> None:
        deltas = self._share_counts(batch.conn)
        if deltas:
            batch.after_commit.append(lambda: self._counters.shared(deltas))

    def _listen_loop(self) -> None:
        import psycopg

        clean, schema = split_url(self.url)
        dsn = sa.engine.make_url(clean).set(drivername="postgresql").render_as_string(hide_password=False)
        delay = 0.1
        while not self._stop.is_set():
            try:
                with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {_CHANNEL}")
                    delay = 0.1
                    self._available("*")  # we may have missed notifications while away
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.1):
                            self._available(note.payload)
            except Exception as exc:  # reconnect with backoff
                if self._stop.is_set():
                    return
                log.warning("LISTEN connection lost (%s); reconnecting", str(exc).splitlines()[0][:200])
                self._stop.wait(delay)
                delay = min(delay * 2, 2.0)

    def _entry_high_water(self) -> int:
        with self.engine.connect() as conn:
            return conn.exec_driver_sql("SELECT seq FROM sqlite_sequence WHERE name = 'b2b_entries'").scalar() or 0

    def _poll_loop(self, last: int) -> None:
        """SQLite has no LISTEN/NOTIFY: the other processes of this host send
        datagrams naming the boxes they stored messages in (``_wakeups``),
        and every ``poll_interval`` this thread also looks at the highest
        entry id handed out; if other processes added entries (ids this
        process did not reserve), it wakes the consumers of their boxes.
        ``last`` is read at attach, before any consumer can find a box empty."""
        wakeups = self._wakeups
        while not self._stop.wait(0 if wakeups is not None else self.poll_interval):
            try:
                with self.engine.connect() as conn:
                    next_poll = time.monotonic() + self.poll_interval
                    while not self._stop.is_set():
                        wait = next_poll - time.monotonic()
                        if wakeups is not None:
                            for box in wakeups.receive(wait):
                                self._available(box)
                        elif wait > 0 and self._stop.wait(wait):
                            break
                        if time.monotonic() < next_poll:
                            continue
                        next_poll = time.monotonic() + self.poll_interval
                        high = (
                            conn.exec_driver_sql("SELECT seq FROM sqlite_sequence WHERE name = 'b2b_entries'").scalar()
                            or 0
                        )
                        if high > last and self._foreign_ids(last, high):
                            boxes = (
                                conn.exec_driver_sql(
                                    "SELECT DISTINCT box FROM b2b_entries WHERE id > ? AND id <= ?", (last, high)
                                )
                                .scalars()
                                .all()
                            )
                            for box in boxes:
                                self._available(box)
                        conn.rollback()
                        last = max(last, high)
            except Exception:
                if self._stop.is_set():
                    return
                log.warning("polling the SQLite store for changes failed; retrying", exc_info=True)
                self._stop.wait(self.poll_interval)

    def _note_own_ids(self, first: int, last: int) -> None:
        with self._own_ids_lock:
            self._own_ids.append((first, last))

    def _foreign_ids(self, low: int, high: int) -> bool:
        """Whether ids in (low, high] were handed out to another process (or
        to rows this process re-inserted)."""
        with self._own_ids_lock:
            ranges = [(a, b) for a, b in self._own_ids if b > low]
            self._own_ids = ranges
        ours = sum(max(0, min(b, high) - max(a - 1, low)) for a, b in ranges)
        return ours < high - low

    def _op_goodbye(self, batch: Batch) -> None:
        """Clean shutdown: give back in-flight rows at once (no lease wait)."""
        conn = batch.conn
        self._reclaim(batch, self.instance_id)
        conn.execute(instances.delete().where(instances.c.id == self.instance_id))
        self._share_stats_at_goodbye(batch)

    def _op_reap(self, batch: Batch) -> None:
        """Reclaim what dead broker instances held."""
        conn = batch.conn
        cutoff = now_ms() - int(self.lease_timeout * 1000)
        dead = (
            conn.execute(
                sa.select(instances.c.id).where(instances.c.heartbeat < cutoff, instances.c.id != self.instance_id)
            )
            .scalars()
            .all()
        )
        for owner in dead:
            log.warning("broker instance %s stopped sending heartbeats; reclaiming its messages", owner)
            self._reclaim(batch, owner)
            conn.execute(instances.delete().where(instances.c.id == owner))
        # depth deltas of instances that are gone (written in the very transaction that said goodbye)
        for owner in (
            conn.execute(
                sa.select(box_depth.c.instance)
                .where(
                    box_depth.c.instance != "",
                    box_depth.c.instance != self.instance_id,
                    ~box_depth.c.instance.in_(sa.select(instances.c.id)),
                )
                .distinct()
            )
            .scalars()
            .all()
        ):
            self._fold_depth(batch, owner)
        # in-flight rows whose owner is unknown (instance row lost) come back too
        orphans = (
            conn.execute(sa.select(entries.c.id).where(_IN_FLIGHT, ~entries.c.owner.in_(sa.select(instances.c.id))))
            .scalars()
            .all()
        )
        if orphans:
            self._op_release(batch, list(orphans), "the consumer's process died", None)

    def _reclaim(self, batch: Batch, owner: str) -> None:
        conn = batch.conn
        rows = conn.execute(sa.select(entries.c.id).where(entries.c.owner == owner, _IN_FLIGHT)).scalars().all()
        if rows:
            self._op_release(batch, list(rows), "the consumer's process stopped", owner)
        boxes = conn.execute(sa.select(subscriptions.c.box).where(subscriptions.c.owner == owner)).scalars().all()
        temps = conn.execute(sa.select(temporaries.c.name).where(temporaries.c.owner == owner)).scalars().all()
        for box in [*boxes, *temps]:
            self._delete_box_entries(batch, box)
        conn.execute(subscriptions.delete().where(subscriptions.c.owner == owner))
        conn.execute(temporaries.delete().where(temporaries.c.owner == owner))
        conn.execute(consumers.delete().where(consumers.c.instance == owner))
        self._fold_depth(batch, owner)

    def acquire_lease(self, name: str, seconds: float) -> bool:
        """Take or renew the named lease for ``seconds``; False if another
        live owner holds it."""

        def op(batch: Batch) -> bool:
            conn = batch.conn
            now = now_ms()
            row = conn.execute(sa.select(leases).where(leases.c.name == name)).first()
            if row is not None and row.owner != self.instance_id and row.expires > now:
                return False
            values = {"owner": self.instance_id, "expires": now + int(seconds * 1000)}
            if row is None:
                conn.execute(leases.insert(), {"name": name, **values})
            else:
                conn.execute(leases.update().where(leases.c.name == name).values(**values))
            return True

        return self._write(op)

    def release_lease(self, name: str) -> None:
        self._write(
            lambda b: b.conn.execute(leases.delete().where(leases.c.name == name, leases.c.owner == self.instance_id))
        )
