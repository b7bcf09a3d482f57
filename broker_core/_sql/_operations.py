"""The SQL store's operations: functions of a writer transaction (a
:class:`Batch`) that insert, claim, release, dead-letter and expire entries,
and hand new messages to the consumers of this process that wait for them."""

from __future__ import annotations

import collections
import os
import socket
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from .._envelope import Envelope
from .._store import Delivery, dead_letter_envelope, expired_envelope
from ..clock import now_ms
from . import _codec
from ._common import _CHANNEL, _CLAIMED, _COPY_COLS, _IN_FLIGHT, _WAITING, DLQ, ENQ, EXP, RED, _body_size, _Claimed
from ._reader import _SQLReader
from ._schema import box_depth, entries, instances, subscriptions
from ._writer import Batch


class _Operations:
    """Part of :class:`SQLStore`: what runs in its writer's transactions."""

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
        "ON CONFLICT (instance, box) DO UPDATE SET entries = b2b_box_depth.entries + excluded.entries) " + _MARK
    )

    def _mark_commit(self, batch: Batch) -> None:
        """Record this transaction's number in our instance row (PostgreSQL):
        if the answer to COMMIT is lost, :meth:`_was_committed` tells whether
        it happened, so the writer neither loses nor repeats it. The same
        statement records the transaction's depth deltas."""
        conn = batch.conn
        changed = [(box, n) for box, n in sorted(batch.depth.items()) if n]
        if changed:
            marked = self._sql.run(
                conn,
                self._MARK_WITH_DEPTH,
                (self.instance_id, [b for b, _ in changed], [n for _, n in changed], batch.number, self.instance_id),
            )
        else:
            marked = self._sql.run(conn, self._MARK, (batch.number, self.instance_id))
        if not marked and not self._stop.is_set():  # presumed dead and reaped meanwhile: register again
            now = now_ms()
            conn.execute(
                instances.insert(),
                {
                    "id": self.instance_id,
                    "host": socket.gethostname()[:200],
                    "pid": os.getpid(),
                    "started": now,
                    "heartbeat": now,
                    "last_commit": batch.number,
                },
            )

    def _was_committed(self, number: int) -> bool:
        with self.engine.connect() as conn:
            last = conn.execute(sa.select(instances.c.last_commit).where(instances.c.id == self.instance_id)).scalar()
            conn.rollback()
        return last is not None and last >= number

    def _reserve_ids(self, conn: sa.Connection, table: str, n: int) -> list[int]:
        """``n`` new ids of ``table`` in one query (the write lock is held)."""
        if self._pg:
            rows = self._sql.run(
                conn, f"SELECT nextval(pg_get_serial_sequence('{table}', 'id')) FROM generate_series(1, %s)", (n,)
            )
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
                        sa.select(
                            subscriptions.c.box,
                            subscriptions.c.selector,
                            subscriptions.c.no_local,
                            subscriptions.c.local_origin,
                        ).where(subscriptions.c.topic == key)
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
        for (env, boxes), message in zip(placed, ids, strict=False):
            message_rows.append(message_values(env, message, compress_over))
            for box in boxes:
                pending.append((box, seq, env.priority, env.expiration, message, env))
            seq += 1
        entry_ids = self._reserve_ids(conn, "b2b_entries", len(pending))
        handed = self._pick_waiting_readers(pending) if self._waiting_boxes else None
        if handed:
            owner = self.instance_id
            rows = [
                (entry_id, box, s, prio, exp, 1, 0, owner, 1, message)
                if i in handed
                else (entry_id, box, s, prio, exp, 0, 0, None, 0, message)
                for i, (entry_id, (box, s, prio, exp, message, _)) in enumerate(zip(entry_ids, pending, strict=False))
            ]
            by_reader: dict[_SQLReader, list[Delivery]] = {}
            for i, reader in handed.items():
                box, _, _, _, _, env = pending[i]
                by_reader.setdefault(reader, []).append(Delivery(box, entry_ids[i], env, 1))
            batch.after_commit.append(lambda: self._hand_over(by_reader))
        else:
            rows = [
                (entry_id, box, s, prio, exp, 0, 0, None, 0, message)
                for entry_id, (box, s, prio, exp, message, _) in zip(entry_ids, pending, strict=False)
            ]
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
            self._sql.run(
                batch.conn,
                f"INSERT INTO b2b_box_depth (instance, box, entries) VALUES ({mark}, {mark}, "
                f"{mark}) ON CONFLICT (instance, box) DO UPDATE SET "
                "entries = b2b_box_depth.entries + excluded.entries",
                changed,
                many=True,
            )

    def _fold_depth(self, batch: Batch, owner: str) -> None:
        """Fold the depth deltas of a broker instance that is gone into the base rows (instance ``''``).
        DELETE ... RETURNING takes them, so two processes folding the same instance cannot both count it."""
        rows = batch.conn.execute(
            box_depth.delete().where(box_depth.c.instance == owner).returning(box_depth.c.box, box_depth.c.entries)
        ).all()
        changed = [("", box, n) for box, n in rows if n]
        if changed:
            mark = self._sql._mark
            self._sql.run(
                batch.conn,
                f"INSERT INTO b2b_box_depth (instance, box, entries) VALUES ({mark}, {mark}, "
                f"{mark}) ON CONFLICT (instance, box) DO UPDATE SET "
                "entries = b2b_box_depth.entries + excluded.entries",
                changed,
                many=True,
            )

    _RECENT_COUNT = 16384

    _RECENT_BYTES = 32 << 20

    def _remember(self, ids: Sequence[int], placed: Sequence[tuple[Envelope, Sequence[str]]]) -> None:
        """After the commit that stored them: keep the envelopes for claims by this process's consumers
        (none for a queue that only other processes consume, or none yet)."""
        readers = self._waiting_boxes  # every box with a consumer in this process
        if not readers:
            return
        recent = self._recent
        size = self._recent_bytes
        for message, (env, boxes) in zip(ids, placed, strict=False):
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

    def _pick_waiting_readers(
        self, pending: Sequence[tuple[str, int, int, int, int, Envelope]]
    ) -> dict[int, _SQLReader]:
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

    def _hand_over(self, by_reader: dict[_SQLReader, list[Delivery]], wake: bool = True) -> None:
        """After the commit: give the pre-claimed entries to their readers (and, with *wake*, wake their
        consumers); a reader closed meanwhile gets nothing and the entries go back."""
        give_back: list[int] = []
        for reader, deliveries in by_reader.items():
            deliveries.sort(key=lambda d: (-d.envelope.priority, d.ref))
            if not reader._accept(deliveries, wake):
                give_back.extend(d.ref for d in deliveries)
        if give_back:
            self._write(
                lambda b: self._op_release(b, give_back, "not delivered", self.instance_id, counted=False),
                wait=False,
                durable=False,
            )

    def _register_reader(self, reader: _SQLReader) -> None:
        with self._readers_lock:
            self._waiting_boxes.setdefault(reader._box, []).append(reader)

    def _unregister_reader(self, reader: _SQLReader) -> None:
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
            refs += (
                batch.conn.execute(entries.delete().where(entries.c.box == box, state).returning(entries.c.message))
                .scalars()
                .all()
            )
        # the box is gone: so are its counts (every instance's), and this transaction's
        batch.depth.pop(box, None)
        batch.conn.execute(box_depth.delete().where(box_depth.c.box == box))
        self._collect(batch, refs)

    def _op_release(
        self, batch: Batch, ids: list[int], reason: str, owner: str | None, *, counted: bool = True
    ) -> None:
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
                why = (
                    f"delivered {row.delivery_count} times without acknowledgement "
                    f"(max_deliveries={policy.max_deliveries}); last failure: {reason}"
                )
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
            conn.execute(
                entries.insert().from_select(
                    [*(c.name for c in _COPY_COLS), "state", "ready_at", "owner", "delivery_count"],
                    sa.select(
                        *_COPY_COLS,
                        sa.literal(0),
                        sa.literal(now + delay if delay else 0),
                        sa.null(),
                        sa.literal(count),
                    ).where(entries.c.id == row.id),
                )
            )
            conn.execute(entries.delete().where(entries.c.id == row.id))
            batch.touched.add(row.box)

    def _op_dead_letter(self, batch: Batch, ids: list[int], reason: str) -> None:
        """Move this instance's in-flight entries to their dead-letter queues now."""
        conn = batch.conn
        rows = conn.execute(
            sa.select(*_CLAIMED)
            .where(entries.c.id.in_(ids), entries.c.state == 1, entries.c.owner == self.instance_id)
            .order_by(entries.c.seq)
        ).all()
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
                copy = expired_envelope(
                    _codec.row_envelope(found[row.message], row.priority, row.expiration, 1), self.policy
                )
                if copy is not None:
                    copies.append(copy)
        self._delete_entries(batch, [row.id for row in rows])
        for row in rows:
            batch.after_commit.append(lambda box=row.box: self._counters.add(box, EXP))
        if copies:
            self._insert(batch, copies)

    def _op_claim(
        self, batch: Batch, box: str, limit: int, ids: list[int] | None, now: int
    ) -> tuple[list[Delivery], int | None]:
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
        return [
            (entry_box, entry_id, count, priority, expiration, recent.get(message) or stored[message])
            for entry_id, entry_box, count, _, priority, expiration, message in rows
        ], None
