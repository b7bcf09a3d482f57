"""The document ledger's tables: the contract between the gateway (which writes them) and the warehouse
load and archive job in ``spark_etl`` (which read them).

Every accepted document has one ``b2b_ledger`` row, inserted in the store transaction that enqueues its
message; each status change appends a ``b2b_ledger_events`` row, whose growing ``seq`` incremental readers
follow. Documents past their retention (:mod:`ledger_contract.retention`) are archived and purged, each leaving a
``b2b_ledger_tombstones`` row so that its partner's ``GET`` answers 410 and a replay is refused;
``b2b_archive_batches``, ``b2b_archive_runs`` and ``b2b_archive_cursors`` are the archive job's journal.

``facts`` is what the warehouse keeps of the document (:mod:`ledger_contract.facts`, JSON), extracted at intake,
and ``facts_version`` the extractor's version; both are NULL when the type is not loaded or the extraction
failed, and the load then parses ``document``, which stays the source of truth.

``document`` and ``reply`` hold UTF-8 XML, stored as a standard LZ4 frame when that is smaller (:func:`pack_xml`;
:func:`unpack_xml` reads either form): two compressed UBL orders share a 16 KB SQLite page where each raw one
took a page of its own.

``digest`` is ``sha256:`` and the hex SHA-256 of the body as received: a document posted again under the same
``idempotency_key`` is the same document only if its digest is. Rows written before the column have none; the
partial index ``ix_b2b_ledger_undigested`` finds them without reading the table.

``auth`` is how the partner authenticated the request: ``key:<key id>``, ``certificate:sha256:<fingerprint>``
or both joined with ``+`` (the key itself is never stored); NULL in rows written before the column, and for
documents that came otherwise (AS2 messages are signed, not authenticated by key or pin).

Outbound documents (the gateway's deliveries to partners) live in ``b2b_deliveries``, defined and migrated by the
gateway; :data:`outbound` is what the warehouse reads of it. When a delivery is delivered, the gateway appends a
``delivered`` event under the delivery's id to ``b2b_ledger_events`` in the transaction that records it, so the
event log orders inbound and outbound documents alike.
"""

from __future__ import annotations

import lz4.frame
import sqlalchemy as sa

from broker_core.compression import lz4_frame

__all__ = [
    "DELIVERED_STATUSES",
    "FINAL_STATUSES",
    "LZ4_MAGIC",
    "PACK_OVER",
    "STATUSES",
    "archive_batches",
    "archive_cursors",
    "archive_runs",
    "as2_messages",
    "documents",
    "events",
    "metadata",
    "outbound",
    "pack_xml",
    "tombstones",
    "unpack_xml",
]

metadata = sa.MetaData()

#: Statuses: accepted (stored, waiting for a consumer), delivered (acknowledged), replied (request-reply: the
#: reply arrived), failed (the backend answered with an error), dead_lettered (moved to a dead-letter queue).
STATUSES = ("accepted", "delivered", "replied", "failed", "dead_lettered")
#: Statuses after which a document counts as a delivered transaction.
DELIVERED_STATUSES = ("delivered", "replied")

#: What a reader of the ledger sees of the outbound documents, by their delivery id (the table is the gateway's:
#: it may be absent from a database the gateway's deliveries never used).
outbound = sa.table(
    "b2b_deliveries",
    sa.column("message_id", sa.String),
    sa.column("partner", sa.String),  # the receiving partner
    sa.column("doc_type", sa.String),
    sa.column("created_at", sa.BigInteger),
    sa.column("document", sa.LargeBinary),
)

#: The first bytes of an LZ4 frame; no UTF-8 XML document starts with them (U+0004 is not an XML character).
LZ4_MAGIC = b"\x04\x22\x4d\x18"
#: XML shorter than this is stored as it is (it shares its page with other rows anyway).
PACK_OVER = 2048


def pack_xml(data: bytes) -> bytes:
    """How ``document`` and ``reply`` are stored: compressed when at least :data:`PACK_OVER` bytes and an
    eighth smaller so; and always when the bytes themselves begin like a frame (a malformed reply, say),
    so that :func:`unpack_xml` never mistakes one for the other."""
    if len(data) >= PACK_OVER or data.startswith(LZ4_MAGIC):
        packed = lz4_frame(data)  # the message body's frame when the store has just made it
        if len(packed) <= len(data) - (len(data) >> 3) or data.startswith(LZ4_MAGIC):
            return packed
    return data


def unpack_xml(data: bytes | memoryview | None) -> bytes | None:
    """The XML of a stored ``document`` or ``reply`` (either form)."""
    if data is None:
        return None
    data = bytes(data)
    return lz4.frame.decompress(data) if data.startswith(LZ4_MAGIC) else data


documents = sa.Table(
    "b2b_ledger",
    metadata,
    sa.Column("message_id", sa.String(128), primary_key=True),  # the JMS message id it was enqueued as
    sa.Column("partner", sa.String(100), nullable=False),
    sa.Column("doc_type", sa.String(100), nullable=False),  # the root element's local name: Order, Invoice, ...
    sa.Column("doc_namespace", sa.String(300), nullable=False),
    sa.Column("doc_id", sa.String(200)),  # the document's own cbc:ID
    sa.Column("idempotency_key", sa.String(500), nullable=False, unique=True),
    sa.Column("correlation_id", sa.String(200), nullable=False),
    sa.Column("route", sa.String(100), nullable=False),
    sa.Column("destination", sa.String(300), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("received_at", sa.BigInteger, nullable=False),  # epoch ms
    sa.Column("updated_at", sa.BigInteger, nullable=False),  # epoch ms of the last status change
    sa.Column("document", sa.LargeBinary, nullable=False),  # the XML as accepted (UTF-8; pack_xml)
    sa.Column("reply", sa.LargeBinary),  # the reply document (UTF-8; pack_xml), request-reply routes
    sa.Column("reply_type", sa.String(100)),
    sa.Column("receipt", sa.Text),  # JSON of the first answer, replayed to duplicates
    sa.Column("error", sa.Text),
    sa.Column("facts", sa.Text),  # JSON of ledger_contract.facts (the warehouse's extraction), or NULL
    sa.Column("facts_version", sa.SmallInteger),  # ledger_contract.facts.VERSION that wrote facts
    sa.Column("digest", sa.String(80)),  # "sha256:<hex>" of the body as received; NULL in rows written before
    sa.Column("auth", sa.String(200)),  # how the partner authenticated (key:<id>, certificate:sha256:<hex>, both)
    # the reconciler's cursor: documents of one status in (updated_at, message_id) order (Ledger.in_status)
    sa.Index("ix_b2b_ledger_status", "status", "updated_at", "message_id"),
    sa.Index("ix_b2b_ledger_partner_doc", "partner", "doc_type", "doc_id"),
    # the rows written before the digest (none are written since): the gateway's start-up finds the recent ones
    sa.Index(
        "ix_b2b_ledger_undigested",
        "received_at",
        sqlite_where=sa.text("digest IS NULL"),
        postgresql_where=sa.text("digest IS NULL"),
    ),
    # operators' searches (migration g0005): by time, and by a correlation id or a document id alone
    sa.Index("ix_b2b_ledger_received", "received_at", "message_id"),
    sa.Index("ix_b2b_ledger_correlation", "correlation_id"),
    sa.Index("ix_b2b_ledger_doc_id", "doc_id"),
)

events = sa.Table(
    "b2b_ledger_events",
    metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("message_id", sa.String(128), nullable=False, index=True),
    sa.Column("status", sa.String(20), nullable=False),
    sa.Column("at", sa.BigInteger, nullable=False),  # epoch ms
    sqlite_autoincrement=True,
)

#: Statuses after which a document no longer changes (once the late-reply window is over): the only ones whose
#: documents retention archives and purges. ``accepted`` and ``dead_lettered`` documents stay online.
FINAL_STATUSES = ("delivered", "replied", "failed")

tombstones = sa.Table(
    "b2b_ledger_tombstones",
    metadata,
    sa.Column("message_id", sa.String(128), primary_key=True),
    sa.Column("partner", sa.String(100), nullable=False),
    # unique: a key a tombstone holds is refused at intake (Ledger.insert), so no second one can take it
    sa.Column("idempotency_key", sa.String(500), nullable=False, unique=True),
    sa.Column("digest", sa.String(80)),  # the ledger row's, NULL where it had none
    sa.Column("received_at", sa.BigInteger, nullable=False),  # epoch ms
    sa.Column("purged_at", sa.BigInteger, nullable=False),  # epoch ms: when it left the ledger
    sa.Column("batch_id", sa.BigInteger, nullable=False),  # b2b_archive_batches: where its archive copy is
    sa.Column("archived", sa.Boolean, nullable=False),  # false: purged without an archive copy (after: purge)
    sa.Index("ix_b2b_ledger_tombstones_batch", "batch_id"),
    sqlite_with_rowid=False,
)

archive_batches = sa.Table(
    "b2b_archive_batches",
    metadata,
    sa.Column("batch_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.BigInteger, nullable=False),
    sa.Column("kind", sa.String(10), nullable=False),  # archive | purge
    # writing -> written -> verified -> purged (-> expired: its tombstones are gone too) | abandoned
    sa.Column("status", sa.String(12), nullable=False),
    sa.Column("created_at", sa.BigInteger, nullable=False),
    sa.Column("updated_at", sa.BigInteger, nullable=False),
    sa.Column("documents", sa.Integer, nullable=False),
    sa.Column("purged", sa.Integer, nullable=False, default=0),
    sa.Column("files", sa.Text),  # JSON: [{"path", "rows"}] under the archive root
    sa.Column("bytes", sa.BigInteger),
    sa.Index("ix_b2b_archive_batches_status", "status", "batch_id"),
    sqlite_autoincrement=True,
)

archive_runs = sa.Table(
    "b2b_archive_runs",
    metadata,
    sa.Column("run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("owner", sa.String(200), nullable=False),
    sa.Column("status", sa.String(12), nullable=False),  # running -> succeeded | failed | interrupted
    sa.Column("started_at", sa.BigInteger, nullable=False),
    sa.Column("finished_at", sa.BigInteger),
    sa.Column("archived", sa.BigInteger, nullable=False, default=0),  # documents written and verified
    sa.Column("purged", sa.BigInteger, nullable=False, default=0),  # documents removed from the ledger
    sa.Column("waiting", sa.BigInteger, nullable=False, default=0),  # due, but the warehouse load has not read them
    sa.Column("tombstones_expired", sa.BigInteger, nullable=False, default=0),
    sa.Column("bytes", sa.BigInteger, nullable=False, default=0),  # archive bytes written
    sa.Column("error", sa.Text),
    sa.Column("stats", sa.Text),  # JSON
    sqlite_autoincrement=True,
)

archive_cursors = sa.Table(
    "b2b_archive_cursors",
    metadata,
    sa.Column("name", sa.String(200), primary_key=True),  # "<status>:<policy class>"
    sa.Column("updated_at", sa.BigInteger, nullable=False),
    sa.Column("message_id", sa.String(128), nullable=False),
)

as2_messages = sa.Table(
    "b2b_as2_messages",
    metadata,
    # one row per AS2 message, received ("in") or sent ("out"): what an auditor needs to prove what was
    # received and acknowledged (the MIC of what was signed, the MDN as sent or received, its disposition)
    sa.Column("direction", sa.String(3), primary_key=True),  # in | out
    sa.Column("partner", sa.String(100), primary_key=True),
    sa.Column("as2_message_id", sa.String(255), primary_key=True),  # the AS2 Message-ID (clipped, see gateway.as2)
    sa.Column("message_id", sa.String(128)),  # the ledger document it became (in) or came from (out), if any
    sa.Column("mic", sa.String(200)),  # "<base64>, <micalg>"
    sa.Column("disposition", sa.String(200)),  # the MDN's, NULL while an outbound MDN is awaited
    sa.Column("mdn", sa.LargeBinary),  # the MDN as sent (in) or received (out): the whole MIME entity
    # in: how the MDN went to the partner (in the HTTP answer, posted to its URL) or why it was not sent
    sa.Column("mdn_delivery", sa.String(300)),
    sa.Column("created_at", sa.BigInteger, nullable=False),  # epoch ms
    sa.Column("updated_at", sa.BigInteger, nullable=False),
    sa.Index("ix_b2b_as2_messages_message", "message_id"),
    sa.Index("ix_b2b_as2_messages_created", "created_at"),
)
