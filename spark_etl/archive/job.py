"""The archive job: one batch at a time through the journal's steps (see the
package doc), under the ``archive`` lease, pacing its purges."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from broker_core import Broker
from broker_core.clock import now_ms
from ledger_contract import lifecycle, space
from ledger_contract.retention import PolicyClass, RetentionPolicy
from ledger_contract.tables import FINAL_STATUSES, documents, tombstones, unpack_xml

from .. import state
from .errors import ArchiveBusyError, ArchiveError, ArchiveStoppedError
from .files import _check, _day, _read_back, _remove_files, _sha, _table, _write_file
from .model import ARCHIVE_TABLE, LEASE_NAME, PARTITION, ArchiveResult, Write

log = logging.getLogger(__name__)


#: Test hooks, called with the batch id at each step (a crash test makes one kill the process).
hooks: dict[str, Callable[[int], None]] = {}


def _hook(name: str, batch_id: int) -> None:
    fn = hooks.get(name)
    if fn is not None:
        fn(batch_id)


class _Job:
    def __init__(
        self,
        engine: sa.Engine,
        write: Write,
        policy: RetentionPolicy,
        root: str,
        *,
        wait_for_warehouse: bool,
        now: int | None,
        lease: state.Lease | None,
        vacuum: bool,
        limit: int | None,
        pacer: lifecycle.Pacer | None = None,
        purge_write: Write | None = None,
    ) -> None:
        self.engine, self.write, self.policy, self.root = engine, write, policy, root
        self.purge_write = purge_write or write
        self.wait_for_warehouse = wait_for_warehouse
        self.now = now
        self.lease = lease
        self.do_vacuum = vacuum
        self.limit = limit
        self.pacer = pacer or lifecycle.Pacer(activity=lambda: lifecycle.activity_mark(engine))
        self.should_stop: Callable[[], bool] = lambda: False
        # one batch's purge runs in this thread while the next batch is read, written and verified (the
        # purge mostly waits for the store's writer, and pauses between its transactions)
        self._purger = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="b2bgw-archive-purge")
        self._purging: concurrent.futures.Future[int] | None = None
        self.handled = 0  # documents handed to a purge
        self.result: ArchiveResult | None = None

    def clock(self) -> int:
        """Now (epoch ms), or the time the job was asked to apply the policy at: purges and tombstone
        expiry are counted on the same clock."""
        return self.now if self.now is not None else now_ms()

    def _stop(self) -> bool:
        return (self.lease is not None and self.lease.lost) or self.should_stop()

    def _check_lease(self) -> None:
        if self.should_stop():
            raise ArchiveStoppedError("stopped on request (the gateway is stopping); the next run goes on")
        if self.lease is not None and self.lease.lost:
            raise ArchiveError("the archive lease was lost (expired or taken over); the next run goes on")

    def run(self, owner: str) -> ArchiveResult:
        t0 = time.perf_counter()
        lifecycle.abandon_runs(self.write)
        run_id = lifecycle.start_run(self.write, owner)
        result = self.result = ArchiveResult(run_id, "running")
        try:
            result.recovered = self._recover(run_id)
            now = self.now if self.now is not None else now_ms()
            watermark = lifecycle.warehouse_watermark(self.engine) if self.wait_for_warehouse else None
            if self.wait_for_warehouse and watermark is None:
                watermark = 0
            result.stats["watermark"] = watermark
            for cls in self.policy.classes():
                for status in FINAL_STATUSES:
                    if self.limit is not None and self.handled >= self.limit:
                        break
                    self._class(run_id, cls, status, now - cls.rule.online_ms, watermark)
            self._drain()
            result.tombstones_expired = self._expire(now)
            if self.do_vacuum:
                result.vacuumed_pages = space.vacuum(self.engine, self.purge_write, stop=self._stop)
            result.status = "succeeded"
        except BaseException as exc:
            try:
                self._drain()  # a purge under way ends (or fails) before the run is recorded
            except BaseException:  # the first error is the one to report
                pass
            result.status = "interrupted" if isinstance(exc, ArchiveStoppedError) else "failed"
            result.seconds = time.perf_counter() - t0
            self._record(run_id, f"{type(exc).__name__}: {exc}"[:4000])
            raise
        finally:
            self._purger.shutdown(wait=True)
        result.seconds = time.perf_counter() - t0
        self._record(run_id, None)
        return result

    def _drain(self) -> None:
        """Wait for the purge under way; its error is raised here."""
        pending, self._purging = self._purging, None
        if pending is not None:
            assert self.result is not None
            self.result.purged += pending.result()

    def _purge_later(self, batch_id: int, items: list[tuple[str, int]], archived: bool) -> None:
        """Purge a verified batch in the purge thread, after the one before it."""
        self._drain()
        self.handled += len(items)
        self._purging = self._purger.submit(self._purge, batch_id, items, archived)

    def _record(self, run_id: int, error: str | None) -> None:
        r = self.result
        assert r is not None
        stats = dict(
            r.stats,
            batches=r.batches,
            recovered=r.recovered,
            vacuumed_pages=r.vacuumed_pages,
            seconds=round(r.seconds, 3),
        )
        lifecycle.update_run(
            self.write,
            run_id,
            status=r.status,
            finished_at=now_ms(),
            archived=r.archived,
            purged=r.purged,
            waiting=r.waiting,
            tombstones_expired=r.tombstones_expired,
            bytes=r.bytes,
            error=error,
            stats=stats,
        )

    # ------------------------------------------------------------------ one class of documents

    def _class(self, run_id: int, cls: PolicyClass, status: str, cutoff: int, watermark: int | None) -> None:
        name = f"{status}:{cls.name}"
        cursor = lifecycle.load_cursor(self.engine, name)
        size = self.policy.batch
        result = self.result
        assert result is not None
        while True:
            self._check_lease()
            if self.limit is not None:
                size = min(size, self.limit - self.handled)
                if size <= 0:
                    return
            archiving = cls.rule.after == "archive"
            rows = lifecycle.scan_due(
                self.engine,
                cls,
                status,
                cutoff,
                cursor,
                size,
                lifecycle.ARCHIVE_COLUMNS if archiving else lifecycle.PURGE_COLUMNS,
            )
            if not rows:
                return
            # a purge without archive needs the histories only to wait for the warehouse load
            history = (
                lifecycle.histories(self.engine, [r["message_id"] for r in rows])
                if archiving or watermark is not None
                else {}
            )
            scanned = len(rows)
            blocked = False
            if watermark is not None:
                ready = []
                for row in rows:
                    if any(seq > watermark for seq, _, _ in history[row["message_id"]]):
                        break  # the load has not read it (nor, mostly, those after it): wait for the load
                    ready.append(row)
                if len(ready) < len(rows):
                    blocked = True
                    result.waiting += len(rows) - len(ready)
                    log.info(
                        "%d due documents wait for the warehouse load (its watermark: %d)",
                        len(rows) - len(ready),
                        watermark,
                    )
                rows = ready
                if not rows:
                    return
            if archiving:
                self._archive(run_id, rows, history)
            else:
                self._purge_only(run_id, rows)
            cursor = (rows[-1]["updated_at"], rows[-1]["message_id"])
            lifecycle.save_cursor(self.write, name, cursor)
            if blocked or scanned < size:
                return

    def _archive(self, run_id: int, rows: list[dict[str, Any]], history: dict[str, Any]) -> None:
        result = self.result
        assert result is not None
        archived_at = self.clock()
        by_day: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_day.setdefault(_day(row["received_at"]), []).append(row)
        token = uuid.uuid4().hex[:16]
        files = [
            {"path": f"{ARCHIVE_TABLE}/{PARTITION}={day}/part-{token}.parquet", "rows": len(day_rows)}
            for day, day_rows in sorted(by_day.items())
        ]
        batch_id = lifecycle.new_batch(self.write, run_id, "archive", len(rows), files, "writing")
        expected: dict[str, tuple[str, str | None]] = {}
        originals: dict[str, tuple[bytes, bytes | None]] = {}
        written = 0
        for f, (_, day_rows) in zip(files, sorted(by_day.items()), strict=False):
            table, digests, xml = _table(day_rows, history, batch_id, archived_at)
            expected.update(digests)
            originals.update(xml)
            written += _write_file(table, os.path.join(self.root, f["path"]))
            _hook("file_written", batch_id)
        _hook("written", batch_id)
        lifecycle.set_batch(self.write, batch_id, status="written", bytes=written)
        _hook("before_verify", batch_id)
        read = _read_back(self.root, files, originals, expected)
        del originals
        problems = _check(read, expected)
        if problems:
            _remove_files(self.root, files)
            lifecycle.set_batch(self.write, batch_id, status="abandoned")
            raise ArchiveError(f"batch {batch_id} did not read back as written: {'; '.join(problems[:5])}")
        lifecycle.set_batch(self.write, batch_id, status="verified")
        _hook("verified", batch_id)
        self._purge_later(batch_id, [(mid, v[2]) for mid, v in read.items()], True)
        result.archived += len(rows)
        result.bytes += written
        result.batches += 1

    def _purge_only(self, run_id: int, rows: list[dict[str, Any]]) -> None:
        result = self.result
        assert result is not None
        batch_id = lifecycle.new_batch(self.write, run_id, "purge", len(rows), None, "verified")
        self._purge_later(batch_id, [(r["message_id"], r["updated_at"]) for r in rows], False)
        result.batches += 1

    def _purge(self, batch_id: int, items: list[tuple[str, int]], archived: bool) -> int:
        at = self.clock()
        first = [True]

        def chunk(conn: sa.Connection, part: Any) -> int:
            return lifecycle.purge(conn, part, batch_id, archived, at)

        def stop() -> bool:
            if not first[0]:
                _hook("purging", batch_id)
            first[0] = False
            return self._stop()

        items.sort(key=lambda item: (item[1], item[0]))
        counts = self.pacer.run(self.purge_write, chunk, items, stop)
        self._check_lease()
        purged = self._purged(batch_id)
        lifecycle.set_batch(self.write, batch_id, status="purged", purged=purged, updated_at=at)
        return sum(counts)

    def _purged(self, batch_id: int) -> int:
        with self.engine.connect() as conn:
            n = conn.execute(
                sa.select(sa.func.count()).select_from(tombstones).where(tombstones.c.batch_id == batch_id)
            ).scalar_one()
            conn.rollback()
        return int(n)

    # ------------------------------------------------------------------ recovery and expiry

    def _recover(self, run_id: int) -> int:
        """Finish the batches a crashed run left (see the module docstring); how many."""
        done = 0
        for batch in lifecycle.open_batches(self.engine):
            self._check_lease()
            batch_id, files = batch["batch_id"], batch["files"]
            log.warning(
                "archive batch %s was left %s by run %s; finishing it", batch_id, batch["status"], batch["run_id"]
            )
            if batch["status"] == "writing":
                _remove_files(self.root, files)
                lifecycle.set_batch(self.write, batch_id, status="abandoned")
            elif batch["status"] == "written":
                self._recover_written(batch_id, files)
            elif batch["kind"] == "purge":  # verified: rows of a purge-only batch are not listed anywhere
                lifecycle.set_batch(self.write, batch_id, status="abandoned")
            else:
                read = _read_back(self.root, files)
                self.result.purged += self._purge(batch_id, [(mid, v[2]) for mid, v in read.items()], True)
            done += 1
        return done

    def _recover_written(self, batch_id: int, files: list[dict[str, Any]]) -> None:
        """A batch written but not verified: check it against the ledger rows it was made of (none is purged
        before verification), then purge; remove it if it does not match."""
        try:
            read = _read_back(self.root, files)
        except (ArchiveError, OSError, ValueError) as exc:
            log.warning("archive batch %s cannot be read back (%s); removing it", batch_id, exc)
            _remove_files(self.root, files)
            lifecycle.set_batch(self.write, batch_id, status="abandoned")
            return
        expected: dict[str, tuple[str, str | None]] = {}
        ids = list(read)
        with self.engine.connect() as conn:
            for part in lifecycle.iter_chunks(ids, 900):
                for row in conn.execute(
                    sa.select(
                        documents.c.message_id, documents.c.document, documents.c.reply, documents.c.updated_at
                    ).where(documents.c.message_id.in_(part))
                ):
                    if row.updated_at == read[row.message_id][2]:
                        expected[row.message_id] = (_sha(unpack_xml(row.document)), _sha(unpack_xml(row.reply)))
            conn.rollback()
        problems = _check(read, expected)
        if problems:
            log.warning("archive batch %s does not match the ledger (%s); removing it", batch_id, problems[0])
            _remove_files(self.root, files)
            lifecycle.set_batch(self.write, batch_id, status="abandoned")
            return
        lifecycle.set_batch(self.write, batch_id, status="verified")
        self.result.purged += self._purge(batch_id, [(mid, v[2]) for mid, v in read.items()], True)

    def _expire(self, now: int) -> int:
        if self.policy.tombstones is None:
            return 0
        removed = 0
        before = now - int(self.policy.tombstones * 1000)
        while not self._stop():
            ids = lifecycle.expired_batches(self.engine, before)
            if not ids:
                break
            for batch_id in ids:
                removed += self.write(lambda conn, b=batch_id: lifecycle.expire_tombstones(conn, b))
        return removed


def run(
    policy: RetentionPolicy,
    *,
    engine: sa.Engine,
    write: Write,
    root: str,
    db_url: str | None = None,
    wait_for_warehouse: bool = True,
    now: int | None = None,
    lease: state.Lease | None = None,
    vacuum: bool = True,
    limit: int | None = None,
    pacer: lifecycle.Pacer | None = None,
    stop: Callable[[], bool] | None = None,
    lease_ttl: float = 600.0,
    purge_write: Write | None = None,
) -> ArchiveResult:
    """Run the archive job once (see the module docstring) and return what it did.

    *engine* reads the store; *write* runs a function of a connection in a store transaction and returns
    its result; *purge_write* (default: *write*) the same for the purge's and the vacuum's transactions, which
    need not wait for the disk (``store_writer(broker, durable=False)``): a purge lost to a power cut is
    redone by the next run, whose recovery finds its batch still ``verified`` (:func:`store_writer` makes
    both of the broker's writer, :meth:`broker_core.Broker.write`). *root*: the archive root
    (:func:`archive_root`). *wait_for_warehouse*: only documents the warehouse load has read are due (set it
    when the load is enabled). *now* (epoch ms): the time the policy is applied at. Without *lease* the
    ``archive`` lease is taken here for *lease_ttl* seconds, renewed while the job runs (a crashed run's
    lease expires after that). *limit*: purge at
    most about this many documents. *stop*: asked between steps; true ends the run (:class:`ArchiveStoppedError`,
    recorded as interrupted). Raises :class:`ArchiveError` (run recorded as failed) when a batch does not
    read back as written or the lease is lost, :class:`ArchiveBusyError` when another process runs the job."""
    own = lease is None
    etl_engine = None
    if own:
        if db_url is not None:
            etl_engine = state.open_store(db_url)
        else:  # the store's own engine: the load's writes take the write lock at BEGIN, as the store's do
            etl_engine = engine
            state.upgrade(etl_engine)
        lease = state.Lease(etl_engine, ttl=lease_ttl, name=LEASE_NAME)
        if not lease.acquire():
            raise ArchiveBusyError("another process is running the archive job (the archive lease is held)")
    try:
        job = _Job(
            engine,
            write,
            policy,
            root,
            wait_for_warehouse=wait_for_warehouse,
            now=now,
            lease=lease,
            vacuum=vacuum,
            limit=limit,
            pacer=pacer,
            purge_write=purge_write,
        )
        if stop is not None:
            job.should_stop = stop
        return job.run(lease.owner)
    finally:
        if own:
            lease.release()
            if db_url is not None and etl_engine is not None:
                etl_engine.dispose()


def store_writer(broker: Broker, *, durable: bool = True) -> Write:
    """A :data:`Write` through the broker store's writer (one store transaction per call; its result).
    ``durable=False``: its commits need not wait for the disk (see :meth:`broker_core.Broker.write`)."""

    def write(fn: Callable[[sa.Connection], Any]) -> Any:
        return broker.write(fn, durable=durable)[0]

    return write
