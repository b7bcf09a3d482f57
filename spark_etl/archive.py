"""The archive job: documents past their retention leave the ledger for the warehouse's ``archive_document``
table, verified, then purged; and :func:`get` brings one back.

Due are the documents in a final status whose last change is older than their rule's ``online``
(:mod:`ledger_contract.retention`) and, when the warehouse load is on, that it has read (all their ledger
events at or under its watermark): the warehouse never misses a document that left the ledger first.
``archive_document`` (Parquet, partitioned by ``received_date``, one file per batch and date) keeps each
document's ledger record, status history, request and reply XML with their SHA-256, and its ``batch_id``.

One batch at a time, each step recorded in the journal (``b2b_archive_batches``) before the next:
``writing`` (file names recorded, files written under a temporary name, synced, renamed), ``written``
(every file read back: exactly the batch's documents, each XML's SHA-256 the ledger's), ``verified`` (the
documents purged, a few hundred per store transaction paced by :class:`ledger_contract.lifecycle.Pacer`,
each leaving a tombstone), ``purged``. A batch's purge runs in a thread while the next batch is written,
and need not wait for the disk: a purge lost to a power cut is redone, its batch still ``verified``.

The next run first finishes what a dead one left: ``writing`` -> files removed; ``written`` -> verified and
purged, or removed; ``verified`` -> purged again. So no document is purged that is not in a verified file,
and none is in two. Rules with ``after: purge`` skip the files (a batch of kind ``purge``). Then expired
tombstones are dropped and, on SQLite, the freed pages given back (:func:`ledger_contract.space.vacuum`).
One process at a time runs the job, under the ``archive`` lease of ``etl_lock``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import logging
import concurrent.futures
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import sqlalchemy as sa

from broker_core import Broker
from broker_core.clock import now_ms
from ledger_contract import lifecycle, space
from ledger_contract.retention import PolicyClass, RetentionPolicy
from ledger_contract.tables import FINAL_STATUSES, archive_batches, documents, tombstones, unpack_xml

from . import state
from .errors import SparkEtlError

__all__ = ["ARCHIVE_TABLE", "ArchiveBusyError", "ArchiveError", "ArchiveStoppedError", "ArchiveResult", "ArchiveSchedule", "ArchivedDocument", "LEASE_NAME",
           "archive_root", "get", "run", "store_writer", "verify"]

log = logging.getLogger(__name__)

ARCHIVE_TABLE = "archive_document"
PARTITION = "received_date"
LEASE_NAME = "archive"
#: Rows per Parquet row group: what :func:`get` reads to return one document.
ROW_GROUP = 1000

Write = Callable[[Callable[[sa.Connection], Any]], Any]


class ArchiveError(SparkEtlError, RuntimeError):
    """The archive job could not do its work (recorded in ``b2b_archive_runs``; nothing unverified was
    purged): files that do not read back as written, a lost lease, a store error."""


class ArchiveBusyError(ArchiveError):
    """Another process holds the archive lease (it is running the job): nothing was done."""


class ArchiveStoppedError(ArchiveError):
    """The run was asked to stop (the gateway is stopping): it ended between two steps, recorded as
    interrupted; the next run goes on from there."""


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
    from .config import DEFAULTS

    return str((etl_settings or {}).get("warehouse") or DEFAULTS["warehouse"])


# --------------------------------------------------------------------------- the Parquet side


def _schema() -> Any:
    import pyarrow as pa

    ts = pa.timestamp("ms", tz="UTC")
    return pa.schema([
        ("message_id", pa.string()), ("partner", pa.string()), ("doc_type", pa.string()),
        ("doc_namespace", pa.string()), ("doc_id", pa.string()), ("idempotency_key", pa.string()),
        ("correlation_id", pa.string()), ("route", pa.string()), ("destination", pa.string()),
        ("status", pa.string()), ("received_at", ts), ("updated_at", ts), ("archived_at", ts),
        ("digest", pa.string()), ("request_sha256", pa.string()), ("reply_sha256", pa.string()),
        ("request_xml", pa.string()), ("reply_xml", pa.string()), ("reply_type", pa.string()),
        ("receipt", pa.string()), ("error", pa.string()),
        ("history", pa.list_(pa.struct([("seq", pa.int64()), ("status", pa.string()), ("at", ts)]))),
        ("batch_id", pa.int64()),
    ])


_XML_COLUMNS = ("request_xml", "reply_xml")


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


_DAYS: dict[int, str] = {}


def _day(ms: int) -> str:
    """The UTC date of epoch milliseconds, ``YYYY-MM-DD``."""
    day = ms // 86_400_000
    text = _DAYS.get(day)
    if text is None:
        text = _DAYS[day] = _dt.datetime.fromtimestamp(day * 86400, _dt.timezone.utc).strftime("%Y-%m-%d")
    return text


def _table(rows: list[dict[str, Any]], history: dict[str, list[tuple[int, str, int]]], batch_id: int,
           archived_at: int) -> tuple[Any, dict[str, tuple[str, str | None]], dict[str, tuple[bytes, bytes | None]]]:
    """The Arrow table of *rows*, the SHA-256 of each one's request and reply, and those bytes (the
    ledger's), by message id."""
    import pyarrow as pa

    ts = pa.timestamp("ms", tz="UTC")
    requests = [unpack_xml(row["document"]) or b"" for row in rows]
    replies = [unpack_xml(row["reply"]) for row in rows]
    request_sha = [_sha(x) for x in requests]
    reply_sha = [_sha(x) for x in replies]
    ids = [row["message_id"] for row in rows]
    expected = dict(zip(ids, zip(request_sha, reply_sha)))
    originals = dict(zip(ids, zip(requests, replies)))
    offsets, seqs, statuses, ats = [0], [], [], []
    for mid in ids:
        for seq, status, at in history.get(mid, ()):
            seqs.append(seq)
            statuses.append(status)
            ats.append(at)
        offsets.append(len(seqs))
    events = pa.StructArray.from_arrays(
        [pa.array(seqs, pa.int64()), pa.array(statuses, pa.string()), pa.array(ats, pa.int64()).cast(ts)],
        names=["seq", "status", "at"])
    cols: dict[str, Any] = {name: pa.array([row[name] for row in rows], pa.string()) for name in (
        "partner", "doc_type", "doc_namespace", "doc_id", "idempotency_key", "correlation_id", "route",
        "destination", "status", "digest", "reply_type", "receipt", "error")}
    cols["message_id"] = pa.array(ids, pa.string())
    for name in ("received_at", "updated_at"):
        cols[name] = pa.array([row[name] for row in rows], pa.int64()).cast(ts)
    cols["archived_at"] = pa.array([archived_at] * len(rows), pa.int64()).cast(ts)
    cols["request_sha256"] = pa.array(request_sha, pa.string())
    cols["reply_sha256"] = pa.array(reply_sha, pa.string())
    # the ledger's XML is UTF-8: the cast checks it, in C++
    cols["request_xml"] = pa.array(requests, pa.binary()).cast(pa.string())
    cols["reply_xml"] = pa.array(replies, pa.binary()).cast(pa.string())
    cols["history"] = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), events)
    cols["batch_id"] = pa.array([batch_id] * len(rows), pa.int64())
    schema = _schema()
    return pa.Table.from_arrays([cols[f.name] for f in schema], schema=schema), expected, originals


def _write_file(table: Any, path: str) -> int:
    """Write *table* to *path* durably: a temporary name in the same directory (ignored by readers: it
    starts with an underscore), synced, renamed, the directory synced. Its size."""
    import pyarrow.parquet as pq

    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, "_tmp-" + os.path.basename(path))
    other = [n for n in table.column_names if n not in _XML_COLUMNS]
    pq.write_table(table, tmp, compression="zstd", compression_level=3, row_group_size=ROW_GROUP,
                   use_dictionary=[n for n in other if n not in ("message_id", "idempotency_key", "correlation_id",
                                                                   "request_sha256", "reply_sha256", "receipt")],
                   write_statistics=[n for n in other if n != "history"])
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _sync_dir(directory)
    return os.path.getsize(path)


def _sync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - not on a POSIX file system
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _remove_files(root: str, files: list[dict[str, Any]]) -> None:
    for f in files:
        path = os.path.join(root, f["path"])
        for p in (path, os.path.join(os.path.dirname(path), "_tmp-" + os.path.basename(path))):
            try:
                os.remove(p)
            except FileNotFoundError:
                pass


def _read_back(root: str, files: list[dict[str, Any]], originals: dict[str, tuple[bytes, bytes | None]] | None = None,
               expected: dict[str, tuple[str, str | None]] | None = None,
               ) -> dict[str, tuple[str | None, str | None, int, str, str | None]]:
    """``message_id -> (sha of request read back, of reply, updated_at ms, stored request sha, stored reply
    sha)`` of the batch's files; ArchiveError when one is missing or has a message id twice. With the
    *originals* just written (and their *expected* SHA-256), XML read back that is byte for byte the
    original is given the original's SHA-256 without hashing it again (else a value no SHA-256 has)."""
    import pyarrow.parquet as pq

    def sha(mid: str, data: bytes | None, which: int) -> str | None:
        if originals is None or expected is None or mid not in originals:
            return _sha(data)
        return expected[mid][which] if data == originals[mid][which] else "(differs)"

    out: dict[str, tuple[str | None, str | None, int, str, str | None]] = {}
    for f in files:
        path = os.path.join(root, f["path"])
        if not os.path.exists(path):
            raise ArchiveError(f"archive file {path} is missing")
        table = pq.read_table(path, columns=["message_id", "updated_at", "request_xml", "reply_xml",
                                             "request_sha256", "reply_sha256"])
        if table.num_rows != f["rows"]:
            raise ArchiveError(f"archive file {path} holds {table.num_rows} rows, {f['rows']} were written")
        ids = table.column("message_id").to_pylist()
        updated = table.column("updated_at").cast("int64").to_pylist()
        requests = table.column("request_xml").cast("binary").to_pylist()
        replies = table.column("reply_xml").cast("binary").to_pylist()
        stored_req = table.column("request_sha256").to_pylist()
        stored_rep = table.column("reply_sha256").to_pylist()
        for i, mid in enumerate(ids):
            if mid in out:
                raise ArchiveError(f"archive file {path}: message {mid} twice in one batch")
            out[mid] = (sha(mid, requests[i], 0), sha(mid, replies[i], 1), updated[i], stored_req[i], stored_rep[i])
    return out


def _check(read: dict[str, tuple[Any, ...]], expected: dict[str, tuple[str, str | None]]) -> list[str]:
    """What does not match between the files read back and the ledger's digests (empty: all good)."""
    problems = []
    if set(read) != set(expected):
        missing, extra = set(expected) - set(read), set(read) - set(expected)
        problems.append(f"{len(missing)} documents missing from the files, {len(extra)} not of the batch")
    for mid, (req, rep) in expected.items():
        got = read.get(mid)
        if got is None:
            continue
        if got[0] != req or got[3] != req:
            problems.append(f"{mid}: the request XML read back does not have the ledger's SHA-256")
        if got[1] != rep or got[4] != rep:
            problems.append(f"{mid}: the reply XML read back does not have the ledger's SHA-256")
    return problems


# --------------------------------------------------------------------------- the job


#: Test hooks, called with the batch id at each step (a crash test makes one kill the process).
hooks: dict[str, Callable[[int], None]] = {}


def _hook(name: str, batch_id: int) -> None:
    fn = hooks.get(name)
    if fn is not None:
        fn(batch_id)


class _Job:
    def __init__(self, engine: sa.Engine, write: Write, policy: RetentionPolicy, root: str, *,
                 wait_for_warehouse: bool, now: int | None, lease: state.Lease | None, vacuum: bool,
                 limit: int | None, pacer: lifecycle.Pacer | None = None, purge_write: Write | None = None) -> None:
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
            except BaseException:  # noqa: BLE001 - the first error is the one to report
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
        stats = dict(r.stats, batches=r.batches, recovered=r.recovered, vacuumed_pages=r.vacuumed_pages,
                     seconds=round(r.seconds, 3))
        lifecycle.update_run(self.write, run_id, status=r.status, finished_at=now_ms(), archived=r.archived,
                             purged=r.purged, waiting=r.waiting, tombstones_expired=r.tombstones_expired,
                             bytes=r.bytes, error=error, stats=stats)

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
            rows = lifecycle.scan_due(self.engine, cls, status, cutoff, cursor, size,
                                      lifecycle.ARCHIVE_COLUMNS if archiving else lifecycle.PURGE_COLUMNS)
            if not rows:
                return
            # a purge without archive needs the histories only to wait for the warehouse load
            history = (lifecycle.histories(self.engine, [r["message_id"] for r in rows])
                       if archiving or watermark is not None else {})
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
                    log.info("%d due documents wait for the warehouse load (its watermark: %d)",
                             len(rows) - len(ready), watermark)
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
        files = [{"path": f"{ARCHIVE_TABLE}/{PARTITION}={day}/part-{token}.parquet", "rows": len(day_rows)}
                 for day, day_rows in sorted(by_day.items())]
        batch_id = lifecycle.new_batch(self.write, run_id, "archive", len(rows), files, "writing")
        expected: dict[str, tuple[str, str | None]] = {}
        originals: dict[str, tuple[bytes, bytes | None]] = {}
        written = 0
        for f, (day, day_rows) in zip(files, sorted(by_day.items())):
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
            n = conn.execute(sa.select(sa.func.count()).select_from(tombstones)
                             .where(tombstones.c.batch_id == batch_id)).scalar_one()
            conn.rollback()
        return int(n)

    # ------------------------------------------------------------------ recovery and expiry

    def _recover(self, run_id: int) -> int:
        """Finish the batches a crashed run left (see the module docstring); how many."""
        done = 0
        for batch in lifecycle.open_batches(self.engine):
            self._check_lease()
            batch_id, files = batch["batch_id"], batch["files"]
            log.warning("archive batch %s was left %s by run %s; finishing it", batch_id, batch["status"],
                        batch["run_id"])
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
                for row in conn.execute(sa.select(documents.c.message_id, documents.c.document, documents.c.reply,
                                                  documents.c.updated_at).where(documents.c.message_id.in_(part))):
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


def run(policy: RetentionPolicy, *, engine: sa.Engine, write: Write, root: str, db_url: str | None = None,
        wait_for_warehouse: bool = True, now: int | None = None, lease: state.Lease | None = None,
        vacuum: bool = True, limit: int | None = None, pacer: lifecycle.Pacer | None = None,
        stop: Callable[[], bool] | None = None, lease_ttl: float = 600.0,
        purge_write: Write | None = None) -> ArchiveResult:
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
        job = _Job(engine, write, policy, root, wait_for_warehouse=wait_for_warehouse, now=now, lease=lease,
                   vacuum=vacuum, limit=limit, pacer=pacer, purge_write=purge_write)
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


# --------------------------------------------------------------------------- reading the archive back


def _files_of(engine: sa.Engine, batch_id: int) -> list[dict[str, Any]]:
    import json

    with engine.connect() as conn:
        raw = conn.execute(sa.select(archive_batches.c.files).where(archive_batches.c.batch_id == batch_id)).scalar()
        conn.rollback()
    return json.loads(raw) if raw else []


def get(message_id: str, *, root: str, engine: sa.Engine | None = None) -> ArchivedDocument | None:
    """The archived document *message_id* (its ledger record, request and reply XML, status history), or
    None when the archive does not hold it. With *engine* (the gateway's store) its tombstone says which
    file holds it; without (or once the tombstone has expired), every file of the archive is searched."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    candidates: list[str] = []
    if engine is not None:
        with engine.connect() as conn:
            batch = conn.execute(sa.select(tombstones.c.batch_id).where(tombstones.c.message_id == message_id)).scalar()
            conn.rollback()
        if batch is not None:
            candidates = [os.path.join(root, f["path"]) for f in _files_of(engine, int(batch))]
    for path in candidates:
        if not os.path.exists(path):
            continue
        found = _find_in_file(pq.ParquetFile(path), message_id)
        if found is not None:
            return _document(found, path)
    base = os.path.join(root, ARCHIVE_TABLE)
    if not os.path.isdir(base):
        return None
    dataset = ds.dataset(base, format="parquet", partitioning="hive")
    if not dataset.files:
        return None
    table = dataset.to_table(filter=ds.field("message_id") == message_id)
    if table.num_rows == 0:
        return None
    rows = table.to_pylist()
    row = max(rows, key=lambda r: r["archived_at"])
    return _document(row, base)


def _find_in_file(pf: Any, message_id: str) -> dict[str, Any] | None:
    offset = 0
    ids = pf.read(columns=["message_id"]).column("message_id").to_pylist()
    try:
        index = ids.index(message_id)
    except ValueError:
        return None
    for group in range(pf.num_row_groups):
        n = pf.metadata.row_group(group).num_rows
        if index < offset + n:
            return pf.read_row_group(group).slice(index - offset, 1).to_pylist()[0]
        offset += n
    return None  # pragma: no cover - the index is within the file


def _document(row: dict[str, Any], path: str) -> ArchivedDocument:
    request = (row.pop("request_xml") or "").encode("utf-8")
    reply = row.pop("reply_xml")
    history = row.pop("history") or []
    return ArchivedDocument(message_id=row["message_id"], record=row, request=request,
                            reply=reply.encode("utf-8") if reply is not None else None, history=history,
                            archived_at=row["archived_at"], file=path)


def verify(engine: sa.Engine, root: str) -> dict[str, Any]:
    """Check that the archive and the ledger agree: every purged batch's files are there with their rows;
    every tombstone of an archived document is in its batch's files; no tombstoned document is still in the
    ledger; no document is in the archive twice. ``{"ok": bool, "problems": [...], ...counts}``."""
    import json

    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    problems: list[str] = []
    archived_ids: dict[int, set[str]] = {}
    with engine.connect() as conn:
        batches = [dict(r._mapping) for r in conn.execute(
            sa.select(archive_batches).where(archive_batches.c.kind == "archive",
                                             archive_batches.c.status.in_(("purged", "expired"))))]
        for b in batches:
            files = json.loads(b["files"]) if b["files"] else []
            ids: set[str] = set()
            for f in files:
                path = os.path.join(root, f["path"])
                if not os.path.exists(path):
                    problems.append(f"batch {b['batch_id']}: {path} is missing")
                    continue
                ids.update(pq.read_table(path, columns=["message_id"]).column("message_id").to_pylist())
            if len(ids) != b["documents"]:
                problems.append(f"batch {b['batch_id']}: {len(ids)} documents in its files, {b['documents']} recorded")
            archived_ids[b["batch_id"]] = ids
        tomb_rows = conn.execute(sa.select(tombstones.c.message_id, tombstones.c.batch_id, tombstones.c.archived)).all()
        online = conn.execute(sa.select(sa.func.count()).select_from(documents).where(
            documents.c.message_id.in_(sa.select(tombstones.c.message_id)))).scalar_one()
        conn.rollback()
    missing = [r.message_id for r in tomb_rows if r.archived and r.message_id not in archived_ids.get(r.batch_id, set())]
    if missing:
        problems.append(f"{len(missing)} archived tombstones have no row in their batch's files (e.g. {missing[0]})")
    if online:
        problems.append(f"{online} documents are both in the ledger and tombstoned")
    duplicates = 0
    base = os.path.join(root, ARCHIVE_TABLE)
    total = 0
    if os.path.isdir(base):
        dataset = ds.dataset(base, format="parquet", partitioning="hive")
        ids = dataset.to_table(columns=["message_id"]) if dataset.files else None
        total = ids.num_rows if ids is not None else 0
    if total:
        duplicates = total - len(set(ids.column("message_id").to_pylist()))
        if duplicates:
            problems.append(f"{duplicates} documents are in the archive more than once")
    return {"ok": not problems, "problems": problems, "archive_rows": total, "tombstones": len(tomb_rows),
            "batches": len(batches), "duplicates": duplicates}


# --------------------------------------------------------------------------- the schedule


class ArchiveSchedule:
    """The archive job inside ``b2bgw serve``: an APScheduler cron job (``ledger.retention.schedule``); each
    process that fires it tries the ``archive`` lease for that slot, and the one that wins runs it."""

    JOB_ID = "b2bgw-archive"

    def __init__(self, policy: RetentionPolicy, db_url: str, *, engine: sa.Engine, write: Write, root: str,
                 wait_for_warehouse: bool, misfire_grace_time: int = 3600, purge_write: Write | None = None) -> None:
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
        self.scheduler.add_job(self.run_scheduled, trigger=self.trigger, id=self.JOB_ID, name="ledger archive",
                               misfire_grace_time=self.misfire, coalesce=True, max_instances=1,
                               replace_existing=True)
        self.scheduler.start()
        job = self.scheduler.get_job(self.JOB_ID)
        log.info("ledger archive scheduled (%s %s), next at %s", self.policy.schedule, self.policy.timezone,
                 job.next_run_time if job else None)

    def shutdown(self, wait: bool = True) -> None:
        self._stopping.set()  # a run in progress ends at its next step
        if self.scheduler is not None:
            self.scheduler.shutdown(wait=wait)
            self.scheduler = None

    def run_scheduled(self, slot: int | None = None) -> bool:
        """Take the lease for this slot and run the job; False when another process has it. Never raises
        (a failure is recorded in ``b2b_archive_runs`` and logged)."""
        now = _dt.datetime.now(_dt.timezone.utc)
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
                self.last_result = run(self.policy, engine=self.engine, write=self.write, root=self.root,
                                       wait_for_warehouse=self.wait_for_warehouse, lease=lease,
                                       stop=self._stopping.is_set, purge_write=self.purge_write)
                r = self.last_result
                log.info("ledger archive run %s: %d archived, %d purged, %d waiting for the warehouse load, "
                         "%d tombstones expired in %.1f s", r.run_id, r.archived, r.purged, r.waiting,
                         r.tombstones_expired, r.seconds)
            except Exception:
                log.exception("ledger archive of slot %s failed", slot)
            finally:
                lease.release()
            return True
        finally:
            etl_engine.dispose()
