"""The ledger: how the partner authenticated each document (``key:<key id>``, ``certificate:sha256:<hex>``,
or both), so that an accepted document can be traced to the credential that sent it.

One nullable column; rows written before have none.

Revision ID: g0010
Revises: g0009
"""

import sqlalchemy as sa
from alembic import op

revision = "g0010"
down_revision = "g0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("b2b_ledger", sa.Column("auth", sa.String(200)))


def downgrade() -> None:
    with op.batch_alter_table("b2b_ledger") as batch:
        batch.drop_column("auth")
