"""The deliveries' tables, beside the ledger's in the store's database (their own Alembic chain).

``b2b_deliveries``: one row per outbound document, by its own message id (the ``webhook-id``), with its
source (the inbound document or the handler that sent it), where it goes and how it stands.
``b2b_delivery_attempts``: its timeline, one row per attempt. ``b2b_delivery_cursors``: how far the status
notifications have followed the ledger's events.
"""

from __future__ import annotations

import sqlalchemy as sa

__all__ = ["attempts", "cursors", "deliveries", "metadata"]

metadata = sa.MetaData()
_BIGINT = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

deliveries = sa.Table(
    "b2b_deliveries",
    metadata,
    sa.Column("message_id", sa.String(100), primary_key=True),
    sa.Column("partner", sa.String(100), nullable=False),
    sa.Column("endpoint", sa.String(64), nullable=False),
    sa.Column("kind", sa.String(20), nullable=False),
    sa.Column("source", sa.String(300), nullable=False),
    sa.Column("doc_type", sa.String(200)),
    sa.Column("content_type", sa.String(200), nullable=False),
    sa.Column("status", sa.String(20), nullable=False),  # pending, delivered, dead, discarded
    sa.Column("created_at", sa.BigInteger, nullable=False),
    sa.Column("queued_at", sa.BigInteger, nullable=False),  # max_age counts from here (reset by a replay)
    sa.Column("updated_at", sa.BigInteger, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("failing_since", sa.BigInteger),
    sa.Column("last_status", sa.Integer),
    sa.Column("last_detail", sa.Text),
    sa.Column("document", sa.LargeBinary, nullable=False),
    sa.Index("ix_b2b_deliveries_partner_status", "partner", "endpoint", "status"),
    sa.Index("ix_b2b_deliveries_status", "status", "updated_at"),
)

attempts = sa.Table(
    "b2b_delivery_attempts",
    metadata,
    sa.Column("id", _BIGINT, primary_key=True, autoincrement=True),
    sa.Column("message_id", sa.String(100), nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("at", sa.BigInteger, nullable=False),
    sa.Column("endpoint", sa.String(64), nullable=False),
    sa.Column("outcome", sa.String(20), nullable=False),
    sa.Column("status", sa.Integer),
    sa.Column("detail", sa.Text),
    sa.Column("duration_ms", sa.Integer, nullable=False),
    sa.Column("evidence", sa.LargeBinary),
    sa.Index("ix_b2b_delivery_attempts_message", "message_id", "id"),
    sqlite_autoincrement=True,
)

cursors = sa.Table(
    "b2b_delivery_cursors",
    metadata,
    sa.Column("name", sa.String(40), primary_key=True),
    sa.Column("seq", sa.BigInteger, nullable=False),
)
