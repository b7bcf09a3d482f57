"""The warehouse load's tables: runs, quarantine, lock.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "etl_runs",
        sa.Column("run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("mode", sa.String(20), nullable=False),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("started_at", sa.BigInteger, nullable=False),
        sa.Column("finished_at", sa.BigInteger),
        sa.Column("seq_from", sa.BigInteger, nullable=False),
        sa.Column("seq_to", sa.BigInteger, nullable=False),
        sa.Column("docs_read", sa.BigInteger),
        sa.Column("rows_written", sa.BigInteger),
        sa.Column("loaded", sa.BigInteger),
        sa.Column("quarantined", sa.BigInteger),
        sa.Column("skipped", sa.BigInteger),
        sa.Column("error", sa.Text),
        sa.Column("manifest", sa.Text),
        sa.Column("stats", sa.Text),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_etl_runs_status", "etl_runs", ["status", "seq_to"])
    op.create_table(
        "etl_quarantine",
        sa.Column("message_id", sa.String(128), primary_key=True),
        sa.Column("run_id", sa.BigInteger, nullable=False),
        sa.Column("partner", sa.String(100), nullable=False),
        sa.Column("doc_type", sa.String(100), nullable=False),
        sa.Column("ledger_seq", sa.BigInteger, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("quarantined_at", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_etl_quarantine_run", "etl_quarantine", ["run_id"])
    op.create_table(
        "etl_lock",
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("owner", sa.String(200)),
        sa.Column("acquired_at", sa.BigInteger),
        sa.Column("expires_at", sa.BigInteger, nullable=False),
        sa.Column("slot", sa.BigInteger),
    )


def downgrade() -> None:
    op.drop_table("etl_lock")
    op.drop_index("ix_etl_quarantine_run", table_name="etl_quarantine")
    op.drop_table("etl_quarantine")
    op.drop_index("ix_etl_runs_status", table_name="etl_runs")
    op.drop_table("etl_runs")
