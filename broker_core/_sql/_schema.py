"""The SQL store's tables (SQLAlchemy Core). Alembic migrations create them."""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

#: One row per sent message: headers, properties and body, written once.
#: Several entries (the copies of a topic message) may share it; it is deleted
#: with the last entry that refers to it.
messages = sa.Table(
    "b2b_messages",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("message_id", sa.String(128), nullable=False),
    sa.Column("destination", sa.String(300), nullable=False),
    sa.Column("delivery_mode", sa.SmallInteger, nullable=False),
    sa.Column("timestamp", sa.BigInteger, nullable=False),
    sa.Column("correlation_id", sa.Text),
    sa.Column("reply_to", sa.String(300)),
    sa.Column("type", sa.Text),
    sa.Column("origin", sa.String(128)),
    sa.Column("kind", sa.String(10), nullable=False),
    sa.Column("properties", sa.Text, nullable=False),
    sa.Column("body", sa.LargeBinary),
    sa.Index("b2b_messages_message_id", "message_id"),
    sqlite_autoincrement=True,
)

#: One small row per message waiting in a box (a queue, or one topic
#: subscription): what claiming, acknowledging and redelivering change, kept
#: apart from the bodies so those writes stay small. ``id`` grows in commit
#: order (SQLite serialises writers; on PostgreSQL the writers take an
#: advisory lock), so selective readers can scan by id.
entries = sa.Table(
    "b2b_entries",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("box", sa.String(512), nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False),  # FIFO order within a priority
    sa.Column("priority", sa.SmallInteger, nullable=False),
    sa.Column("expiration", sa.BigInteger, nullable=False),  # epoch ms, 0 = never
    sa.Column("state", sa.SmallInteger, nullable=False, server_default="0"),  # 0 available, 1 in flight
    sa.Column("ready_at", sa.BigInteger, nullable=False, server_default="0"),  # epoch ms (redelivery delay)
    sa.Column("owner", sa.String(64)),  # broker instance holding it in flight
    sa.Column("delivery_count", sa.Integer, nullable=False, server_default="0"),
    sa.Column("message", sa.BigInteger, nullable=False),  # b2b_messages.id
    # partial (migration 0004): queries that must use them spell ``state = 0``, ``state = 1`` or
    # ``expiration > 0`` literally (a bound parameter does not imply an index's condition)
    sa.Index(
        "b2b_entries_claim",
        "box",
        sa.text("priority DESC"),
        "seq",
        sqlite_where=sa.text("state = 0"),
        postgresql_where=sa.text("state = 0"),
    ),
    sa.Index("b2b_entries_owner", "owner", sqlite_where=sa.text("state = 1"), postgresql_where=sa.text("state = 1")),
    sa.Index(
        "b2b_entries_expiration",
        "expiration",
        sqlite_where=sa.text("expiration > 0"),
        postgresql_where=sa.text("expiration > 0"),
    ),
    sa.Index("b2b_entries_message", "message"),
    sqlite_autoincrement=True,
)

#: Topic subscriptions: durable ones (client_id + name) and the non-durable
#: ones of live broker instances (``owner``), so every process fans out to all.
subscriptions = sa.Table(
    "b2b_subscriptions",
    metadata,
    sa.Column("box", sa.String(512), primary_key=True),
    sa.Column("topic", sa.String(300), nullable=False, index=True),
    sa.Column("selector", sa.Text),
    sa.Column("no_local", sa.Boolean, nullable=False),
    sa.Column("local_origin", sa.String(128)),
    sa.Column("client_id", sa.String(200)),
    sa.Column("name", sa.String(200)),
    sa.Column("owner", sa.String(64)),  # NULL for durable subscriptions
)

#: Temporary destinations and the broker instance that owns each.
temporaries = sa.Table(
    "b2b_temporaries",
    metadata,
    sa.Column("name", sa.String(300), primary_key=True),
    sa.Column("owner", sa.String(64), nullable=False, index=True),
)

#: Live broker instances; a stale heartbeat means the process died and its
#: in-flight messages, temporary destinations and subscribers are reclaimed.
instances = sa.Table(
    "b2b_instances",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("host", sa.String(200), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("started", sa.BigInteger, nullable=False),
    sa.Column("heartbeat", sa.BigInteger, nullable=False),
    # number of this instance's last writer commit (PostgreSQL): tells a commit
    # whose answer was lost from one that did not happen
    sa.Column("last_commit", sa.BigInteger, nullable=False, server_default="0"),
)

#: Tombstones of expired messages (``message_status`` says "expired"), kept
#: ``expired_retention`` seconds.
expired = sa.Table(
    "b2b_expired",
    metadata,
    sa.Column("message_id", sa.String(128), primary_key=True),
    sa.Column("box", sa.String(512), primary_key=True),
    sa.Column("at", sa.BigInteger, nullable=False),
    sa.Index("b2b_expired_at", "at"),
)

#: Named leases (e.g. "only one process runs the nightly ETL").
leases = sa.Table(
    "b2b_leases",
    metadata,
    sa.Column("name", sa.String(200), primary_key=True),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("expires", sa.BigInteger, nullable=False),
)

#: Per box, what every process counted since the store was created (migration 0005): each process adds
#: its own counts about once a second, with its heartbeat.
box_counters = sa.Table(
    "b2b_box_counters",
    metadata,
    sa.Column("box", sa.String(512), primary_key=True),
    sa.Column("enqueued", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("dequeued", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("expired", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("dead_lettered", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("redelivered", sa.BigInteger, nullable=False, server_default="0"),
)

#: How many entries each box holds (waiting and in flight), as deltas per broker instance written in the
#: transactions that insert and delete entries (instance ``''``: the deltas of instances gone, folded), so
#: that counting a box's messages never scans its entries. A box's rows go when the box is deleted.
box_depth = sa.Table(
    "b2b_box_depth",
    metadata,
    sa.Column("instance", sa.String(64), primary_key=True),
    sa.Column("box", sa.String(512), primary_key=True),
    sa.Column("entries", sa.BigInteger, nullable=False),
)

#: The open consumers of each live broker instance, per box (so every process counts every process's).
consumers = sa.Table(
    "b2b_consumers",
    metadata,
    sa.Column("instance", sa.String(64), primary_key=True),
    sa.Column("box", sa.String(512), primary_key=True),
    sa.Column("consumers", sa.Integer, nullable=False),
)
