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
from collections.abc import Callable, Sequence
from typing import Any

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
    Reader,
    RedeliveryPolicy,
    Store,
    Subscription,
    expired_envelope,
)
from ..clock import now_ms
from ..sql import (
    MIGRATIONS,
    PG_WRITE_LOCK,
    VERSION_TABLE,
    current_revision,
    head_revision,
    make_engine,
    migrate,
    upgrade_database,
)
from . import _codec
from ._claims import _Claims
from ._common import _CLAIMED, _EXPIRING, _WAITING, DEQ, EXP, _Counters
from ._engine import _WriteTurn
from ._liveness import _Liveness
from ._operations import _Operations
from ._reader import _SQLReader
from ._reads import _Reads
from ._schema import (
    entries,
    instances,
    subscriptions,
    temporaries,
)
from ._schema import expired as expired_table
from ._statements import _Statements
from ._wakeups import LocalWakeups
from ._writer import Batch, GroupCommitter

__all__ = ["SQLStore", "make_engine", "upgrade_database"]

log = logging.getLogger(__name__)

#: SQLite: seconds between WAL checkpoints, which the writer runs after its transactions, outside the write turn.
CHECKPOINT_INTERVAL = 0.1
#: SQLite: a WAL longer than this many bytes is checkpointed inside the write turn, where no other process can
#: append meanwhile, so it is copied back whole and restarts (a checkpoint that other processes' appends keep
#: outrunning would let it grow); the connection's own automatic checkpoint is the last resort, at twice that.
WAL_LIMIT_BYTES = 64 << 20


#: How long the writer waits for more operations under a stream of asynchronous sends (s); see GroupCommitter.
COMMIT_DELAY = 0.0005


class SQLStore(_Liveness, _Operations, _Claims, _Reads, Store):
    """Persistent store on SQLAlchemy 2 (``sqlite:///path`` or
    ``postgresql+psycopg://user@host/db``), made of its liveness among other
    processes (``_liveness``), its writer's operations (``_operations``), its
    consumers' claims (``_claims``) and its reads (``_reads``).

    Options (names and values checked by ``_options``; defaults below):
    ``sqlite_synchronous`` (``"FULL"``; ``"NORMAL"`` survives a killed process
    but may lose the last commits to a power cut), ``prefetch`` (64),
    ``heartbeat_interval`` (1 s) and ``lease_timeout`` (10 s): how soon a dead
    process's messages come back; ``retry_for`` (30 s) of a database outage;
    ``auto_upgrade`` (on for SQLite); ``poll_interval`` and ``local_wakeups``
    (SQLite: how other processes' commits are noticed, see ``_wakeups``);
    ``expired_retention`` (7 days); ``commit_delay`` (0.0005 s, see
    ``GroupCommitter``); ``compress_over`` (2048 bytes, see ``_codec``);
    ``slow_commit_warning`` (0.5 s).
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
        self.engine = make_engine(url, sqlite_synchronous=self._sqlite_sync, pool_size=int(options.get("pool_size", 5)))
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

    def attach(
        self,
        policy: RedeliveryPolicy,
        on_available: Callable[[str], None],
        xpath_namespaces: dict[str, str] | None = None,
    ) -> None:
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
        self._write(
            lambda b: b.conn.execute(
                instances.insert(),
                {
                    "id": self.instance_id,
                    "host": socket.gethostname()[:200],
                    "pid": os.getpid(),
                    "started": now,
                    "heartbeat": now,
                },
            )
        )
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
        copy and its fsync, a large share of the SQLite work of each small message); a
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

    def _write(
        self,
        fn: Callable[[Batch], Any],
        wait: bool = True,
        callback: Callable[[Any, BaseException | None], None] | None = None,
        durable: bool = True,
    ) -> Any:
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
            "box": subscription.box,
            "topic": str(subscription.topic),
            "selector": subscription.selector,
            "no_local": subscription.no_local,
            "local_origin": subscription.local_origin,
            "client_id": subscription.client_id,
            "name": subscription.name,
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
        return Subscription(
            row.box,
            _codec.destination(row.topic),
            row.selector,
            row.no_local,
            row.local_origin,
            client_id=row.client_id,
            name=row.name,
        )

    def durable_subscription(self, client_id: str, name: str) -> Subscription | None:
        from .._store import subscription_box

        sub = self._subscription_row(subscription_box(client_id, name))
        return sub if sub is not None and sub.durable else None

    def register_temporary(self, destination: Destination) -> None:
        self._local_temps.add(destination)
        self._write(
            lambda b: b.conn.execute(temporaries.insert(), {"name": str(destination), "owner": self.instance_id})
        )

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

    def commit(
        self,
        sends: Sequence[Envelope],
        acks: Sequence[Delivery],
        extra: Sequence[Callable[[Any], Any]] = (),
        callback: Callable[[BaseException | None], None] | None = None,
        *,
        durable: bool = True,
        finish_on: Callable[[Callable[[], None]], None] | None = None,
    ) -> None:
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

        if finish_on is not None:  # the caller's own context finishes: one thread hop fewer than below

            def finished(result: Any, error: BaseException | None) -> None:
                finish_on(lambda: _finish(memory_part, callback) if error is None else callback(error))

            self._write(op, callback=finished, durable=sync)
            return

        if not (memory_sends or memory_acks):
            self._write(op, callback=lambda result, error: callback(error))
            return

        def done(result: Any, error: BaseException | None) -> None:
            if error is not None:
                callback(error)
            else:  # the memory-tier part wakes consumers: not in the writer's thread, which has commits to run
                self._completions().submit(_finish, memory_part, callback)

        self._write(op, callback=done, durable=sync)

    def _completions(self) -> concurrent.futures.ThreadPoolExecutor:
        """One thread that finishes asynchronous commits' memory-tier parts, in commit order."""
        pool = self._completion_pool
        if pool is None:
            with self._completion_lock:
                if self._completion_pool is None:
                    self._completion_pool = concurrent.futures.ThreadPoolExecutor(
                        1, thread_name_prefix="b2b-sql-completions"
                    )
                pool = self._completion_pool
        return pool

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
            log.warning(
                "%d acknowledged messages had been taken back after this process's lease expired; "
                "they will be redelivered",
                missing,
            )
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

    # ------------------------------------------------------------ consumers' claims

    def reader(self, box: str, selector: str | None, prefetch: int | None = None) -> Reader:
        compiled = self._selector(selector)
        if box.startswith(("durable://", "subscriber://")) and not self._mem.has_box(box):
            sub = self._subscription_row(box)
            if sub is not None:
                self._mem.create_subscription(sub)
        return _SQLReader(self, box, compiled, self._mem.reader(box, selector), prefetch)

    #: The seq of the first waiting entry of each counted box in delivery order (one seek of the claim
    #: index per box): when the message the box's consumers get next came in.
    _heads_query = sa.text(
        "SELECT d.box, (SELECT e.seq FROM b2b_entries e WHERE e.box = d.box AND e.state = 0 "
        "ORDER BY e.priority DESC, e.seq LIMIT 1) FROM (SELECT DISTINCT box FROM b2b_box_depth) d"
    )

    # ------------------------------------------------------------ operators' actions

    def observe_commits(self, observer: Callable[[float, int], None] | None) -> None:
        self._commit_observer = observer
        if self._writer is not None:
            self._writer.on_commit = observer

    def consumer_counts(self, counts: Callable[[], dict[str, int]]) -> None:
        self._consumer_counts = counts

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
            refs = (
                batch.conn.execute(
                    entries.delete()
                    .where(
                        entries.c.id.in_(
                            sa.select(entries.c.id).where(entries.c.box == box, _WAITING).limit(5000).scalar_subquery()
                        )
                    )
                    .returning(entries.c.message)
                )
                .scalars()
                .all()
            )
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
                sa.select(*_CLAIMED).where(_WAITING, _EXPIRING, entries.c.expiration <= now).limit(10_000)
            ).all()
            if rows:
                self._expire_rows(batch, rows)
            batch.conn.execute(
                expired_table.delete().where(expired_table.c.at < now - int(self.expired_retention * 1000))
            )
            return len(rows)

        return self._write(op) + self._mem.sweep_expired(now)


def _finish(memory_part: Callable[[], None], callback: Callable[[BaseException | None], None]) -> None:
    """The end of an asynchronous commit once its SQL part is durable: its memory-tier part, then the callback."""
    try:
        memory_part()
    except BaseException as error:  # the caller hears of it
        callback(error)
        return
    callback(None)
