"""The document ledger: b2b_ledger and b2b_ledger_events (see ledger_contract/tables.py).

Revision ID: g0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "g0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "b2b_ledger",
        sa.Column("message_id", sa.String(128), primary_key=True),
        sa.Column("partner", sa.String(100), nullable=False),
        sa.Column("doc_type", sa.String(100), nullable=False),
        sa.Column("doc_namespace", sa.String(300), nullable=False),
        sa.Column("doc_id", sa.String(200)),
        sa.Column("idempotency_key", sa.String(500), nullable=False, unique=True),
        sa.Column("correlation_id", sa.String(200), nullable=False),
        sa.Column("route", sa.String(100), nullable=False),
        sa.Column("destination", sa.String(300), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("received_at", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        sa.Column("document", sa.LargeBinary, nullable=False),
        sa.Column("reply", sa.LargeBinary),
        sa.Column("reply_type", sa.String(100)),
        sa.Column("receipt", sa.Text),
        sa.Column("error", sa.Text),
    )
    op.create_index("ix_b2b_ledger_status", "b2b_ledger", ["status", "updated_at"])
    op.create_index("ix_b2b_ledger_partner_doc", "b2b_ledger", ["partner", "doc_type", "doc_id"])
    op.create_table(
        "b2b_ledger_events",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("message_id", sa.String(128), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("at", sa.BigInteger, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_b2b_ledger_events_message_id", "b2b_ledger_events", ["message_id"])


def downgrade() -> None:
    op.drop_index("ix_b2b_ledger_events_message_id", table_name="b2b_ledger_events")
    op.drop_table("b2b_ledger_events")
    op.drop_index("ix_b2b_ledger_partner_doc", table_name="b2b_ledger")
    op.drop_index("ix_b2b_ledger_status", table_name="b2b_ledger")
    op.drop_table("b2b_ledger")
