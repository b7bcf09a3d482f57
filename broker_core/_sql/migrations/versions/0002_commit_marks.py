"""Each broker instance records the number of its last writer commit, so a
commit whose answer was lost (connection dropped during COMMIT) can be told
apart from one that never happened before it is retried.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("b2b_instances") as batch:
        batch.add_column(sa.Column("last_commit", sa.BigInteger, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("b2b_instances") as batch:
        batch.drop_column("last_commit")
