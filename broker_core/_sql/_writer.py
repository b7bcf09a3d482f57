"""Group commit: one writer thread per store turns concurrent writes into
shared transactions.

Callers submit operations (functions of a :class:`Batch`); the writer takes
everything queued, runs it in one transaction, commits once, then wakes the
callers. Under load a commit carries many operations, so the cost of the
fsync is shared. A failure that the database may recover from (connection
lost, server restarting, SQLite busy) is retried with backoff for
``retry_for`` seconds before the callers get :class:`StoreUnavailableError`;
any other failure is isolated by re-running the operations one by one, so
only the faulty one fails.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from .._errors import StoreError, StoreUnavailableError
from .._waiters import ThreadWaiter
from ..compression import forget_frames

log = logging.getLogger(__name__)

#: Weight of the newest gap in the writer's moving average of the gaps between
#: asynchronous operations (see GroupCommitter's ``commit_delay``).
DENSE_GAP_WEIGHT = 0.125
#: A commit delay ends early once no operation has arrived for this fraction
#: of it: the stream has paused (its submitters are waiting for this commit).
QUIET_FRACTION = 0.25


class Batch:
    """What an operation sees: the connection of the current transaction, and
    where to record boxes that got messages (woken after the commit)."""

    __slots__ = ("conn", "touched", "after_commit", "inserts", "ordered", "number", "depth")

    def __init__(self, conn: sa.Connection, number: int = 0) -> None:
        self.conn = conn
        self.number = number  # grows with every transaction of this writer (commit marks)
        self.ordered = False  # whether this transaction holds the commit-order lock (PostgreSQL)
        self.touched: set[str] = set()
        self.after_commit: list[Callable[[], None]] = []
        self.inserts: list[Any] = []  # messages to store, written together just before the commit
        self.depth: dict[str, int] = {}  # entries added (removed: negative) per box, recorded at the commit


class _Op:
    __slots__ = ("fn", "waiter", "callback", "durable", "streamed", "result", "error", "done")

    def __init__(
        self,
        fn: Callable[[Batch], Any],
        waiter: ThreadWaiter | None,
        callback: Callable[[Any, BaseException | None], None] | None = None,
        durable: bool = True,
        streamed: bool = False,
    ) -> None:
        self.fn = fn
        self.durable = durable
        self.waiter = waiter
        self.callback = callback
        self.streamed = streamed  # counted in the writer's stream of operations nobody blocks on
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False


def is_retryable(error: BaseException) -> bool:
    """Connection-level or lock-contention failures, which a retry may cure."""
    if isinstance(error, sa_exc.DBAPIError) and error.connection_invalidated:
        return True
    if isinstance(error, (sa_exc.OperationalError, sa_exc.InterfaceError)):
        return True
    text = str(error).lower()
    return "database is locked" in text or "could not serialize" in text or "deadlock detected" in text


class GroupCommitter:
    """The writer thread: runs the operations submitted to it in as few
    transactions as it can, one at a time.

    Hooks: ``begin(conn, durable)`` at the start of each transaction (the
    sync level); ``before_commit(batch)`` last in it (batched inserts,
    NOTIFY, commit marks); ``on_touched(boxes)`` after each commit;
    ``on_reconnect()`` after a lost connection was replaced;
    ``serialize()``, a context manager held around each transaction (SQLite:
    the processes' write turn); ``after_turn(conn)`` after it, outside the
    turn, once its callers are woken (SQLite: checkpoints);
    ``was_committed(number)``, asked when a COMMIT failed without an answer,
    so that a transaction that did commit is not run twice.

    ``slow_commit`` (s): a longer transaction is logged with where its time
    went (another process's turn, the operations, the COMMIT) and counted.

    ``commit_delay`` (s): while operations stream in from submitters that do
    not block, the writer waits this long before the next batch so that one
    commit (one fsync, one turn) carries more of them. It is a stream when
    one was queued as the last transaction ended, or when the weighted mean
    gap (:data:`DENSE_GAP_WEIGHT`) is under half the delay. A blocking
    caller never waits for it, and the wait ends once nothing has come for
    :data:`QUIET_FRACTION` of the delay.
    """

    def __init__(
        self,
        engine: sa.Engine,
        *,
        begin: Callable[[sa.Connection, bool], None],
        before_commit: Callable[[Batch], None] | None = None,
        on_touched: Callable[[set[str]], None] | None = None,
        on_reconnect: Callable[[], None] | None = None,
        serialize: Callable[[], ContextManager[Any]] | None = None,
        after_turn: Callable[[sa.Connection], None] | None = None,
        was_committed: Callable[[int], bool] | None = None,
        max_batch: int = 2000,
        retry_for: float = 30.0,
        commit_delay: float = 0.0,
        slow_commit: float = 0.5,
    ) -> None:
        self._engine = engine
        self._serialize = serialize or contextlib.nullcontext
        self._after_turn = after_turn
        self._was_committed = was_committed
        self._numbers = itertools.count(1)
        self._in_doubt: Batch | None = None  # a transaction whose COMMIT failed without an answer
        self._begin = begin
        self._before_commit = before_commit
        self._on_touched = on_touched
        self._on_reconnect = on_reconnect
        self._max_batch = max_batch
        self.commit_delay = commit_delay
        self._queued_async = 0  # queued operations whose submitter did not block (the others wait for them)
        self._delaying = False
        # moving average of the gaps between asynchronous submits (s), and when the last one came
        self._async_gap = 10 * commit_delay  # as sparse as a gap can count
        self._last_async = time.monotonic()
        self.retry_for = retry_for
        self._ops: collections.deque[_Op] = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._conn: sa.Connection | None = None
        self.commits = 0
        self.operations = 0
        self.slow_commit = slow_commit
        #: called with (seconds, operations) after each committed transaction (operators' metrics)
        self.on_commit: Callable[[float, int], None] | None = None
        #: transactions that took longer than ``slow_commit``, and the longest of them (s)
        self.slow_commits = 0
        self.slowest_commit = 0.0
        self._thread = threading.Thread(target=self._run, name="b2b-sql-writer", daemon=True)
        self._thread.start()

    def submit(
        self,
        fn: Callable[[Batch], Any],
        wait: bool = True,
        callback: Callable[[Any, BaseException | None], None] | None = None,
        durable: bool = True,
        awaited: bool = False,
    ) -> Any:
        """Run ``fn`` in the next transaction; with ``wait``, return its result
        once committed (or raise its error); with ``callback``, return at once
        and call ``callback(result, error)`` from the writer thread when done.
        A batch of only non-``durable`` operations commits without waiting for
        the disk (still safe if the process is killed; not if the machine
        loses power): for claims and background bookkeeping. ``awaited``: a
        ``callback`` someone waits for (an event loop's claim), which, like a
        blocking submit, never waits for ``commit_delay``."""
        if self._closed:
            raise StoreError("the store is closed")
        if callback is not None:
            wait = False
        op = _Op(fn, ThreadWaiter() if wait else None, callback, durable, streamed=not (wait or awaited))
        with self._cond:
            self._ops.append(op)
            if op.streamed:
                self._queued_async += 1
                now = time.monotonic()
                # a gap longer than 10 delays counts as 10: a burst after a quiet spell counts as dense after about 23 arrivals
                gap = min(now - self._last_async, 10 * self.commit_delay)
                self._last_async = now
                self._async_gap += (gap - self._async_gap) * DENSE_GAP_WEIGHT
            if len(self._ops) == 1 or (self._delaying and not op.streamed):
                self._cond.notify()
        if not wait:
            return None
        while not op.done:
            op.waiter.wait(1.0)
            if not op.done and not self._thread.is_alive():
                raise StoreError("the store's writer thread has stopped")
        if op.error is not None:
            raise op.error
        return op.result

    def close(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout)
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass

    # ------------------------------------------------------------ the thread

    def _connection(self) -> sa.Connection:
        if self._conn is None:
            self._conn = self._engine.connect()
        return self._conn

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.invalidate()
                conn.close()
            except Exception:
                pass

    def _run(self) -> None:
        while True:
            with self._cond:
                streaming = self._queued_async > 0  # queued while the last transaction ran
                while not self._ops and not self._closed:
                    self._cond.wait()
                if not self._ops and self._closed:
                    return
                dense = 2 * self._async_gap < self.commit_delay  # two more are due within the delay
                if (
                    (streaming or dense)
                    and self.commit_delay > 0
                    and len(self._ops) == self._queued_async
                    and len(self._ops) < self._max_batch
                    and not self._closed
                ):
                    self._delaying = True  # until the delay is over, or a blocking submit() notifies
                    self._delay()
                    self._delaying = False
                ops = []
                take = min(len(self._ops), self._max_batch)
                for _ in range(take):
                    op = self._ops.popleft()
                    if op.streamed:
                        self._queued_async -= 1
                    ops.append(op)
            self._execute(ops)

    def _delay(self) -> None:
        """Wait (holding ``_cond``) up to ``commit_delay`` for more operations, while they keep coming:
        until a quiet spell of ``QUIET_FRACTION`` of it, a blocking submit, or close()."""
        deadline = time.monotonic() + self.commit_delay
        quiet = self.commit_delay * QUIET_FRACTION
        while True:
            queued = len(self._ops)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._cond.wait(min(quiet, remaining))
            if (
                len(self._ops) == queued
                or len(self._ops) != self._queued_async
                or self._closed
                or len(self._ops) >= self._max_batch
            ):
                return

    def _transaction(self, ops: list[_Op]) -> set[str]:
        try:
            return self._run_transaction(ops)
        finally:
            forget_frames()  # the bodies' frames made for this transaction (see broker_core.compression)

    def _run_transaction(self, ops: list[_Op]) -> set[str]:
        conn = self._connection()
        batch = Batch(conn, next(self._numbers))
        asked = time.perf_counter()
        with self._serialize():
            committing = False
            try:
                turn = time.perf_counter()
                self._begin(conn, any(op.durable for op in ops))
                if not conn.in_transaction():  # open now: operations may use the driver's cursor directly
                    conn.begin()
                for op in ops:
                    op.result = op.fn(batch)
                if self._before_commit is not None:
                    self._before_commit(batch)
                committing = True
                ran = time.perf_counter()
                conn.commit()
                committed = time.perf_counter()
            except BaseException as error:
                if committing and self._was_committed is not None and is_retryable(error):
                    self._in_doubt = batch
                try:
                    conn.rollback()
                except Exception:
                    self._drop_connection()
                raise
        # committed: the warning is written outside the turn, and nothing in it can undo the commit's answer
        self._timed(len(ops), asked, turn, ran, committed)
        return self._after_commit(batch)

    def _timed(self, count: int, asked: float, turn: float, ran: float, committed: float) -> None:
        took = committed - asked
        observer = self.on_commit
        if observer is not None:
            try:
                observer(took, count)
            except Exception:  # an observer's failure is not the commit's
                log.exception("commit observer failed")
        if took <= self.slow_commit or self.slow_commit <= 0:
            return
        self.slow_commits += 1
        self.slowest_commit = max(self.slowest_commit, took)
        log.warning(
            "slow commit: a transaction of %d operations took %.0f ms: %.0f ms waiting for the write "
            "turn (held by another process), %.0f ms running the operations, %.0f ms in COMMIT "
            "(mostly the disk's sync); its callers waited that long",
            count,
            took * 1e3,
            (turn - asked) * 1e3,
            (ran - turn) * 1e3,
            (committed - ran) * 1e3,
        )

    @staticmethod
    def _after_commit(batch: Batch) -> set[str]:
        for callback in batch.after_commit:
            try:
                callback()
            except Exception:
                log.exception("after-commit callback failed")
        return batch.touched

    def _settle_doubt(self) -> set[str] | None:
        """After a COMMIT failed without an answer: the touched boxes if it
        did commit after all (the operations' results stand), else None (the
        transaction rolled back: run it again). Raises while the database
        cannot say."""
        batch = self._in_doubt
        if batch is None or self._was_committed is None:
            return None
        committed = self._was_committed(batch.number)
        self._in_doubt = None
        if not committed:
            return None
        log.warning("a commit whose answer was lost had succeeded; not running it again")
        return self._after_commit(batch)

    def _execute(self, ops: list[_Op]) -> None:
        deadline = time.monotonic() + self.retry_for
        delay = 0.01
        lost = False
        while True:
            try:
                if lost and self._on_reconnect is not None:
                    self._on_reconnect_safely()
                touched = self._settle_doubt() if self._in_doubt is not None else None
                if touched is None:
                    touched = self._transaction(ops)
                self.commits += 1
                self.operations += len(ops)
                self._finish(ops, None)
                if touched and self._on_touched is not None:
                    self._on_touched(touched)
                if self._after_turn is not None and self._conn is not None:
                    try:
                        self._after_turn(self._conn)
                    except Exception:  # housekeeping: the transaction itself is done and answered
                        log.warning("store housekeeping after a commit failed", exc_info=True)
                return
            except BaseException as error:  # sorted below
                if is_retryable(error) and time.monotonic() < deadline and not self._closed:
                    log.warning("store write failed (%s); retrying in %.2f s", str(error).splitlines()[0][:200], delay)
                    self._drop_connection()
                    lost = True
                    time.sleep(delay * (1 + random.random()))
                    delay = min(delay * 2, 1.0)
                    continue
                in_doubt, self._in_doubt = self._in_doubt is not None, None
                if is_retryable(error):
                    effect = (
                        "the answer to its last commit was lost, so this call may or may not have taken "
                        "effect: check (Broker.message_status for sends) before retrying"
                        if in_doubt
                        else "nothing of this call took effect, retry later"
                    )
                    self._finish(
                        ops,
                        StoreUnavailableError(
                            f"the database is unavailable ({str(error).splitlines()[0][:300]}); {effect}"
                        ),
                    )
                    return
                if len(ops) > 1:
                    for op in ops:  # isolate the faulty operation
                        self._execute([op])
                    return
                wrapped = (
                    error
                    if isinstance(error, StoreError)
                    else StoreError(f"store write failed: {type(error).__name__}: {str(error)[:500]}")
                )
                if not isinstance(error, Exception):
                    wrapped = error
                self._finish(ops, wrapped)
                return

    def _on_reconnect_safely(self) -> None:
        try:
            self._on_reconnect()
        except Exception:
            log.exception("store reconnect hook failed")
            raise

    @staticmethod
    def _finish(ops: list[_Op], error: BaseException | None) -> None:
        for op in ops:
            if op.done:
                continue
            if error is not None:
                op.error = error
                op.result = None
            op.done = True
            if op.waiter is not None:
                op.waiter.wake()
            if op.callback is not None:
                try:
                    op.callback(op.result, op.error)
                except Exception:
                    log.exception("store completion callback failed")
            elif op.error is not None and op.waiter is None:
                log.warning("a background store write failed: %s", op.error)
