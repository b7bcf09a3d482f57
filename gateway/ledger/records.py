"""The document ledger: one row per accepted document (see :mod:`ledger_contract.tables`).

Writes never run on their own connection: they are functions of the store
transaction's SQLAlchemy connection, run by the broker store's writer.

* :meth:`Ledger.insert` runs through ``in_transaction`` in the very commit
  that stores the document's message, so a document is recorded if and only
  if it was enqueued. Its ``idempotency_key`` is unique: a second document
  with the same key makes the insert fail with :class:`DuplicateDocumentError`,
  which rolls back that commit, message included. Concurrent duplicates
  therefore enqueue once: the database's unique constraint decides, and the
  loser reads the winner's row. The row keeps the document's ``digest``, by
  which the loser tells a retry of the winner (replayed) from another
  document under the same key (refused). A key that a tombstone holds (its
  document was purged by retention, :mod:`ledger_contract.retention`) is refused the
  same way: the insert checks ``b2b_ledger_tombstones`` in the same
  statement (PostgreSQL) or just before it in the same transaction (SQLite),
  and the retention purge runs through the same writer (on PostgreSQL under
  the same lock), so a purge never lets a replay in between.
* Status changes (:meth:`Ledger.transition`) go through the store's writer
  too (:meth:`broker_core.Broker.write`), so SQLite sees one writer. A
  change applies only from the statuses it lists, and appends a
  ``b2b_ledger_events`` row only when it applied, so racing updaters (the
  reconciler, a reply, a late reply) never move a document backwards.

Reads (:meth:`Ledger.get`, :meth:`Ledger.find`) use the store's engine from
the calling thread; the HTTP handlers call them through ``asyncio.to_thread``.
The ledger's own Alembic chain (:func:`upgrade_ledger`, version table
``b2b_gateway_version``) creates the tables.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from broker_core import StoreError, sql
from broker_core.clock import now_ms
from ledger_contract.tables import documents, events, pack_xml, tombstones, unpack_xml

__all__ = [
    "DuplicateDocumentError",
    "Ledger",
    "LedgerRecord",
    "NewDocument",
    "Tombstone",
    "current_revision",
    "head_revision",
    "now_ms",
    "upgrade_ledger",
]

VERSION_TABLE = "b2b_gateway_version"


class DuplicateDocumentError(StoreError):
    """The idempotency key is taken: a document with it was accepted before.

    A :class:`broker_core.StoreError` so the store's writer hands it back
    as it is (it fails the commit it was raised in, and only that one)."""

    def __init__(self, idempotency_key: str) -> None:
        self.idempotency_key = idempotency_key
        super().__init__("a document with this idempotency key was already accepted")


@dataclass(slots=True)
class NewDocument:
    """What :meth:`Ledger.insert` records for an accepted document."""

    message_id: str
    partner: str
    doc_type: str
    doc_namespace: str
    doc_id: str | None
    idempotency_key: str
    correlation_id: str
    route: str
    destination: str
    received_at: int
    document: bytes
    receipt: str
    facts: str | None = None  # ledger_contract.facts JSON, extracted at intake (None: the warehouse parses the XML)
    facts_version: int | None = None  # the ledger_contract.facts.VERSION that wrote facts
    digest: str | None = None  # of the body as received (gateway.exchange.submission.document_digest)
    auth: str | None = None  # how the partner authenticated (gateway.http.auth.Identity.method)


@dataclass(slots=True)
class LedgerRecord:
    """One ``b2b_ledger`` row (``history`` filled by :meth:`Ledger.get` with ``history=True``)."""

    message_id: str
    partner: str
    doc_type: str
    doc_namespace: str
    doc_id: str | None
    idempotency_key: str
    correlation_id: str
    route: str
    destination: str
    status: str
    received_at: int
    updated_at: int
    reply: bytes | None
    reply_type: str | None
    receipt: str | None
    error: str | None
    document: bytes | None = None
    history: list[tuple[str, int]] | None = None
    digest: str | None = None  # None in rows written before the ledger kept one
    auth: str | None = None  # how the partner authenticated; None in rows written before the ledger kept it


@dataclass(slots=True)
class Tombstone:
    """What the ledger keeps of a document retention purged (a ``b2b_ledger_tombstones`` row)."""

    message_id: str
    partner: str
    idempotency_key: str
    digest: str | None
    received_at: int
    purged_at: int
    batch_id: int
    archived: bool


def _tombstone(row: Any) -> Tombstone:
    m = row._mapping
    return Tombstone(
        message_id=m["message_id"],
        partner=m["partner"],
        idempotency_key=m["idempotency_key"],
        digest=m["digest"],
        received_at=m["received_at"],
        purged_at=m["purged_at"],
        batch_id=m["batch_id"],
        archived=bool(m["archived"]),
    )


_SUMMARY_COLUMNS = [c for c in documents.c if c.name not in ("document", "facts", "facts_version")]


def _record(row: Any, history: list[tuple[str, int]] | None = None) -> LedgerRecord:
    m = row._mapping
    return LedgerRecord(
        message_id=m["message_id"],
        partner=m["partner"],
        doc_type=m["doc_type"],
        doc_namespace=m["doc_namespace"],
        doc_id=m["doc_id"],
        idempotency_key=m["idempotency_key"],
        correlation_id=m["correlation_id"],
        route=m["route"],
        destination=m["destination"],
        status=m["status"],
        received_at=m["received_at"],
        updated_at=m["updated_at"],
        reply=unpack_xml(m["reply"]),
        reply_type=m["reply_type"],
        receipt=m["receipt"],
        error=m["error"],
        document=unpack_xml(m.get("document")),
        history=history,
        digest=m["digest"],
        auth=m.get("auth"),
    )


class Ledger:
    """Reads and writes of the ledger tables on the store's engine."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self._is_duplicate = _duplicate_detector(engine.dialect.name)
        # the hot-path inserts as driver SQL: a third of the cost of Core statements, in the writer thread
        style = (lambda name: f"%({name})s") if engine.dialect.paramstyle == "pyformat" else (lambda name: f":{name}")
        cols = [c.name for c in documents.c]
        self._insert_doc_sql = (
            f"INSERT INTO {documents.name} ({', '.join(cols)}) VALUES ({', '.join(style(c) for c in cols)})"
        )
        # a key a tombstone holds is taken: PostgreSQL checks it in the insert itself (no second round trip);
        # SQLite with a probe just before (an INSERT ... SELECT, or a trigger, copies the row's values once more
        # and costs several times the probe)
        self._tombstone_probe = f"SELECT 1 FROM {tombstones.name} WHERE idempotency_key = {style('idempotency_key')}"
        if engine.dialect.name == "postgresql":
            # typed: in a SELECT list a NULL parameter would be text, which no bytea column takes
            typed = ", ".join(
                f"CAST({style(c)} AS {documents.c[c].type.compile(dialect=engine.dialect)})" for c in cols
            )
            self._insert_doc_sql = (
                f"INSERT INTO {documents.name} ({', '.join(cols)}) SELECT {typed} "
                f"WHERE NOT EXISTS ({self._tombstone_probe})"
            )
        self._insert_event_sql = (
            f"INSERT INTO {events.name} (message_id, status, at) "
            f"VALUES ({style('message_id')}, {style('status')}, {style('at')})"
        )
        self._style = style
        self._transitions: dict[tuple[bool, bool, int], str] = {}
        # SQLite: the writes straight through the driver's cursor, in the caller's transaction
        self._raw = engine.dialect.name == "sqlite"
        self._dbapi_error = getattr(engine.dialect.dbapi, "Error", None) if self._raw else None

    # ----------------------------------------------------------------- writes (functions of a store transaction)

    def insert(self, conn: sa.Connection, doc: NewDocument) -> None:
        """Record an accepted document (status ``accepted``) in the caller's transaction.

        Raises :class:`DuplicateDocumentError` when its idempotency key is taken, by a document in the ledger or
        by the tombstone of one retention purged."""
        if self._raw and self._probe(conn, doc.idempotency_key):
            raise DuplicateDocumentError(doc.idempotency_key)
        try:
            inserted = self._execute(
                conn,
                self._insert_doc_sql,
                {
                    "message_id": doc.message_id,
                    "partner": doc.partner,
                    "doc_type": doc.doc_type,
                    "doc_namespace": doc.doc_namespace,
                    "doc_id": doc.doc_id,
                    "idempotency_key": doc.idempotency_key,
                    "correlation_id": doc.correlation_id,
                    "route": doc.route,
                    "destination": doc.destination,
                    "status": "accepted",
                    "received_at": doc.received_at,
                    "updated_at": doc.received_at,
                    "document": pack_xml(doc.document),
                    "reply": None,
                    "reply_type": None,
                    "receipt": doc.receipt,
                    "error": None,
                    "facts": doc.facts,
                    "facts_version": doc.facts_version if doc.facts is not None else None,
                    "digest": doc.digest,
                    "auth": doc.auth,
                },
            )
        except sa.exc.IntegrityError as exc:
            if self._is_duplicate(exc):
                raise DuplicateDocumentError(doc.idempotency_key) from None
            raise
        if inserted == 0:  # PostgreSQL: a tombstone holds the key
            raise DuplicateDocumentError(doc.idempotency_key)
        self._execute(
            conn, self._insert_event_sql, {"message_id": doc.message_id, "status": "accepted", "at": doc.received_at}
        )

    def _probe(self, conn: sa.Connection, key: str) -> bool:
        """SQLite, in the writer's open transaction: does a tombstone hold *key*?"""
        if not conn.in_transaction():
            return conn.exec_driver_sql(self._tombstone_probe, {"idempotency_key": key}).first() is not None
        cursor = conn.connection.dbapi_connection.cursor()
        try:
            return cursor.execute(self._tombstone_probe, {"idempotency_key": key}).fetchone() is not None
        finally:
            cursor.close()

    def _execute(self, conn: sa.Connection, sql: str, params: dict[str, Any]) -> int:
        """Run one write in the caller's transaction; its row count.

        On SQLite, inside the store's open transaction, through the driver's cursor: SQLAlchemy's
        ``exec_driver_sql`` (execution context, events, result object) costs about as much again as
        the insert itself, in the store's writer thread that every commit waits for. A driver error
        is raised as SQLAlchemy would raise it (``sa.exc.IntegrityError`` with ``orig``...)."""
        if self._raw and conn.in_transaction():
            cursor = conn.connection.dbapi_connection.cursor()
            try:
                cursor.execute(sql, params)
                return cursor.rowcount
            except self._dbapi_error as exc:
                raise sa.exc.DBAPIError.instance(sql, params, exc, self._dbapi_error) from exc
            finally:
                cursor.close()
        return conn.exec_driver_sql(sql, params).rowcount

    def transition(
        self,
        conn: sa.Connection,
        message_id: str,
        status: str,
        *,
        from_statuses: Iterable[str],
        reply: bytes | None = None,
        reply_type: str | None = None,
        error: str | None = None,
        at: int | None = None,
    ) -> bool:
        """Move a document to *status* if it is in one of *from_statuses*; True if it moved."""
        at = now_ms() if at is None else at
        sources = tuple(from_statuses)
        params: dict[str, Any] = {"status": status, "updated_at": at, "message_id": message_id}
        for i, source in enumerate(sources):
            params[f"from_{i}"] = source
        if reply is not None:
            params["reply"] = pack_xml(reply)
            params["reply_type"] = reply_type
        if error is not None:
            params["error"] = error[:2000]
        sql = self._transition_sql(reply is not None, error is not None, len(sources))
        if sql is None:
            return False
        # driver SQL, like the insert: a Core UPDATE with an IN list costs several times more to build and
        # compile each time than to run, in the store's writer thread that every commit waits for
        if self._execute(conn, sql, params) != 1:
            return False
        self._execute(conn, self._insert_event_sql, {"message_id": message_id, "status": status, "at": at})
        return True

    def _transition_sql(self, reply: bool, error: bool, sources: int) -> str | None:
        """The UPDATE of :meth:`transition` (driver SQL, cached per shape); None when no status may move."""
        shape = (reply, error, sources)
        sql = self._transitions.get(shape)
        if sql is None and sources:
            style = self._style
            sets = ["status", "updated_at"] + (["reply", "reply_type"] if reply else []) + (["error"] if error else [])
            sql = self._transitions[shape] = (
                f"UPDATE {documents.name} SET {', '.join(f'{c} = {style(c)}' for c in sets)} "
                f"WHERE message_id = {style('message_id')} "
                f"AND status IN ({', '.join(style(f'from_{i}') for i in range(sources))})"
            )
        return sql

    # ----------------------------------------------------------------- reads (any thread)

    def get(self, message_id: str, *, history: bool = False, document: bool = False) -> LedgerRecord | None:
        cols = list(documents.c) if document else _SUMMARY_COLUMNS
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(*cols).where(documents.c.message_id == message_id)).first()
            if row is None:
                return None
            events_list = None
            if history:
                events_list = [
                    (r.status, r.at)
                    for r in conn.execute(
                        sa.select(events.c.status, events.c.at)
                        .where(events.c.message_id == message_id)
                        .order_by(events.c.seq)
                    )
                ]
            conn.rollback()
        return _record(row, events_list)

    def find(self, idempotency_key: str, *, document: bool = False) -> LedgerRecord | None:
        """The document accepted with this idempotency key, if any."""
        cols = list(documents.c) if document else _SUMMARY_COLUMNS
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(*cols).where(documents.c.idempotency_key == idempotency_key)).first()
            conn.rollback()
        return None if row is None else _record(row)

    def tombstone(self, message_id: str) -> Tombstone | None:
        """The tombstone of a purged document, by its message id."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(tombstones).where(tombstones.c.message_id == message_id)).first()
            conn.rollback()
        return None if row is None else _tombstone(row)

    def tombstone_for_key(self, idempotency_key: str) -> Tombstone | None:
        """The tombstone that holds an idempotency key, if a purged document had it."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(tombstones).where(tombstones.c.idempotency_key == idempotency_key)).first()
            conn.rollback()
        return None if row is None else _tombstone(row)

    def undigested_keys(self, since: int, limit: int) -> list[tuple[str, int]]:
        """``(idempotency_key, received_at)`` of the rows without a digest received at *since* (epoch ms)
        or later, the newest first, at most *limit*: a range of ``ix_b2b_ledger_undigested``, which holds
        those rows alone."""
        query = (
            sa.select(documents.c.idempotency_key, documents.c.received_at)
            .where(documents.c.digest.is_(None), documents.c.received_at >= since)
            .order_by(documents.c.received_at.desc())
            .limit(limit)
        )
        with self.engine.connect() as conn:
            rows = [(r.idempotency_key, r.received_at) for r in conn.execute(query)]
            conn.rollback()
        return rows

    def exists(self, idempotency_key: str) -> bool:
        with self.engine.connect() as conn:
            found = conn.execute(
                sa.select(documents.c.message_id).where(documents.c.idempotency_key == idempotency_key)
            ).first()
            conn.rollback()
        return found is not None

    def in_status(
        self,
        statuses: Sequence[str],
        *,
        after: tuple[int, str] | None = None,
        limit: int = 500,
        routes: Sequence[str] | None = None,
    ) -> list[tuple[str, str, int, str]]:
        """``(message_id, route, updated_at, status)`` of documents in *statuses*, by (updated_at,
        message_id), strictly after the cursor *after*. For one status, a range of the index on
        (status, updated_at, message_id): the cost of a batch does not grow with the documents before it."""
        query = sa.select(documents.c.message_id, documents.c.route, documents.c.updated_at, documents.c.status).where(
            documents.c.status.in_(list(statuses))
        )
        if routes is not None:
            query = query.where(documents.c.route.in_(list(routes)))
        if after is not None:
            at, mid = after
            # a row value, which both databases match against the index (an OR of the two cases read every
            # row of the status, each a page of its own with the document inline)
            query = query.where(sa.tuple_(documents.c.updated_at, documents.c.message_id) > sa.tuple_(at, mid))
        query = query.order_by(documents.c.updated_at, documents.c.message_id).limit(limit)
        with self.engine.connect() as conn:
            rows = [(r.message_id, r.route, r.updated_at, r.status) for r in conn.execute(query)]
            conn.rollback()
        return rows

    def ping(self) -> None:
        """Raise if the database does not answer a read of the ledger."""
        with self.engine.connect() as conn:
            conn.execute(sa.select(sa.func.count()).select_from(documents).where(documents.c.message_id == ""))
            conn.rollback()


def _duplicate_detector(dialect: str) -> Callable[[sa.exc.IntegrityError], bool]:
    def is_duplicate(exc: sa.exc.IntegrityError) -> bool:
        text = str(exc.orig).lower()
        if dialect == "postgresql":
            return "idempotency_key" in text or getattr(exc.orig, "sqlstate", None) == "23505"
        return "unique" in text and "idempotency_key" in text

    return is_duplicate


# --------------------------------------------------------------------------- migrations

#: The Alembic script directory of the ledger's tables.
MIGRATIONS = os.path.join(os.path.dirname(__file__), "migrations")


def head_revision() -> str:
    return sql.head_revision(MIGRATIONS)


def current_revision(engine: sa.Engine) -> str | None:
    return sql.current_revision(engine, VERSION_TABLE)


def upgrade_ledger(engine: sa.Engine) -> str:
    """Create or upgrade the ledger tables to the head revision; returns it."""
    return sql.migrate(engine, MIGRATIONS, VERSION_TABLE)
