"""The SQL store: persistent delivery on SQLite or PostgreSQL.

PERSISTENT messages live in the ``b2b_entries`` table; NON_PERSISTENT ones
never touch the database: they stay in an embedded :class:`MemoryStore` (so
they reach consumers of this process only, except replies to another
process's temporary queue, which must cross through the database). Every
reader draws from both tiers.

All writes go through one :class:`GroupCommitter` per process. A send returns
once its transaction committed (SQLite WAL with ``synchronous=FULL`` by
default). Claims mark rows in flight under this broker instance's id (a
consumer of this process waiting on an empty box gets new rows inserted
already claimed for it, without a claim of its own); a
process that dies stops its heartbeat, and any other instance (or its own
successor) puts its in-flight rows back, counted as delivered once more, so
they come back with ``jms_redelivered``. Acknowledging deletes rows.

Several processes on one database are one broker: competing claims use
``FOR UPDATE SKIP LOCKED`` on PostgreSQL (SQLite serialises writers), new
messages wake consumers of other processes through ``LISTEN/NOTIFY`` on
PostgreSQL and ``PRAGMA data_version`` polling on SQLite.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import itertools
import logging
import os
import socket
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

import lz4.frame
import sqlalchemy as sa

from .._destinations import Destination
from .._envelope import NON_PERSISTENT, Envelope
from .._errors import (
    LeaseExpiredError,
    StoreError,
    StoreUnavailableError,
    TransactionRolledBackError,
)
from .._memory import MemoryStore
from .._options import check_store_options
from .._store import (
    Delivery,
    DestinationStats,
    Reader,
    RedeliveryPolicy,
    Store,
    StoredMessage,
    Subscription,
    dead_letter_envelope,
    expired_envelope,
    now_ms,
)
from ..sql import (
    MIGRATIONS,
    PG_WRITE_LOCK,
    VERSION_TABLE,
    current_revision,
    head_revision,
    make_engine,
    migrate,
    split_url,
    upgrade_database,
)
from . import _codec
from ._schema import (
    box_counters,
    box_depth,
    consumers,
    entries,
    instances,
    leases,
    messages,
    subscriptions,
    temporaries,
)
from ._schema import expired as expired_table
from ._engine import _WriteTurn
from ._reader import _SQLReader
from ._statements import _Statements
from ._wakeups import LocalWakeups
from ._wakeups import supported as _local_wakeups_supported
from ._writer import Batch, GroupCommitter

__all__ = ["SQLStore", "make_engine", "upgrade_database"]

log = logging.getLogger("broker_core.sql")

_CHANNEL = "b2b_available"
#: SQLite: seconds between looks for other processes' commits when they also wake us with datagrams.
SAFETY_POLL_INTERVAL = 0.5
#: SQLite: seconds between WAL checkpoints, which the writer runs after its transactions, outside the write turn.
CHECKPOINT_INTERVAL = 0.1
#: SQLite: a WAL longer than this many bytes is checkpointed inside the write turn, where no other process can
#: append meanwhile, so it is copied back whole and restarts (a checkpoint that other processes' appends keep
#: outrunning would let it grow); the connection's own automatic checkpoint is the last resort, at twice that.
WAL_LIMIT_BYTES = 64 << 20
_MESSAGE_COLS = [messages.c[name] for name in _codec.MESSAGE_COLUMNS]
#: What a claim returns of each entry.
_CLAIMED = [entries.c.id, entries.c.box, entries.c.delivery_count, entries.c.seq, entries.c.priority,
            entries.c.expiration, entries.c.message]
#: A claimed entry (the columns of ``_CLAIMED``, in order).
_Claimed = collections.namedtuple("_Claimed", "id box delivery_count seq priority expiration message")
#: Entry columns copied when an entry is put back under a new id.
_COPY_COLS = [entries.c.box, entries.c.seq, entries.c.priority, entries.c.expiration, entries.c.message]
_JOINED = entries.join(messages, entries.c.message == messages.c.id)
#: The conditions of the partial indexes (migration 0004), spelled as literals
#: so that the planners can use them (a bound parameter implies nothing).
_WAITING = sa.text("b2b_entries.state = 0")
_IN_FLIGHT = sa.text("b2b_entries.state = 1")
_EXPIRING = sa.text("b2b_entries.expiration > 0")


def _body_size(env: Envelope) -> int:
    body = env.body
    size = len(body) if isinstance(body, (str, bytes)) else 256
    return size if env.encoded is None else size + len(env.encoded)  # the bytes it came with count too


#: How long the writer waits for more operations under a stream of asynchronous sends (s); see GroupCommitter.
COMMIT_DELAY = 0.0005


class _Counters:
    """In-process counters per box: enqueued, dequeued, expired, dead-lettered, redelivered; and how much
    of them was added to the shared ``b2b_box_counters`` already (:meth:`unshared`, :meth:`shared`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_box: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0, 0])
        self._shared: dict[str, list[int]] = {}

    def add(self, box: str, index: int, n: int = 1) -> None:
        with self._lock:
            self._by_box[box][index] += n

    def get(self, box: str) -> list[int]:
        """What this process counted and has not added to the shared table yet."""
        with self._lock:
            counted = self._by_box.get(box, (0, 0, 0, 0, 0))
            shared = self._shared.get(box, (0, 0, 0, 0, 0))
            return [a - b for a, b in zip(counted, shared)]

    def boxes(self) -> list[str]:
        with self._lock:
            return list(self._by_box)

    def unshared(self) -> dict[str, list[int]]:
        """``{box: [count, ...]}``: the counts of shared boxes not yet in the shared table."""
        with self._lock:
            out = {}
            for box, counted in self._by_box.items():
                if not _shared_box(box):
                    continue
                shared = self._shared.get(box, (0, 0, 0, 0, 0))
                delta = [a - b for a, b in zip(counted, shared)]
                if any(delta):
                    out[box] = delta
            return out

    def shared(self, deltas: dict[str, list[int]]) -> None:
        """Note that *deltas* (from :meth:`unshared`) are in the shared table now."""
        with self._lock:
            for box, delta in deltas.items():
                shared = self._shared.setdefault(box, [0, 0, 0, 0, 0])
                for i, n in enumerate(delta):
                    shared[i] += n


def _shared_box(box: str) -> bool:
    """Whether a box's counters go to the shared table: not those of temporary destinations and
    non-durable subscriptions, which come and go with their connections (their counts stay in-process)."""
    return not box.startswith(("temp-", "subscriber://"))


ENQ, DEQ, EXP, DLQ, RED = range(5)


class SQLStore(Store):
    """Persistent store on SQLAlchemy 2 (``sqlite:///path`` or
    ``postgresql+psycopg://user@host/db``).

    Options: ``sqlite_synchronous`` (``"FULL"`` default; ``"NORMAL"`` is
    faster and still survives a killed process, but a power cut or OS crash may
    lose the last commits); ``prefetch`` (at most this many rows a consumer claims at once, 64; it starts
    at 1 and doubles while the box stays full);
    ``heartbeat_interval`` (s, 1.0) and ``lease_timeout`` (s, 10.0): how soon
    the in-flight messages of a dead process come back; ``retry_for`` (s, 30):
    how long writes are retried through a database outage before
    :class:`StoreUnavailableError`; ``auto_upgrade`` (migrate at open: default
    on for SQLite; PostgreSQL needs ``b2bgw db upgrade``); ``poll_interval``
    (s): how often SQLite checks for other processes' commits (0.5 where the
    processes of a host wake each other with datagrams, Linux; else 0.02);
    ``local_wakeups`` (True): SQLite processes of one host wake each other
    with datagrams (off: polling alone, e.g. processes in separate network
    namespaces that share a file);
    ``expired_retention`` (s, 7 days): how long ``message_status`` can still
    say a message expired (then "gone"); ``commit_delay`` (s, 0.0005): while
    asynchronous sends and commits stream in, the writer waits up to this
    long before each transaction so that it carries more of them (0: never
    waits; a synchronous ``send()`` never waits for it, nor a stream that
    pauses for a quarter of it); ``compress_over`` (bytes,
    2048): bodies at least this long are stored LZ4-compressed when that
    saves space (0: never; see ``_codec``); ``slow_commit_warning`` (s,
    0.5): a transaction that takes longer is logged as a warning saying
    where the time went, mostly the disk's sync (0: never; see
    ``GroupCommitter``).
    """

    shared = True

    def __init__(self, url: str, **options: Any) -> None:
        options = check_store_options(url, options)  # names and values: the conversions below cannot fail
        self.url = url
        self.prefetch = int(options.get("prefetch", 64))
        self.heartbeat_interval = float(options.get("heartbeat_interval", 1.0))
        self.lease_timeout = float(options.get("lease_timeout", 10.0))
        self.poll_interval = float(options.get("poll_interval", 0.02))
        self._poll_interval_set = "poll_interval" in options
        self._local_wakeups = options.get("local_wakeups", True)
        self.expired_retention = float(options.get("expired_retention", 7 * 86400))
        self._retry_for = float(options.get("retry_for", 30.0))
        self._commit_delay = float(options.get("commit_delay", COMMIT_DELAY))
        self._slow_commit = float(options.get("slow_commit_warning", 0.5))
        self._compress_over = options.get("compress_over", _codec.COMPRESS_OVER)
        self._sqlite_sync = options.get("sqlite_synchronous", "FULL")
        self._sqlite_mode = self._sqlite_sync  # what the writer connection is set to now
        self._writer_raw: Any = None  # the writer's driver connection, once set up (SQLite)
        self._checkpoint_due = 0.0
        self.engine = make_engine(url, sqlite_synchronous=self._sqlite_sync,
                                  pool_size=int(options.get("pool_size", 5)))
        self.dialect = self.engine.dialect.name
        self._pg = self.dialect == "postgresql"
        self._sql = _Statements(self._pg, self.engine.dialect.dbapi.Error)
        auto_upgrade = options.get("auto_upgrade", not self._pg)
        try:
            if auto_upgrade:
                self._upgrade_in_turn(url)
            else:
                current, head = current_revision(self.engine, VERSION_TABLE), head_revision(MIGRATIONS)
                if current != head:
                    raise StoreError(
                        f"the database schema is at revision {current or 'none'}, the broker needs {head}: "
                        f"run `b2bgw db upgrade --url {self.engine.url.render_as_string(hide_password=True)}` first"
                    )
        except sa.exc.OperationalError as exc:
            self.engine.dispose()
            shown = self.engine.url.render_as_string(hide_password=True)  # the message reaches logs and terminals
            raise StoreUnavailableError(f"cannot open the store at {shown}: {str(exc).splitlines()[0]}") from exc
        self.instance_id = f"{socket.gethostname()[:40]}-{os.getpid()}-{os.urandom(4).hex()}"
        self._mem = MemoryStore()
        self._counters = _Counters()
        self._tick = itertools.count(1)
        self._versions: dict[str, int] = {}  # box -> tick of its last "messages may be available"
        self._all_version = 0  # tick of the last "anything may have changed" (another process)
        self._next_ready: dict[str, int] = {}
        self._local_temps: set[Destination] = set()
        self._remote_temps: dict[Destination, float] = {}
        self._seq_lock = threading.Lock()
        self._last_seq = 0
        self._own_ids_lock = threading.Lock()
        self._own_ids: list[tuple[int, int]] = []  # entry id ranges this process reserved (SQLite poller)
        self._later_lock = threading.Lock()
        self._later: list[Delivery] = []  # acknowledgements not waited for
        self._later_queued = False
        self._closed = False
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._writer: GroupCommitter | None = None
        self._writer_thread: int | None = None
        self._completion_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._completion_lock = threading.Lock()
        self._selectors: dict[str | None, Any] = {}
        self._readers_lock = threading.Lock()
        self._waiting_boxes: dict[str, list[_SQLReader]] = {}  # the open readers (consumers) of each box
        # Envelopes this process stored lately for a box it has a consumer of, by message row id (writer
        # thread only): a claim of one of them needs no read-back of its row nor decoding of its body.
        # Bounded by count and body size.
        self._recent: collections.OrderedDict[int, Envelope] = collections.OrderedDict()
        self._recent_bytes = 0
        self._wakeups: LocalWakeups | None = None  # SQLite: datagrams to the other processes of the host
        self._consumer_counts: Callable[[], dict[str, int]] | None = None  # the broker's, per box
        self._published_consumers: dict[str, int] = {}  # what b2b_consumers holds of this instance
        self._commit_observer: Callable[[float, int], None] | None = None

    def _upgrade_in_turn(self, url: str) -> None:
        """Migrate at open; on SQLite holding the processes' write turn (a file lock), so processes that
        open a new database together create it one after the other (switching a database being created
        to WAL can fail at once with "database is locked", without waiting for the busy timeout)."""
        turn = None if self._pg else _WriteTurn.for_url(url)
        if turn is None:
            migrate(self.engine, MIGRATIONS, VERSION_TABLE)
            return
        try:
            with turn:
                migrate(self.engine, MIGRATIONS, VERSION_TABLE)
        finally:
            turn.close()

    # ------------------------------------------------------------ lifecycle

    def attach(self, policy: RedeliveryPolicy, on_available: Callable[[str], None],
               xpath_namespaces: dict[str, str] | None = None) -> None:
        super().attach(policy, self._available, xpath_namespaces)
        self._broker_wake = on_available
        self._mem.attach(policy, on_available, xpath_namespaces)
        self._turn = None if self._pg else _WriteTurn.for_url(self.url)
        turn = self._turn
        self._writer = GroupCommitter(
            self.engine.execution_options(b2b_write=True) if not self._pg else self.engine,
            begin=self._begin,
            serialize=(lambda: turn) if turn is not None else None,
            after_turn=self._checkpoint if not self._pg else None,
            was_committed=self._was_committed if self._pg else None,
            before_commit=self._before_commit,
            commit_delay=self._commit_delay,
            slow_commit=self._slow_commit,
            on_touched=self._touched,
            retry_for=self._retry_for,
        )
        self._writer.on_commit = self._commit_observer
        #: the writer's thread: completion callbacks run there, and a write it asked for would wait for itself
        self._writer_thread = self._writer._thread.ident
        now = now_ms()
        self._write(lambda b: b.conn.execute(instances.insert(), {
            "id": self.instance_id, "host": socket.gethostname()[:200], "pid": os.getpid(),
            "started": now, "heartbeat": now}))
        self._write(self._op_reap)
        self._spawn(self._housekeeping_loop, "b2b-sql-heartbeat")
        if self._pg:
            self._spawn(self._listen_loop, "b2b-sql-wakeups")
        else:
            high_water = self._entry_high_water()
            self._start_local_wakeups()
            self._spawn(lambda: self._poll_loop(high_water), "b2b-sql-wakeups")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def close(self) -> None:
        if self._closed:
            return
        self._stop.set()
        for thread in self._threads[:1]:  # housekeeping: no heartbeat may re-register us after goodbye
            thread.join(timeout=5)
        self._closed = True
        if self._writer is not None:
            try:
                self._writer.submit(self._op_goodbye)
            except StoreError:
                log.warning("could not deregister broker instance %s; its lease will expire", self.instance_id)
            self._writer.close()
        if self._completion_pool is not None:
            self._completion_pool.shutdown(wait=True)
        for thread in self._threads:
            thread.join(timeout=5)
        self._mem.close()
        if self._wakeups is not None:
            self._wakeups.close()
        self.engine.dispose()
        if getattr(self, "_turn", None) is not None:
            self._turn.close()

    def _begin(self, conn: sa.Connection, durable: bool) -> None:
        """Start a writer transaction; a non-durable one does not wait for the
        disk at commit (claims and bookkeeping: see GroupCommitter.submit)."""
        if self._pg:
            if not durable:
                conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
            return
        raw = conn.connection.dbapi_connection
        if raw is not self._writer_raw:  # a new connection (at start, after a lost one): as make_engine set it
            self._writer_raw, self._sqlite_mode = raw, self._sqlite_sync
            self._page_size = raw.execute("PRAGMA page_size").fetchone()[0]
            # checkpoints run after the turn (_checkpoint); this one only if those fell far behind
            raw.execute(f"PRAGMA wal_autocheckpoint={2 * WAL_LIMIT_BYTES // self._page_size}")
        mode = self._sqlite_sync if durable else "NORMAL"
        if mode != self._sqlite_mode:  # outside any transaction, on the raw connection
            raw.execute(f"PRAGMA synchronous={mode}")
            self._sqlite_mode = mode
        # the writer then opens the transaction: BEGIN IMMEDIATE (see make_engine)

    def _checkpoint(self, conn: sa.Connection) -> None:
        """SQLite, in the writer thread after a transaction, once its callers are answered: copy the WAL
        back into the database every CHECKPOINT_INTERVAL. SQLite's automatic checkpoint would run inside
        a commit, while this process holds the write turn (the other processes' writers waiting on the
        copy and its fsync: about 5 us of every 2 KB message's 20-25 us of SQLite work, measured); a
        PASSIVE checkpoint here lets them write meanwhile. A WAL grown past WAL_LIMIT_BYTES is
        checkpointed inside the turn, where it is copied whole and then restarts."""
        now = time.monotonic()
        if now < self._checkpoint_due:
            return
        self._checkpoint_due = now + CHECKPOINT_INTERVAL
        raw = conn.connection.dbapi_connection
        _, frames, copied = raw.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        if frames * self._page_size > WAL_LIMIT_BYTES and copied < frames:
            with self._turn if self._turn is not None else contextlib.nullcontext():
                raw.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def _ordered(self, batch: Batch) -> None:
        """Before inserting rows whose ids (or seqs) readers follow in order:
        entries, and whatever code run inside a commit writes (the gateway's
        ledger events). On PostgreSQL such transactions take one advisory
        lock, so ids grow in commit order across processes; claims and
        acknowledgements do not need it and never wait for it."""
        if self._pg and not batch.ordered:
            self._sql.run(batch.conn, "SELECT pg_advisory_xact_lock(%s)", (PG_WRITE_LOCK,))
            batch.ordered = True

    def _touched(self, boxes: set[str]) -> None:
        for box in boxes:
            self._available(box)
        if self._wakeups is not None and boxes:
            self._wakeups.boxes_available(boxes)

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
        if not self._poll_interval_set:  # polling is only the safety net now (25 ms of CPU a second at 20 ms)
            self.poll_interval = SAFETY_POLL_INTERVAL

    def _refresh_peers(self) -> None:
        """The other broker processes of this host (from ``b2b_instances``), for the wake-ups."""
        if self._wakeups is None:
            return
        with self.engine.connect() as conn:
            ids = conn.execute(sa.select(instances.c.id).where(instances.c.host == socket.gethostname()[:200],
                                                                instances.c.id != self.instance_id)).scalars().all()
        self._wakeups.set_peers(ids)

    def _available(self, box: str) -> None:
        if box == "*":
            self._all_version = next(self._tick)
            self._next_ready.clear()
        else:
            self._versions[box] = next(self._tick)
        self._broker_wake(box)

    def _version(self, box: str) -> int:
        """Changes whenever messages may have become available in ``box``."""
        return max(self._versions.get(box, 0), self._all_version)

    def _write(self, fn: Callable[[Batch], Any], wait: bool = True,
               callback: Callable[[Any, BaseException | None], None] | None = None, durable: bool = True) -> Any:
        if self._closed or self._writer is None:
            raise StoreError("the store is closed")
        return self._writer.submit(fn, wait, callback, durable)

    def _next_seqs(self, n: int) -> int:
        """The first of ``n`` consecutive FIFO sequence numbers (microseconds
        since the epoch, so they keep growing across restarts)."""
        with self._seq_lock:
            seq = time.time_ns() // 1000
            if seq <= self._last_seq:
                seq = self._last_seq + 1
            self._last_seq = seq + n - 1
        return seq

    def _selector(self, text: str | None) -> Any:
        try:
            return self._selectors[text]
        except KeyError:
            from .._selector import compile_selector

            compiled = compile_selector(text, xpath_namespaces=self._xpath_namespaces)
            if len(self._selectors) < 1000:
                self._selectors[text] = compiled
            return compiled

    # ------------------------------------------------------------ background threads

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
            log.warning("this broker instance (%s) was presumed dead by another process; the messages it held "
                        "are being redelivered", self.instance_id)
            conn.execute(instances.insert(), {"id": self.instance_id, "host": socket.gethostname()[:200],
                                              "pid": os.getpid(), "started": now, "heartbeat": now})
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
                conn.execute(consumers.insert(), [{"instance": self.instance_id, "box": box, "consumers": n}
                                                  for box, n in sorted(current.items())])
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
            self._sql.run(conn, (
                "INSERT INTO b2b_box_counters (box, enqueued, dequeued, expired, dead_lettered, redelivered) "
                f"VALUES ({mark}, {mark}, {mark}, {mark}, {mark}, {mark}) ON CONFLICT (box) DO UPDATE SET "
                "enqueued = b2b_box_counters.enqueued + excluded.enqueued, "
                "dequeued = b2b_box_counters.dequeued + excluded.dequeued, "
                "expired = b2b_box_counters.expired + excluded.expired, "
                "dead_lettered = b2b_box_counters.dead_lettered + excluded.dead_lettered, "
                "redelivered = b2b_box_counters.redelivered + excluded.redelivered"),
                [(box, *delta) for box, delta in sorted(deltas.items())], many=True)
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
                        high = conn.exec_driver_sql(
                            "SELECT seq FROM sqlite_sequence WHERE name = 'b2b_entries'").scalar() or 0
                        if high > last and self._foreign_ids(last, high):
                            boxes = conn.exec_driver_sql(
                                "SELECT DISTINCT box FROM b2b_entries WHERE id > ? AND id <= ?", (last, high)
                            ).scalars().all()
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

    # ------------------------------------------------------------ operations (run in the writer)

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
        dead = conn.execute(
            sa.select(instances.c.id).where(instances.c.heartbeat < cutoff, instances.c.id != self.instance_id)
        ).scalars().all()
        for owner in dead:
            log.warning("broker instance %s stopped sending heartbeats; reclaiming its messages", owner)
            self._reclaim(batch, owner)
            conn.execute(instances.delete().where(instances.c.id == owner))
        # depth deltas of instances that are gone (written in the very transaction that said goodbye)
        for owner in conn.execute(sa.select(box_depth.c.instance).where(
                box_depth.c.instance != "", box_depth.c.instance != self.instance_id,
                ~box_depth.c.instance.in_(sa.select(instances.c.id))).distinct()).scalars().all():
            self._fold_depth(batch, owner)
        # in-flight rows whose owner is unknown (instance row lost) come back too
        orphans = conn.execute(
            sa.select(entries.c.id).where(_IN_FLIGHT, ~entries.c.owner.in_(sa.select(instances.c.id)))
        ).scalars().all()
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

    def _insert(self, batch: Batch, envs: Sequence[Envelope]) -> None:
        """Store ``envs`` in this transaction (written by :meth:`_flush_inserts`
        just before the commit, together with every other op's)."""
        batch.inserts.extend(envs)

    def _before_commit(self, batch: Batch) -> None:
        if batch.inserts:
            self._flush_inserts(batch)
        if self._pg:
            for box in batch.touched:
                self._sql.run(batch.conn, "SELECT pg_notify(%s, %s)", (_CHANNEL, box))
            self._mark_commit(batch)
        elif batch.depth:
            self._record_depth(batch)

    _MARK = "UPDATE b2b_instances SET last_commit = %s WHERE id = %s RETURNING id"
    #: The mark with the transaction's depth deltas (``_record_depth``) in the same statement: no round
    #: trip of their own (a data-modifying WITH runs whether or not the query reads it).
    _MARK_WITH_DEPTH = (
        "WITH depth AS (INSERT INTO b2b_box_depth (instance, box, entries) "
        "SELECT %s, t.box, t.n FROM unnest(%s::varchar[], %s::bigint[]) AS t(box, n) "
        "ON CONFLICT (instance, box) DO UPDATE SET entries = b2b_box_depth.entries + excluded.entries) "
        + _MARK)

    def _mark_commit(self, batch: Batch) -> None:
        """Record this transaction's number in our instance row (PostgreSQL):
        if the answer to COMMIT is lost, :meth:`_was_committed` tells whether
        it happened, so the writer neither loses nor repeats it. The same
        statement records the transaction's depth deltas."""
        conn = batch.conn
        changed = [(box, n) for box, n in sorted(batch.depth.items()) if n]
        if changed:
            marked = self._sql.run(conn, self._MARK_WITH_DEPTH, (self.instance_id, [b for b, _ in changed],
                                                                 [n for _, n in changed], batch.number,
                                                                 self.instance_id))
        else:
            marked = self._sql.run(conn, self._MARK, (batch.number, self.instance_id))
        if not marked and not self._stop.is_set():  # presumed dead and reaped meanwhile: register again
            now = now_ms()
            conn.execute(instances.insert(), {"id": self.instance_id, "host": socket.gethostname()[:200],
                                              "pid": os.getpid(), "started": now, "heartbeat": now,
                                              "last_commit": batch.number})

    def _was_committed(self, number: int) -> bool:
        with self.engine.connect() as conn:
            last = conn.execute(sa.select(instances.c.last_commit).where(instances.c.id == self.instance_id)).scalar()
            conn.rollback()
        return last is not None and last >= number

    def _reserve_ids(self, conn: sa.Connection, table: str, n: int) -> list[int]:
        """``n`` new ids of ``table`` in one query (the write lock is held)."""
        if self._pg:
            rows = self._sql.run(
                conn, f"SELECT nextval(pg_get_serial_sequence('{table}', 'id')) FROM generate_series(1, %s)", (n,))
            return [row[0] for row in rows]
        rows = self._sql.run(conn, "SELECT seq FROM sqlite_sequence WHERE name = ?", (table,))
        base = rows[0][0] if rows else 0
        return list(range(base + 1, base + n + 1))

    def _flush_inserts(self, batch: Batch) -> None:
        """One message row per envelope, and an entry in every box that
        receives it: a queue's, or each matching subscription of a topic (read
        in this same transaction). Entries for a consumer of this process that
        is waiting on an empty box are inserted already claimed and handed to
        it after the commit (no claim round trip, no reading back)."""
        conn = batch.conn
        placed: list[tuple[Envelope, Sequence[str]]] = []
        topic_subs: dict[str, list[Any]] = {}
        for env in batch.inserts:
            dest = env.destination
            if dest.is_topic:
                key = str(dest)
                subs = topic_subs.get(key)
                if subs is None:
                    subs = topic_subs[key] = conn.execute(
                        sa.select(subscriptions.c.box, subscriptions.c.selector, subscriptions.c.no_local,
                                  subscriptions.c.local_origin).where(subscriptions.c.topic == key)
                    ).all()
                boxes = []
                for sub in subs:
                    if sub.no_local and env.origin is not None and env.origin == sub.local_origin:
                        continue
                    selector = self._selector(sub.selector) if sub.selector else None
                    if selector is not None and not selector.matches(env):
                        continue
                    boxes.append(sub.box)
                if boxes:
                    placed.append((env, boxes))
            else:
                placed.append((env, (str(dest),)))
        batch.inserts = []
        if not placed:
            return
        self._ordered(batch)
        ids = self._reserve_ids(conn, "b2b_messages", len(placed))
        seq = self._next_seqs(len(placed))
        message_values = _codec.message_values
        compress_over = self._compress_over
        message_rows = []
        pending: list[tuple[str, int, int, int, int, Envelope]] = []  # box, seq, priority, expiration, message
        for (env, boxes), message in zip(placed, ids):
            message_rows.append(message_values(env, message, compress_over))
            for box in boxes:
                pending.append((box, seq, env.priority, env.expiration, message, env))
            seq += 1
        entry_ids = self._reserve_ids(conn, "b2b_entries", len(pending))
        handed = self._pick_waiting_readers(pending) if self._waiting_boxes else None
        if handed:
            owner = self.instance_id
            rows = [(entry_id, box, s, prio, exp, 1, 0, owner, 1, message) if i in handed
                    else (entry_id, box, s, prio, exp, 0, 0, None, 0, message)
                    for i, (entry_id, (box, s, prio, exp, message, _)) in enumerate(zip(entry_ids, pending))]
            by_reader: dict[_SQLReader, list[Delivery]] = {}
            for i, reader in handed.items():
                box, _, _, _, _, env = pending[i]
                by_reader.setdefault(reader, []).append(Delivery(box, entry_ids[i], env, 1))
            batch.after_commit.append(lambda: self._hand_over(by_reader))
        else:
            rows = [(entry_id, box, s, prio, exp, 0, 0, None, 0, message)
                    for entry_id, (box, s, prio, exp, message, _) in zip(entry_ids, pending)]
        sql = self._sql
        sql.insert_rows(conn, "messages", message_rows)
        sql.insert_rows(conn, "entries", rows)
        if not self._pg:
            first, last = entry_ids[0], entry_ids[-1]
            batch.after_commit.append(lambda: self._note_own_ids(first, last))
        batch.after_commit.append(lambda: self._remember(ids, placed))
        counts = collections.Counter(p[0] for p in pending)
        # a box all of whose new entries went to waiting readers has nothing for anyone else: its other
        # consumers (and other processes) are not woken to find it empty, only the readers that got them
        batch.touched.update(counts if not handed else {p[0] for i, p in enumerate(pending) if i not in handed})
        batch.after_commit.append(lambda: [self._counters.add(b, ENQ, n) for b, n in counts.items()])
        depth = batch.depth
        for box, n in counts.items():
            depth[box] = depth.get(box, 0) + n

    def _record_depth(self, batch: Batch) -> None:
        """Add this transaction's entries per box to ``b2b_box_depth`` (this instance's rows): counting a
        box then reads a few rows, never its entries. One statement per transaction, carrying every box
        the transaction touched (one or two, mostly)."""
        changed = [(self.instance_id, box, n) for box, n in sorted(batch.depth.items()) if n]
        if changed:
            mark = self._sql._mark
            self._sql.run(batch.conn, f"INSERT INTO b2b_box_depth (instance, box, entries) VALUES ({mark}, {mark}, "
                                      f"{mark}) ON CONFLICT (instance, box) DO UPDATE SET "
                                      "entries = b2b_box_depth.entries + excluded.entries", changed, many=True)

    def _fold_depth(self, batch: Batch, owner: str) -> None:
        """Fold the depth deltas of a broker instance that is gone into the base rows (instance ``''``).
        DELETE ... RETURNING takes them, so two processes folding the same instance cannot both count it."""
        rows = batch.conn.execute(box_depth.delete().where(box_depth.c.instance == owner)
                                  .returning(box_depth.c.box, box_depth.c.entries)).all()
        changed = [("", box, n) for box, n in rows if n]
        if changed:
            mark = self._sql._mark
            self._sql.run(batch.conn, f"INSERT INTO b2b_box_depth (instance, box, entries) VALUES ({mark}, {mark}, "
                                      f"{mark}) ON CONFLICT (instance, box) DO UPDATE SET "
                                      "entries = b2b_box_depth.entries + excluded.entries", changed, many=True)

    _RECENT_COUNT = 4096
    _RECENT_BYTES = 32 << 20

    def _remember(self, ids: Sequence[int], placed: Sequence[tuple[Envelope, Sequence[str]]]) -> None:
        """After the commit that stored them: keep the envelopes for claims by this process's consumers
        (none for a queue that only other processes consume, or none yet)."""
        readers = self._waiting_boxes  # every box with a consumer in this process
        if not readers:
            return
        recent = self._recent
        size = self._recent_bytes
        for message, (env, boxes) in zip(ids, placed):
            # one a consumer here may claim, and not one an XPATH selector parsed (its tree would not count
            # in the bound); a consumer that comes later reads the row back
            if env._xml is None and any(box in readers for box in boxes):
                recent[message] = env
                size += _body_size(env)
        while len(recent) > self._RECENT_COUNT or size > self._RECENT_BYTES:
            size -= _body_size(recent.popitem(last=False)[1])
        self._recent_bytes = size

    def _forget(self, message_ids: Iterable[int]) -> None:
        recent = self._recent
        if recent:
            for message in message_ids:
                env = recent.pop(message, None)
                if env is not None:
                    self._recent_bytes -= _body_size(env)

    def _pick_waiting_readers(self, pending: Sequence[tuple[str, int, int, int, int, Envelope]]
                              ) -> dict[int, "_SQLReader"]:
        """Which of ``pending`` (by index) go straight to a consumer of this
        process: one blocked waiting on a box where it found nothing for it,
        with nothing changed since (so nothing older that it could take is
        waiting in the database), whose selector the message matches; at most
        its reader's ``prefetch`` each, highest priority first."""
        with self._readers_lock:
            candidates = {box: list(readers) for box, readers in self._waiting_boxes.items()}
        chosen: dict[int, _SQLReader] = {}
        for box, readers in candidates.items():
            hungry = [reader for reader in readers if reader._waiting_for_new()]
            if not hungry:
                continue
            indexes = [i for i, p in enumerate(pending) if p[0] == box]
            if not indexes:
                continue
            indexes.sort(key=lambda i: (-pending[i][2], pending[i][1]))
            load = dict.fromkeys(hungry, 0)
            turn = 0
            for i in indexes:
                env = pending[i][5]
                for k in range(len(hungry)):
                    reader = hungry[(turn + k) % len(hungry)]
                    if load[reader] < reader.prefetch and (reader._selector is None or reader._selector.matches(env)):
                        chosen[i] = reader
                        load[reader] += 1
                        turn = (turn + k + 1) % len(hungry)
                        break
                else:
                    if all(n >= r.prefetch for r, n in load.items()):
                        break
        return chosen

    def _hand_over(self, by_reader: dict["_SQLReader", list[Delivery]]) -> None:
        """After the commit: give the pre-claimed entries to their readers;
        a reader closed meanwhile gets nothing and the entries go back."""
        give_back: list[int] = []
        for reader, deliveries in by_reader.items():
            deliveries.sort(key=lambda d: (-d.envelope.priority, d.ref))
            if not reader._accept(deliveries):
                give_back.extend(d.ref for d in deliveries)
        if give_back:
            self._write(lambda b: self._op_release(b, give_back, "not delivered", self.instance_id, counted=False),
                        wait=False, durable=False)

    def _register_reader(self, reader: "_SQLReader") -> None:
        with self._readers_lock:
            self._waiting_boxes.setdefault(reader._box, []).append(reader)

    def _unregister_reader(self, reader: "_SQLReader") -> None:
        with self._readers_lock:
            readers = self._waiting_boxes.get(reader._box)
            if readers is not None and reader in readers:
                readers.remove(reader)
                if not readers:
                    del self._waiting_boxes[reader._box]

    def _envelopes(self, conn: sa.Connection, rows: Sequence[Any]) -> dict[int, tuple[Any, ...]]:
        """The ``b2b_messages`` rows (``id``, then MESSAGE_COLUMNS) of some
        entry rows, by message id."""
        return {msg[0]: msg for msg in self._sql.by_ids(conn, "messages", list({row.message for row in rows}))}

    def _collect(self, batch: Batch, refs: Sequence[int]) -> None:
        """Delete the message rows that no entry refers to any more."""
        if refs:
            self._sql.by_ids(batch.conn, "collect", list(set(refs)))

    def _delete_entries(self, batch: Batch, ids: Sequence[int], owner: str | None = None) -> int:
        """Delete entries (only ``owner``'s, when given) and their orphaned
        messages; returns how many entries were deleted."""
        if owner is not None:
            deleted = self._sql.by_ids(batch.conn, "delete_owned", ids, owner)
        else:
            deleted = self._sql.by_ids(batch.conn, "delete_any", ids)
        refs = [row[0] for row in deleted]
        depth = batch.depth
        for _, box in deleted:
            depth[box] = depth.get(box, 0) - 1
        self._collect(batch, refs)
        self._forget(refs)
        return len(refs)

    def _delete_box_entries(self, batch: Batch, box: str) -> None:
        refs = []
        for state in (_WAITING, _IN_FLIGHT):  # each through its partial index
            refs += batch.conn.execute(
                entries.delete().where(entries.c.box == box, state).returning(entries.c.message)).scalars().all()
        # the box is gone: so are its counts (every instance's), and this transaction's
        batch.depth.pop(box, None)
        batch.conn.execute(box_depth.delete().where(box_depth.c.box == box))
        self._collect(batch, refs)

    def _op_release(self, batch: Batch, ids: list[int], reason: str, owner: str | None, *,
                    counted: bool = True) -> None:
        """Put in-flight entries back (after the policy's delay) or dead-letter
        them; ``counted=False`` undoes a claim whose message was never handed
        out (prefetched, then the consumer closed)."""
        conn = batch.conn
        policy = self.policy
        now = now_ms()
        where = [entries.c.id.in_(ids), entries.c.state == 1]
        if owner is not None:
            where.append(entries.c.owner == owner)
        rows = conn.execute(sa.select(*_CLAIMED).where(*where).order_by(entries.c.seq)).all()
        dead = [row for row in rows if counted and row.delivery_count >= policy.max_deliveries]
        if dead:
            found = self._envelopes(conn, dead)
            letters = []
            for row in dead:
                why = (f"delivered {row.delivery_count} times without acknowledgement "
                       f"(max_deliveries={policy.max_deliveries}); last failure: {reason}")
                env = _codec.row_envelope(found[row.message], row.priority, row.expiration, 1)
                letters.append(dead_letter_envelope(env, policy, why, row.box))
                batch.after_commit.append(lambda box=row.box: self._counters.add(box, DLQ))
            self._insert(batch, letters)
            self._delete_entries(batch, [row.id for row in dead])
        if rows:
            self._ordered(batch)
        for row in rows:
            if counted and row.delivery_count >= policy.max_deliveries:
                continue
            delay = policy.delay_ms(row.delivery_count) if counted else 0
            count = row.delivery_count if counted else max(0, row.delivery_count - 1)
            if counted:
                batch.after_commit.append(lambda box=row.box: self._counters.add(box, RED))
            # a new id, so that selective readers that scanned past it see it again
            conn.execute(entries.insert().from_select(
                [*(c.name for c in _COPY_COLS), "state", "ready_at", "owner", "delivery_count"],
                sa.select(*_COPY_COLS, sa.literal(0), sa.literal(now + delay if delay else 0),
                          sa.null(), sa.literal(count)).where(entries.c.id == row.id),
            ))
            conn.execute(entries.delete().where(entries.c.id == row.id))
            batch.touched.add(row.box)

    def _op_dead_letter(self, batch: Batch, ids: list[int], reason: str) -> None:
        """Move this instance's in-flight entries to their dead-letter queues now."""
        conn = batch.conn
        rows = conn.execute(sa.select(*_CLAIMED).where(entries.c.id.in_(ids), entries.c.state == 1,
                                                        entries.c.owner == self.instance_id)
                            .order_by(entries.c.seq)).all()
        if not rows:
            return
        found = self._envelopes(conn, rows)
        letters = []
        for row in rows:
            env = _codec.row_envelope(found[row.message], row.priority, row.expiration, 1)
            letters.append(dead_letter_envelope(env, self.policy, reason, row.box))
            batch.after_commit.append(lambda box=row.box: self._counters.add(box, DLQ))
        self._ordered(batch)
        self._insert(batch, letters)
        self._delete_entries(batch, [row.id for row in rows])

    def _expire_rows(self, batch: Batch, rows: Sequence[Any]) -> None:
        """Delete expired entries (already selected), remember them (for
        ``locate``), and count or move them."""
        ids = dict(self._sql.by_ids(batch.conn, "message_ids", list({row.message for row in rows})))
        now = now_ms()
        self._sql.tombstones(batch.conn, [(ids[row.message], row.box, now) for row in rows if row.message in ids])
        copies = []
        if self.policy.expiry_queue is not None:
            found = self._envelopes(batch.conn, rows)
            for row in rows:
                copy = expired_envelope(_codec.row_envelope(found[row.message], row.priority, row.expiration, 1),
                                        self.policy)
                if copy is not None:
                    copies.append(copy)
        self._delete_entries(batch, [row.id for row in rows])
        for row in rows:
            batch.after_commit.append(lambda box=row.box: self._counters.add(box, EXP))
        if copies:
            self._insert(batch, copies)

    def _op_claim(self, batch: Batch, box: str, limit: int, ids: list[int] | None,
                  now: int) -> tuple[list[Delivery], int | None]:
        conn = batch.conn
        sql = self._sql
        some = ids is not None and limit < len(ids)  # candidates of which competing consumers may have taken some
        claimed: list[Any] = []
        while True:
            if ids is None:
                rows = sql.run(conn, sql.claim_next, (self.instance_id, box, now, limit))
            elif some:
                rows = sql.by_ids(conn, "claim_some", ids, now, limit, before=(self.instance_id,))
            else:
                rows = sql.by_ids(conn, "claim", ids, now, before=(self.instance_id,))
            expired = [_Claimed._make(r) for r in rows if 0 < r[5] <= now]
            if not expired:
                claimed.extend(rows)
                break
            self._expire_rows(batch, expired)
            rows = [r for r in rows if not 0 < r[5] <= now]
            claimed.extend(rows)
            if some:  # the expired ones took places of the limit: claim the next candidates in their stead
                gone = {r[0] for r in rows} | {e.id for e in expired}
                ids = [i for i in ids if i not in gone]
                limit -= len(rows)
                if limit > 0 and ids:
                    continue
                break
            if rows or ids is not None:
                break  # else: all were expired; claim the next ones
        rows = claimed
        if not rows:
            return [], sql.run(conn, sql.next_ready, (box, now))[0][0]
        rows.sort(key=lambda r: (-r[4], r[3]))
        # the envelopes this process stored lately are taken as they are (message rows never change);
        # the others are read back, and decoded by the caller (_claim_rows) once the write turn is over
        recent = self._recent
        stored = {}
        unknown = {row[6] for row in rows if row[6] not in recent}
        if unknown:
            stored = {row[0]: row for row in sql.by_ids(conn, "messages", list(unknown))}
        return [(entry_box, entry_id, count, priority, expiration, recent.get(message) or stored[message])
                for entry_id, entry_box, count, _, priority, expiration, message in rows], None

    # ------------------------------------------------------------ boxes and subscriptions

    def create_queue(self, box: str, destination: Destination) -> None:
        self._mem.create_queue(box, destination)

    def delete_box(self, box: str) -> None:
        self._mem.delete_box(box)

        def op(batch: Batch) -> None:
            self._delete_box_entries(batch, box)
            batch.conn.execute(subscriptions.delete().where(subscriptions.c.box == box))

        self._write(op)

    def create_subscription(self, subscription: Subscription) -> None:
        self._selector(subscription.selector)  # InvalidSelectorError before anything is written
        row = {
            "box": subscription.box, "topic": str(subscription.topic), "selector": subscription.selector,
            "no_local": subscription.no_local, "local_origin": subscription.local_origin,
            "client_id": subscription.client_id, "name": subscription.name,
            "owner": None if subscription.durable else self.instance_id,
        }

        def op(batch: Batch) -> None:
            batch.conn.execute(subscriptions.delete().where(subscriptions.c.box == subscription.box))
            batch.conn.execute(subscriptions.insert(), row)

        self._write(op)
        self._mem.create_subscription(subscription)

    def _subscription_row(self, box: str) -> Subscription | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(subscriptions).where(subscriptions.c.box == box)).first()
        if row is None:
            return None
        return Subscription(row.box, _codec.destination(row.topic), row.selector, row.no_local, row.local_origin,
                            client_id=row.client_id, name=row.name)

    def durable_subscription(self, client_id: str, name: str) -> Subscription | None:
        from .._store import subscription_box

        sub = self._subscription_row(subscription_box(client_id, name))
        return sub if sub is not None and sub.durable else None

    def register_temporary(self, destination: Destination) -> None:
        self._local_temps.add(destination)
        self._write(lambda b: b.conn.execute(temporaries.insert(), {"name": str(destination),
                                                                     "owner": self.instance_id}))

    def unregister_temporary(self, destination: Destination) -> None:
        self._local_temps.discard(destination)
        name = str(destination)

        def op(batch: Batch) -> None:
            batch.conn.execute(temporaries.delete().where(temporaries.c.name == name))
            self._delete_box_entries(batch, name)

        self._write(op)

    def temporary_exists(self, destination: Destination) -> bool:
        if destination in self._local_temps:
            return True
        seen = self._remote_temps.get(destination)
        if seen is not None and time.monotonic() - seen < 1.0:
            return True
        with self.engine.connect() as conn:
            found = conn.execute(sa.select(temporaries.c.name).where(temporaries.c.name == str(destination))).first()
        if found is None:
            self._remote_temps.pop(destination, None)
            return False
        self._remote_temps[destination] = time.monotonic()
        return True

    # ------------------------------------------------------------ writes

    def _in_memory(self, env: Envelope) -> bool:
        if env.delivery_mode != NON_PERSISTENT:
            return False
        dest = env.destination
        return not dest.is_temporary or dest in self._local_temps or dest.is_topic

    def send(self, envelope: Envelope) -> None:
        if self._in_memory(envelope):
            self._mem.send(envelope)
            return
        self._write(lambda batch: self._insert(batch, (envelope,)))

    def commit(self, sends: Sequence[Envelope], acks: Sequence[Delivery], extra: Sequence[Callable[[Any], Any]] = (),
               callback: Callable[[BaseException | None], None] | None = None, *, durable: bool = True) -> None:
        sync = durable or bool(sends or acks)  # messages and acknowledgements are stored as they ask
        if len(sends) == 1 and not acks and not self._in_memory(sends[0]):  # the common single send
            durable, sql_acks, memory_sends, memory_acks = sends, (), (), ()
        else:
            durable = [e for e in sends if not self._in_memory(e)]
            sql_acks = [d for d in acks if type(d.ref) is int]
            memory_sends = [e for e in sends if self._in_memory(e)]
            memory_acks = [d for d in acks if type(d.ref) is not int]

        def memory_part() -> None:
            if memory_sends or memory_acks:
                self._mem.commit(memory_sends, memory_acks)

        if not (durable or sql_acks or extra):
            memory_part()
            if callback is not None:
                callback(None)
            return

        def op(batch: Batch) -> None:
            if sql_acks:
                self._ack_rows(batch, sql_acks, strict=True)
            if durable:
                self._insert(batch, durable)
            if extra:
                self._ordered(batch)
                for fn in extra:
                    fn(batch.conn)

        if callback is None:
            self._write(op, durable=sync)
            memory_part()
            return

        if not (memory_sends or memory_acks):
            self._write(op, callback=lambda result, error: callback(error))
            return

        def finish() -> None:
            try:
                memory_part()
            except BaseException as error:  # noqa: BLE001 - the caller hears of it
                callback(error)
                return
            callback(None)

        def done(result: Any, error: BaseException | None) -> None:
            if error is not None:
                callback(error)
            else:  # the memory-tier part wakes consumers: not in the writer's thread, which has commits to run
                self._completions().submit(finish)

        self._write(op, callback=done, durable=sync)

    def _completions(self) -> concurrent.futures.ThreadPoolExecutor:
        """One thread that finishes asynchronous commits' memory-tier parts, in commit order."""
        pool = self._completion_pool
        if pool is None:
            with self._completion_lock:
                if self._completion_pool is None:
                    self._completion_pool = concurrent.futures.ThreadPoolExecutor(
                        1, thread_name_prefix="b2b-sql-completions")
                pool = self._completion_pool
        return pool

    def locate(self, message_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
        found = self._mem.locate(message_ids)
        ids = list(message_ids)
        if not ids:
            return found
        sql = self._sql
        with self.engine.connect() as conn:
            conn.begin()  # driver statements run in a transaction SQLAlchemy knows of (rolled back below)
            for message_id, box in sql.by_ids(conn, "expired_of", ids):
                found.setdefault(message_id, (box, "expired"))
            for message_id, box, state in sql.by_ids(conn, "entries_of", ids):
                found[message_id] = (box, "in_flight" if state == 1 else "pending")
            conn.rollback()
        return found

    def _ack_rows(self, batch: Batch, deliveries: Sequence[Delivery], strict: bool = False) -> int:
        """Delete acknowledged rows; returns how many were no longer ours
        (reclaimed after our lease expired). ``strict`` raises instead, which
        rolls the whole operation back (a transacted commit)."""
        ids = [d.ref for d in deliveries if type(d.ref) is int]
        if not ids:
            return 0
        missing = len(ids) - self._delete_entries(batch, ids, self.instance_id)
        if missing and strict:
            raise TransactionRolledBackError(
                f"{missing} of the messages this transaction consumed were taken back (this process was presumed "
                "dead: no heartbeat within the lease timeout); the transaction was rolled back and they will be "
                "redelivered"
            )
        counts = collections.Counter(d.box for d in deliveries if type(d.ref) is int)
        batch.after_commit.append(lambda: [self._counters.add(b, DEQ, n) for b, n in counts.items()])
        if missing and not strict:
            log.warning("%d acknowledged messages had been taken back after this process's lease expired; "
                        "they will be redelivered", missing)
        return missing

    def ack(self, deliveries: Sequence[Delivery], wait: bool = True) -> None:
        if not wait:
            self._ack_later(deliveries)
            return
        if any(type(d.ref) is int for d in deliveries):
            missing = self._write(lambda batch: self._ack_rows(batch, deliveries), wait)
            if missing:
                raise LeaseExpiredError(
                    f"{missing} of {len(deliveries)} messages could not be acknowledged: they were taken back after "
                    "this process was presumed dead (no heartbeat within the lease timeout) and will be redelivered"
                )
        memory = [d for d in deliveries if type(d.ref) is not int]
        if memory:
            self._mem.ack(memory)

    def _ack_later(self, deliveries: Sequence[Delivery]) -> None:
        """AUTO/DUPS_OK acknowledgements: queued, and deleted by one statement
        in the writer's next transaction (one op for all that piled up)."""
        memory = []
        with self._later_lock:
            for d in deliveries:
                if type(d.ref) is int:
                    self._later.append(d)
                else:
                    memory.append(d)
            flush = bool(self._later) and not self._later_queued
            if flush:
                self._later_queued = True
        if flush:
            self._write(self._op_ack_later(), wait=False, durable=False)
        if memory:
            self._mem.ack(memory)

    def _op_ack_later(self) -> Callable[[Batch], None]:
        taken: list[Delivery] = []

        def op(batch: Batch) -> None:
            if not taken:  # first run; a retried run deletes the same rows again
                with self._later_lock:
                    taken.extend(self._later)
                    self._later = []
                    self._later_queued = False
            if taken:
                self._ack_rows(batch, taken)

        return op

    def _expire_held(self, delivery: Delivery) -> None:
        """A claimed (prefetched) entry that expired before it was handed out."""
        def op(batch: Batch) -> None:
            if self._delete_entries(batch, [delivery.ref], self.instance_id):
                self._sql.tombstones(batch.conn, [(delivery.envelope.message_id, delivery.box, now_ms())])
                if self.policy.expiry_queue is not None:
                    copy = expired_envelope(delivery.envelope, self.policy)
                    if copy is not None:
                        self._insert(batch, (copy,))

        self._write(op, wait=False, durable=False)
        self._counters.add(delivery.box, EXP)

    def release(self, deliveries: Sequence[Delivery], reason: str) -> None:
        ids = [d.ref for d in deliveries if type(d.ref) is int]
        if ids:
            self._write(lambda batch: self._op_release(batch, ids, reason, self.instance_id))
            for d in deliveries:
                self._next_ready.pop(d.box, None)
        memory = [d for d in deliveries if type(d.ref) is not int]
        if memory:
            self._mem.release(memory, reason)

    def dead_letter(self, deliveries: Sequence[Delivery], reason: str) -> None:
        ids = [d.ref for d in deliveries if type(d.ref) is int]
        if ids:
            self._write(lambda batch: self._op_dead_letter(batch, ids, reason))
        memory = [d for d in deliveries if type(d.ref) is not int]
        if memory:
            self._mem.dead_letter(memory, reason)

    # ------------------------------------------------------------ reads

    def reader(self, box: str, selector: str | None, prefetch: int | None = None) -> Reader:
        compiled = self._selector(selector)
        if box.startswith(("durable://", "subscriber://")) and not self._mem.has_box(box):
            sub = self._subscription_row(box)
            if sub is not None:
                self._mem.create_subscription(sub)
        return _SQLReader(self, box, compiled, self._mem.reader(box, selector), prefetch)

    def _claim_rows(self, box: str, limit: int, ids: list[int] | None, now: int) -> list[Delivery]:
        claimed, next_ready = self._write(lambda batch: self._op_claim(batch, box, limit, ids, now),
                                          durable=False)
        if next_ready is not None:
            self._next_ready[box] = next_ready
        elif ids is None:
            self._next_ready.pop(box, None)
        out = []
        for entry_box, entry_id, count, priority, expiration, found in claimed:
            if type(found) is not Envelope:  # a message row
                env = _codec.row_envelope(found, priority, expiration, 1)
            elif found.priority != priority or found.expiration != expiration:
                env = found.replace(priority=priority, expiration=expiration)
            else:
                env = found
            out.append(Delivery(entry_box, entry_id, env, count))
        return out

    def browse(self, box: str, selector: str | None) -> Iterator[Envelope]:
        compiled = self._selector(selector)
        now = now_ms()
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(entries.c.priority, entries.c.expiration, *_MESSAGE_COLS).select_from(_JOINED)
                .where(entries.c.box == box, _WAITING)
                .order_by(entries.c.priority.desc(), entries.c.seq)
            ).all()
        found = []
        for row in rows:
            if 0 < row.expiration <= now:
                continue
            env = _codec.row_envelope(row, row.priority, row.expiration, 2)
            if compiled is None or compiled.matches(env):
                found.append(env)
        found.extend(self._mem.browse(box, selector))
        return iter(found)

    def stats(self) -> list[DestinationStats]:
        """Counters of every box without scanning what waits: the entries of each box from
        ``b2b_box_depth`` (a few rows per box), those in flight (few: consumers' prefetch) and the head of
        each box (one index seek each)."""
        with self.engine.connect() as conn:
            totals = dict(conn.execute(sa.select(box_depth.c.box, sa.func.sum(box_depth.c.entries))
                                       .group_by(box_depth.c.box)).all())
            flying = dict(conn.execute(
                sa.select(entries.c.box, sa.func.count()).where(_IN_FLIGHT).group_by(entries.c.box)).all())
            heads = dict(conn.execute(self._heads_query).all()) if totals else {}
            subs = dict(conn.execute(sa.select(subscriptions.c.box, subscriptions.c.topic)).all())
            shared = {row[0]: row[1:] for row in conn.execute(sa.select(
                box_counters.c.box, box_counters.c.enqueued, box_counters.c.dequeued, box_counters.c.expired,
                box_counters.c.dead_lettered, box_counters.c.redelivered)).all()}
            others = dict(conn.execute(
                sa.select(consumers.c.box, sa.func.sum(consumers.c.consumers))
                .where(consumers.c.instance != self.instance_id).group_by(consumers.c.box)).all())
            conn.rollback()
        waiting = [(box, max(0, int(total) - flying.get(box, 0)), heads.get(box))
                   for box, total in totals.items() if total]
        depth = {box: (n, oldest) for box, n, oldest in waiting}
        memory = {s.name: s for s in self._mem.stats()}
        names = set(depth) | set(flying) | set(subs) | set(memory) | set(self._counters.boxes()) | set(shared) \
            | set(others)  # a box only another process consumes from
        out = []
        for name in sorted(names):
            db_depth, oldest_seq = depth.get(name, (0, None))
            mem = memory.get(name)
            counts = [a + b for a, b in zip(self._counters.get(name), shared.get(name, (0, 0, 0, 0, 0)))]
            oldest = oldest_seq // 1000 if oldest_seq is not None else None  # seqs are microseconds
            if mem is not None and mem.oldest is not None:
                oldest = mem.oldest if oldest is None else min(oldest, mem.oldest)
            out.append(DestinationStats(
                name=name,
                depth=db_depth + (mem.depth if mem else 0),
                in_flight=flying.get(name, 0) + (mem.in_flight if mem else 0),
                consumers=int(others.get(name) or 0),
                enqueued=counts[ENQ] + (mem.enqueued if mem else 0),
                dequeued=counts[DEQ] + (mem.dequeued if mem else 0),
                expired=counts[EXP] + (mem.expired if mem else 0),
                dead_lettered=counts[DLQ] + (mem.dead_lettered if mem else 0),
                topic=subs.get(name) or (mem.topic if mem else None),
                oldest=oldest,
                redelivered=counts[RED] + (mem.redelivered if mem else 0),
            ))
        return out

    #: The seq of the first waiting entry of each counted box in delivery order (one seek of the claim
    #: index per box): when the message the box's consumers get next came in.
    _heads_query = sa.text(
        "SELECT d.box, (SELECT e.seq FROM b2b_entries e WHERE e.box = d.box AND e.state = 0 "
        "ORDER BY e.priority DESC, e.seq LIMIT 1) FROM (SELECT DISTINCT box FROM b2b_box_depth) d")

    # ------------------------------------------------------------ operators' reads and actions

    def observe_commits(self, observer: Callable[[float, int], None] | None) -> None:
        self._commit_observer = observer
        if self._writer is not None:
            self._writer.on_commit = observer

    def consumer_counts(self, counts: Callable[[], dict[str, int]]) -> None:
        self._consumer_counts = counts

    #: The listing columns of a browse page: the entry, the message's headers and properties, the body's
    #: stored length and first bytes (an LZ4 frame's header says the original size), not the body itself.
    _PAGE_COLUMNS = (entries.c.id, entries.c.priority, entries.c.seq, entries.c.expiration, entries.c.delivery_count,
                     messages.c.message_id, messages.c.destination, messages.c.delivery_mode, messages.c.timestamp,
                     messages.c.correlation_id, messages.c.reply_to, messages.c.type, messages.c.properties,
                     messages.c.kind, sa.func.length(messages.c.body), sa.func.substr(messages.c.body, 1, 32),
                     messages.c.origin)

    def browse_page(self, box: str, selector: str | None, after: tuple[int, ...] | None, limit: int,
                    scan_limit: int) -> tuple[list[StoredMessage], tuple[int, ...] | None]:
        """Keyset pages: positions are ``(0, 9 - priority, seq, id)`` for the database's entries, then
        ``(1, ...)`` for this process's non-persistent ones. Each query is a range of the claim index
        (box, priority DESC, seq) from the position on, never an OFFSET: a page deep in a queue of
        millions costs what the first one does. XPATH selectors read bodies, in small chunks."""
        compiled = self._selector(selector)
        if after is not None and after[0] == 1:
            page, more = self._mem.browse_page(box, selector, after[1:] or None, limit, scan_limit)
            return page, None if more is None else (1, *more)
        needs_body = compiled is not None and "XPATH" in compiled.text.upper()
        chunk = 20 if needs_body else 200
        now = now_ms()
        out: list[StoredMessage] = []
        scanned = 0
        position = after
        exhausted = False
        with self.engine.connect() as conn:
            while len(out) < limit and scanned < scan_limit:
                rows = self._page_rows(conn, box, position, min(chunk, scan_limit - scanned), needs_body)
                if not rows:
                    exhausted = True
                    break
                for row in rows:
                    scanned += 1
                    position = (0, 9 - row[1], row[2], row[0])
                    if 0 < row[3] <= now:
                        continue
                    env, size = self._page_envelope(row, needs_body)
                    if compiled is None or compiled.matches(env):
                        if needs_body:
                            env = env.replace(body=None)
                        out.append(StoredMessage(box, env, "pending", row[4], size, position))
                        if len(out) >= limit:
                            break
            conn.rollback()
        if len(out) >= limit or scanned >= scan_limit:
            return out, position
        if exhausted:  # on to this process's non-persistent messages
            rest, more = self._mem.browse_page(box, selector, None, limit - len(out), scan_limit - scanned)
            out.extend(StoredMessage(m.box, m.envelope, m.state, m.delivery_count, m.size, (1, *m.position))
                       for m in rest)
            return out, None if more is None else (1, *more)
        return out, position

    def _page_rows(self, conn: sa.Connection, box: str, after: tuple[int, ...] | None, n: int,
                   with_body: bool) -> list[Any]:
        columns = list(self._PAGE_COLUMNS) + ([messages.c.body] if with_body else [])
        base = sa.select(*columns).select_from(_JOINED).where(entries.c.box == box, _WAITING)
        rows: list[Any] = []
        if after is not None:
            _, rank, seq, entry_id = after
            priority = 9 - rank
            rows = conn.execute(base.where(
                entries.c.priority == priority, sa.tuple_(entries.c.seq, entries.c.id) > sa.tuple_(seq, entry_id))
                .order_by(entries.c.seq, entries.c.id).limit(n)).all()
            if len(rows) >= n:
                return rows
            base = base.where(entries.c.priority < priority)
        rows += conn.execute(base.order_by(entries.c.priority.desc(), entries.c.seq, entries.c.id)
                             .limit(n - len(rows))).all()
        return rows

    @staticmethod
    def _page_envelope(row: Any, with_body: bool) -> tuple[Envelope, int]:
        """The envelope of a browse row (no body unless *with_body*) and the body's size as sent."""
        kind, stored_length, head = row[13], row[14] or 0, row[15]
        size = stored_length
        if kind.endswith(_codec.COMPRESSED) and head is not None:
            try:
                size = lz4.frame.get_frame_info(bytes(head))["content_size"] or stored_length
            except RuntimeError:
                pass
        body = None
        plain_kind = kind[:-len(_codec.COMPRESSED)] if kind.endswith(_codec.COMPRESSED) else kind
        if with_body:
            plain_kind, body = _codec.read_body(kind, row[17])
        env = Envelope(row[5], _codec.destination(row[6]), row[7], row[1], row[3], row[8], row[9],
                       _codec.destination(row[10]), row[11], _codec.decode_properties(row[12]), plain_kind, body,
                       row[16])
        return env, size

    def find(self, box: str, message_id: str) -> StoredMessage | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(entries.c.state, entries.c.delivery_count, entries.c.priority, entries.c.seq,
                          entries.c.id, entries.c.expiration, *_MESSAGE_COLS).select_from(_JOINED)
                .where(messages.c.message_id == message_id, entries.c.box == box).limit(1)).first()
            conn.rollback()
        if row is None:
            return self._mem.find(box, message_id)
        env = _codec.row_envelope(row, row.priority, row.expiration, 6)
        from .._store import body_size

        return StoredMessage(box, env, "in_flight" if row.state == 1 else "pending", row.delivery_count,
                             body_size(env), (0, 9 - row.priority, row.seq, row.id))

    def claim_positions(self, box: str, positions: Sequence[tuple[int, ...]]) -> list[Delivery]:
        """Positions ``(0, ...)`` name entries by id (claimed if still waiting); ``(1, ...)`` this process's
        non-persistent messages."""
        ids = [p[3] for p in positions if len(p) == 4 and p[0] == 0]
        memory = [p[1:] for p in positions if p and p[0] == 1]
        out = self._claim_rows(box, len(ids), ids, now_ms()) if ids else []
        if memory:
            out += self._mem.claim_positions(box, memory)
        return out

    def purge(self, box: str) -> int:
        """Delete the waiting entries of *box*, 5,000 per transaction so that other writers get turns."""
        total = self._mem.purge(box)

        def op(batch: Batch) -> int:
            refs = batch.conn.execute(entries.delete().where(entries.c.id.in_(
                sa.select(entries.c.id).where(entries.c.box == box, _WAITING).limit(5000).scalar_subquery()))
                .returning(entries.c.message)).scalars().all()
            if refs:
                batch.depth[box] = batch.depth.get(box, 0) - len(refs)
            self._collect(batch, refs)
            self._forget(refs)
            return len(refs)

        while True:
            n = self._write(op)
            total += n
            if n < 5000:
                return total

    def sweep_expired(self, now: int) -> int:
        def op(batch: Batch) -> int:
            rows = batch.conn.execute(
                sa.select(*_CLAIMED)
                .where(_WAITING, _EXPIRING, entries.c.expiration <= now)
                .limit(10_000)
            ).all()
            if rows:
                self._expire_rows(batch, rows)
            batch.conn.execute(expired_table.delete().where(
                expired_table.c.at < now - int(self.expired_retention * 1000)))
            return len(rows)

        return self._write(op) + self._mem.sweep_expired(now)

    # ------------------------------------------------------------ leases

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
        self._write(lambda b: b.conn.execute(
            leases.delete().where(leases.c.name == name, leases.c.owner == self.instance_id)))
