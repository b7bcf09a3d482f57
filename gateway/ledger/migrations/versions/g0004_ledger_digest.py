"""The digest of each accepted document: b2b_ledger.digest, and a partial index of the rows without one.

A document posted again under an idempotency key already taken is replayed only when its digest (the
SHA-256 of the body as received) is that of the first one; another document gets 409. Rows accepted
before this revision have no digest: the gateway compares their stored document instead, and finds the
recent ones (whose keys it checks against the new default keys for a while, see gateway/exchange/idempotency.py)
through ``ix_b2b_ledger_undigested``, which holds those rows alone: no row written from now on enters it.

A nullable column (no table rewrite on PostgreSQL, ADD COLUMN on SQLite), and one index built from the
rows already there (on PostgreSQL, writes to the ledger wait while it is built).

Revision ID: g0004
Revises: g0003
"""

import sqlalchemy as sa
from alembic import op

revision = "g0004"
down_revision = "g0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("b2b_ledger", sa.Column("digest", sa.String(80)))
    op.create_index("ix_b2b_ledger_undigested", "b2b_ledger", ["received_at"],
                    sqlite_where=sa.text("digest IS NULL"), postgresql_where=sa.text("digest IS NULL"))


def downgrade() -> None:
    op.drop_index("ix_b2b_ledger_undigested", table_name="b2b_ledger")
    with op.batch_alter_table("b2b_ledger") as batch:
        batch.drop_column("digest")
