"""The operators' tables (ledger migration g0005): the audit trail and the console sessions."""

from __future__ import annotations

import sqlalchemy as sa

__all__ = ["audit", "metadata", "sessions"]

metadata = sa.MetaData()

#: One row per operator action: who (and with which role), what, on what, how many messages, the outcome.
audit = sa.Table(
    "b2b_audit",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("at", sa.BigInteger, nullable=False),  # epoch ms
    sa.Column("operator", sa.String(64), nullable=False),
    sa.Column("role", sa.String(20), nullable=False),
    sa.Column("action", sa.String(40), nullable=False),  # login, logout, replay, delete, move, purge, ...
    sa.Column("target", sa.String(600)),  # the destination (and, for a move, where to)
    sa.Column("selector", sa.Text),
    sa.Column("message_ids", sa.Text),  # JSON list, when the action named messages
    sa.Column("count", sa.BigInteger),  # how many messages it touched
    sa.Column("outcome", sa.String(20), nullable=False),  # done, refused, failed
    sa.Column("detail", sa.Text),
    sa.Column("client", sa.String(100)),  # the client's address
    sa.Index("ix_b2b_audit_at", "at"),
    sqlite_autoincrement=True,
)

#: Console sessions, by the SHA-256 (hex) of the cookie's token: the token itself is never stored.
sessions = sa.Table(
    "b2b_admin_sessions",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("operator", sa.String(64), nullable=False),
    sa.Column("csrf", sa.String(64), nullable=False),
    sa.Column("created_at", sa.BigInteger, nullable=False),
    sa.Column("expires_at", sa.BigInteger, nullable=False),
    sa.Index("ix_b2b_admin_sessions_expires", "expires_at"),
)
