"""The store's hot statements, as driver SQL built once per dialect."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from . import _codec

__all__ = ["_Statements"]


class _Statements:
    """The hot statements, built once per dialect (building and cache-keying
    SQLAlchemy constructs per call cost more than running them), and run on
    the driver's cursor (:meth:`run`)."""

    def __init__(self, postgres: bool, driver_error: type[Exception]) -> None:
        self._driver_error = driver_error
        claimed = "id, box, delivery_count, seq, priority, expiration, message"
        lock = " FOR UPDATE SKIP LOCKED" if postgres else ""
        self._postgres = postgres
        self._mark = mark = "%s" if postgres else "?"
        #: Claims, through the driver (rows as plain tuples in ``_CLAIMED``
        #: order): the next ``limit`` ready entries of a box (owner, box, now,
        #: limit), or given ids (``by_ids(conn, "claim", ids, now, before=(owner,))``),
        #: or the first ``limit`` of given ids (``"claim_some"``, ``more=(now, limit)``).
        self.claim_next = (
            f"UPDATE b2b_entries SET state = 1, owner = {mark}, delivery_count = delivery_count + 1 "
            f"WHERE id IN (SELECT id FROM b2b_entries WHERE box = {mark} AND state = 0 AND ready_at <= {mark} "
            f"ORDER BY priority DESC, seq LIMIT {mark}{lock}) RETURNING {claimed}"
        )
        self.next_ready = (
            f"SELECT min(ready_at) FROM b2b_entries WHERE box = {mark} AND state = 0 AND ready_at > {mark}"
        )
        #: Statements over a list of ids, run through the driver: ``IN (?, ...)``
        #: on SQLite (text cached per length), ``= ANY(%s)`` on PostgreSQL.
        self._by_ids = {
            "claim": f"UPDATE b2b_entries SET state = 1, owner = {mark}, delivery_count = delivery_count + 1 "
            f"WHERE id {{ids}} AND state = 0 AND ready_at <= {mark} RETURNING {claimed}",
            # the first ``limit`` of the given ids still waiting (a selective consumer's candidates,
            # some of which competing consumers may have taken): (owner, ids..., now, limit)
            "claim_some": f"UPDATE b2b_entries SET state = 1, owner = {mark}, delivery_count = delivery_count + 1 "
            f"WHERE id IN (SELECT id FROM b2b_entries WHERE id {{ids}} AND state = 0 "
            f"AND ready_at <= {mark} ORDER BY priority DESC, seq LIMIT {mark}{lock}) "
            f"RETURNING {claimed}",
            "messages": f"SELECT id, {', '.join(_codec.MESSAGE_COLUMNS)} FROM b2b_messages WHERE id {{ids}}",
            "message_ids": "SELECT id, message_id FROM b2b_messages WHERE id {ids}",
            # by JMS message id (Broker.message_status)
            "entries_of": "SELECT m.message_id, e.box, e.state FROM b2b_messages m "
            "JOIN b2b_entries e ON e.message = m.id WHERE m.message_id {ids}",
            "expired_of": "SELECT message_id, box FROM b2b_expired WHERE message_id {ids}",
            "delete_owned": "DELETE FROM b2b_entries WHERE id {ids} AND owner = {p} RETURNING message, box",
            "delete_any": "DELETE FROM b2b_entries WHERE id {ids} RETURNING message, box",
            "collect": "DELETE FROM b2b_messages WHERE id {ids} "
            "AND NOT EXISTS (SELECT 1 FROM b2b_entries e WHERE e.message = b2b_messages.id)",
        }
        self._by_ids_cache: dict[tuple[str, int], str] = {}
        #: A selective reader's scan of the rows it has not seen yet (entry
        #: id, priority, seq, ready_at, expiration, then the selectable
        #: message headers and properties; the body too for XPATH selectors).
        scan_cols = (
            "e.id, e.priority, e.seq, e.ready_at, e.expiration, m.message_id, m.timestamp, "
            "m.correlation_id, m.type, m.delivery_mode, m.properties, m.kind"
        )
        self.scan = {
            with_body: f"SELECT {scan_cols}{', m.body' if with_body else ''} FROM b2b_entries e "
            f"JOIN b2b_messages m ON m.id = e.message WHERE e.box = {mark} AND e.state = 0 "
            f"AND e.id > {mark} ORDER BY e.id LIMIT 5000"
            for with_body in (False, True)
        }
        #: Inserts through the driver's executemany with tuples (SQLAlchemy's
        #: per-row parameter processing cost as much as the insert itself).
        self.message_columns = ("id", *_codec.MESSAGE_COLUMNS)
        self.entry_columns = (
            "id",
            "box",
            "seq",
            "priority",
            "expiration",
            "state",
            "ready_at",
            "owner",
            "delivery_count",
            "message",
        )
        self.insert_sql = {
            "messages": f"INSERT INTO b2b_messages ({', '.join(self.message_columns)}) "
            f"VALUES ({', '.join([mark] * len(self.message_columns))})",
            "entries": f"INSERT INTO b2b_entries ({', '.join(self.entry_columns)}) "
            f"VALUES ({', '.join([mark] * len(self.entry_columns))})",
        }

    def by_ids(
        self, conn: sa.Connection, name: str, ids: Sequence[int], *more: Any, before: tuple[Any, ...] = ()
    ) -> list[tuple[Any, ...]]:
        """Run statement ``name`` over ``ids`` (in chunks of 500; row ids, or
        message ids for the ``*_of`` statements) with the ``before``
        parameters ahead of the list and ``more`` after it, in the open
        transaction of ``conn``; the rows it returns, as tuples."""
        out: list[tuple[Any, ...]] = []
        for start in range(0, len(ids), 500):
            chunk = list(ids[start : start + 500])
            if self._postgres:
                key = (name, 0)
                params: tuple[Any, ...] = (*before, chunk, *more)
            else:
                key = (name, len(chunk))
                params = (*before, *chunk, *more)
            statement = self._by_ids_cache.get(key)
            if statement is None:
                ids_sql = "= ANY(%s)" if self._postgres else f"IN ({', '.join('?' * len(chunk))})"
                statement = self._by_ids[name].format(ids=ids_sql, p=self._mark)
                if len(self._by_ids_cache) < 2000:
                    self._by_ids_cache[key] = statement
            rows = self.run(conn, statement, params)
            if rows:
                out.extend(rows)
        return out

    def run(self, conn: sa.Connection, sql: str, params: Any, many: bool = False) -> list[tuple[Any, ...]] | None:
        """Run ``sql`` in the open transaction of ``conn`` on the driver's own
        cursor: the rows it returns (tuples), or None. SQLAlchemy's
        ``exec_driver_sql`` (execution context, events, result object) adds
        its own cost to every statement, several per writer transaction. A
        driver error is raised as SQLAlchemy would raise it (the writer sorts
        retryable ones by SQLAlchemy's classes)."""
        cursor = conn.connection.dbapi_connection.cursor()
        try:
            if many:
                cursor.executemany(sql, params)
            else:
                cursor.execute(sql, params)
            return cursor.fetchall() if cursor.description is not None else None
        except self._driver_error as exc:
            raise sa.exc.DBAPIError.instance(sql, params, exc, self._driver_error) from exc
        finally:
            cursor.close()

    def tombstones(self, conn: sa.Connection, rows: list[tuple[str, str, int]]) -> None:
        """Remember expired messages: (message_id, box, at)."""
        mark = self._mark
        self.run(
            conn,
            f"INSERT INTO b2b_expired (message_id, box, at) VALUES ({mark}, {mark}, {mark}) ON CONFLICT DO NOTHING",
            rows,
            many=True,
        )

    def insert_rows(self, conn: sa.Connection, table: str, rows: list[tuple[Any, ...]]) -> None:
        """Insert tuples in column order with the driver's executemany (one
        prepared statement stepped per row on SQLite, a pipeline on psycopg:
        no statement text to build and parse per batch, unlike multi-row
        VALUES statements, and no COPY stream to set up)."""
        self.run(conn, self.insert_sql[table], rows, many=True)
