"""Operators: the audit trail of their actions, their console sessions, and the ledger indexes their
searches need.

``b2b_audit``: one row per action (who, with which role, what, on which destination, with which selector or
message ids, how many messages, from which address, when). ``b2b_admin_sessions``: console sessions, by the
SHA-256 of their cookie (the cookie itself is never stored), with their CSRF token and expiry, shared by
every serving process. The ledger gets indexes on ``received_at`` (searches by time and the documents of the
last hour and day), ``correlation_id`` and ``doc_id`` (searches by either alone).

Revision ID: g0005
Revises: g0004
"""

import sqlalchemy as sa
from alembic import op

revision = "g0005"
down_revision = "g0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "b2b_audit",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("at", sa.BigInteger, nullable=False),
        sa.Column("operator", sa.String(64), nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("action", sa.String(40), nullable=False),
        sa.Column("target", sa.String(600)),
        sa.Column("selector", sa.Text),
        sa.Column("message_ids", sa.Text),
        sa.Column("count", sa.BigInteger),
        sa.Column("outcome", sa.String(20), nullable=False),
        sa.Column("detail", sa.Text),
        sa.Column("client", sa.String(100)),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_b2b_audit_at", "b2b_audit", ["at"])
    op.create_table(
        "b2b_admin_sessions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("operator", sa.String(64), nullable=False),
        sa.Column("csrf", sa.String(64), nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("expires_at", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_b2b_admin_sessions_expires", "b2b_admin_sessions", ["expires_at"])
    op.create_index("ix_b2b_ledger_received", "b2b_ledger", ["received_at", "message_id"])
    op.create_index("ix_b2b_ledger_correlation", "b2b_ledger", ["correlation_id"])
    op.create_index("ix_b2b_ledger_doc_id", "b2b_ledger", ["doc_id"])


def downgrade() -> None:
    op.drop_index("ix_b2b_ledger_doc_id", table_name="b2b_ledger")
    op.drop_index("ix_b2b_ledger_correlation", table_name="b2b_ledger")
    op.drop_index("ix_b2b_ledger_received", table_name="b2b_ledger")
    op.drop_index("ix_b2b_admin_sessions_expires", table_name="b2b_admin_sessions")
    op.drop_table("b2b_admin_sessions")
    op.drop_index("ix_b2b_audit_at", table_name="b2b_audit")
    op.drop_table("b2b_audit")
