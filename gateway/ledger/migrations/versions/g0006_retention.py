"""Retention: tombstones of purged documents, and the archive job's journal, runs and cursors.

``b2b_ledger_tombstones`` keeps, for every document purged from the ledger, what the gateway still needs to
answer for it: ``GET`` of it answers 410 to its partner (404 to any other), and a replay of it under its
idempotency key is refused instead of being accepted as a new document. ``b2b_archive_batches`` is the
archive job's journal (crash recovery), ``b2b_archive_runs`` what ``b2bgw archive status`` lists, and
``b2b_archive_cursors`` where the job's scans of the ledger stopped.

Four new tables; nothing existing is rewritten.

Revision ID: g0006
Revises: g0005
"""

import sqlalchemy as sa
from alembic import op

revision = "g0006"
down_revision = "g0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "b2b_ledger_tombstones",
        sa.Column("message_id", sa.String(128), primary_key=True),
        sa.Column("partner", sa.String(100), nullable=False),
        sa.Column("idempotency_key", sa.String(500), nullable=False, unique=True),
        sa.Column("digest", sa.String(80)),
        sa.Column("received_at", sa.BigInteger, nullable=False),
        sa.Column("purged_at", sa.BigInteger, nullable=False),
        sa.Column("batch_id", sa.BigInteger, nullable=False),
        sa.Column("archived", sa.Boolean, nullable=False),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_b2b_ledger_tombstones_batch", "b2b_ledger_tombstones", ["batch_id"])
    op.create_table(
        "b2b_archive_batches",
        sa.Column("batch_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
                  autoincrement=True),
        sa.Column("run_id", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.String(10), nullable=False),
        sa.Column("status", sa.String(12), nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        sa.Column("documents", sa.Integer, nullable=False),
        sa.Column("purged", sa.Integer, nullable=False),
        sa.Column("files", sa.Text),
        sa.Column("bytes", sa.BigInteger),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_b2b_archive_batches_status", "b2b_archive_batches", ["status", "batch_id"])
    op.create_table(
        "b2b_archive_runs",
        sa.Column("run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
                  autoincrement=True),
        sa.Column("owner", sa.String(200), nullable=False),
        sa.Column("status", sa.String(12), nullable=False),
        sa.Column("started_at", sa.BigInteger, nullable=False),
        sa.Column("finished_at", sa.BigInteger),
        sa.Column("archived", sa.BigInteger, nullable=False),
        sa.Column("purged", sa.BigInteger, nullable=False),
        sa.Column("waiting", sa.BigInteger, nullable=False),
        sa.Column("tombstones_expired", sa.BigInteger, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("stats", sa.Text),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "b2b_archive_cursors",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        sa.Column("message_id", sa.String(128), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("b2b_archive_cursors")
    op.drop_table("b2b_archive_runs")
    op.drop_index("ix_b2b_archive_batches_status", table_name="b2b_archive_batches")
    op.drop_table("b2b_archive_batches")
    op.drop_index("ix_b2b_ledger_tombstones_batch", table_name="b2b_ledger_tombstones")
    op.drop_table("b2b_ledger_tombstones")
