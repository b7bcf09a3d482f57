"""Warehouse facts extracted at intake: b2b_ledger.facts and facts_version (see gateway/facts.py).

Revision ID: g0002
Revises: g0001
"""

import sqlalchemy as sa
from alembic import op

revision = "g0002"
down_revision = "g0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Two nullable columns: no table rewrite on PostgreSQL, ADD COLUMN on SQLite.
    # Rows accepted before have no facts; the warehouse load parses their XML.
    op.add_column("b2b_ledger", sa.Column("facts", sa.Text))
    op.add_column("b2b_ledger", sa.Column("facts_version", sa.SmallInteger))


def downgrade() -> None:
    with op.batch_alter_table("b2b_ledger") as batch:
        batch.drop_column("facts_version")
        batch.drop_column("facts")
