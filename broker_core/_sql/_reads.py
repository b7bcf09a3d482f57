"""The SQL store's reads: where messages are, browsing, pages of a queue
for operators, one message, and the statistics of every box."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import lz4.frame
import sqlalchemy as sa

from .._envelope import Envelope
from .._store import DestinationStats, StoredMessage
from ..clock import now_ms
from . import _codec
from ._common import _IN_FLIGHT, _JOINED, _MESSAGE_COLS, _WAITING, DEQ, DLQ, ENQ, EXP, RED
from ._schema import box_counters, box_depth, consumers, entries, messages, subscriptions


class _Reads:
    """Part of :class:`SQLStore`: reads on its engine, outside the writer."""

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

    def browse(self, box: str, selector: str | None) -> Iterator[Envelope]:
        compiled = self._selector(selector)
        now = now_ms()
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(entries.c.priority, entries.c.expiration, *_MESSAGE_COLS)
                .select_from(_JOINED)
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
            totals = dict(
                conn.execute(
                    sa.select(box_depth.c.box, sa.func.sum(box_depth.c.entries)).group_by(box_depth.c.box)
                ).all()
            )
            flying = dict(
                conn.execute(sa.select(entries.c.box, sa.func.count()).where(_IN_FLIGHT).group_by(entries.c.box)).all()
            )
            heads = dict(conn.execute(self._heads_query).all()) if totals else {}
            subs = dict(conn.execute(sa.select(subscriptions.c.box, subscriptions.c.topic)).all())
            shared = {
                row[0]: row[1:]
                for row in conn.execute(
                    sa.select(
                        box_counters.c.box,
                        box_counters.c.enqueued,
                        box_counters.c.dequeued,
                        box_counters.c.expired,
                        box_counters.c.dead_lettered,
                        box_counters.c.redelivered,
                    )
                ).all()
            }
            others = dict(
                conn.execute(
                    sa.select(consumers.c.box, sa.func.sum(consumers.c.consumers))
                    .where(consumers.c.instance != self.instance_id)
                    .group_by(consumers.c.box)
                ).all()
            )
            conn.rollback()
        waiting = [
            (box, max(0, int(total) - flying.get(box, 0)), heads.get(box)) for box, total in totals.items() if total
        ]
        depth = {box: (n, oldest) for box, n, oldest in waiting}
        memory = {s.name: s for s in self._mem.stats()}
        names = (
            set(depth) | set(flying) | set(subs) | set(memory) | set(self._counters.boxes()) | set(shared) | set(others)
        )  # a box only another process consumes from
        out = []
        for name in sorted(names):
            db_depth, oldest_seq = depth.get(name, (0, None))
            mem = memory.get(name)
            counts = [a + b for a, b in zip(self._counters.get(name), shared.get(name, (0, 0, 0, 0, 0)), strict=False)]
            oldest = oldest_seq // 1000 if oldest_seq is not None else None  # seqs are microseconds
            if mem is not None and mem.oldest is not None:
                oldest = mem.oldest if oldest is None else min(oldest, mem.oldest)
            out.append(
                DestinationStats(
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
                )
            )
        return out

    #: The listing columns of a browse page: the entry, the message's headers and properties, the body's
    #: stored length and first bytes (an LZ4 frame's header says the original size), not the body itself.
    _PAGE_COLUMNS = (
        entries.c.id,
        entries.c.priority,
        entries.c.seq,
        entries.c.expiration,
        entries.c.delivery_count,
        messages.c.message_id,
        messages.c.destination,
        messages.c.delivery_mode,
        messages.c.timestamp,
        messages.c.correlation_id,
        messages.c.reply_to,
        messages.c.type,
        messages.c.properties,
        messages.c.kind,
        sa.func.length(messages.c.body),
        sa.func.substr(messages.c.body, 1, 32),
        messages.c.origin,
    )

    def browse_page(
        self, box: str, selector: str | None, after: tuple[int, ...] | None, limit: int, scan_limit: int
    ) -> tuple[list[StoredMessage], tuple[int, ...] | None]:
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
            out.extend(
                StoredMessage(m.box, m.envelope, m.state, m.delivery_count, m.size, (1, *m.position)) for m in rest
            )
            return out, None if more is None else (1, *more)
        return out, position

    def _page_rows(
        self, conn: sa.Connection, box: str, after: tuple[int, ...] | None, n: int, with_body: bool
    ) -> list[Any]:
        columns = list(self._PAGE_COLUMNS) + ([messages.c.body] if with_body else [])
        base = sa.select(*columns).select_from(_JOINED).where(entries.c.box == box, _WAITING)
        rows: list[Any] = []
        if after is not None:
            _, rank, seq, entry_id = after
            priority = 9 - rank
            rows = conn.execute(
                base.where(
                    entries.c.priority == priority, sa.tuple_(entries.c.seq, entries.c.id) > sa.tuple_(seq, entry_id)
                )
                .order_by(entries.c.seq, entries.c.id)
                .limit(n)
            ).all()
            if len(rows) >= n:
                return rows
            base = base.where(entries.c.priority < priority)
        rows += conn.execute(
            base.order_by(entries.c.priority.desc(), entries.c.seq, entries.c.id).limit(n - len(rows))
        ).all()
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
        plain_kind = kind[: -len(_codec.COMPRESSED)] if kind.endswith(_codec.COMPRESSED) else kind
        if with_body:
            plain_kind, body = _codec.read_body(kind, row[17])
        env = Envelope(
            row[5],
            _codec.destination(row[6]),
            row[7],
            row[1],
            row[3],
            row[8],
            row[9],
            _codec.destination(row[10]),
            row[11],
            _codec.decode_properties(row[12]),
            plain_kind,
            body,
            row[16],
        )
        return env, size

    def find(self, box: str, message_id: str) -> StoredMessage | None:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(
                    entries.c.state,
                    entries.c.delivery_count,
                    entries.c.priority,
                    entries.c.seq,
                    entries.c.id,
                    entries.c.expiration,
                    *_MESSAGE_COLS,
                )
                .select_from(_JOINED)
                .where(messages.c.message_id == message_id, entries.c.box == box)
                .limit(1)
            ).first()
            conn.rollback()
        if row is None:
            return self._mem.find(box, message_id)
        env = _codec.row_envelope(row, row.priority, row.expiration, 6)
        from .._store import body_size

        return StoredMessage(
            box,
            env,
            "in_flight" if row.state == 1 else "pending",
            row.delivery_count,
            body_size(env),
            (0, 9 - row.priority, row.seq, row.id),
        )
