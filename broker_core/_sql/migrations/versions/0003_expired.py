"""Tombstones of expired messages, so ``Broker.message_status`` can say
"expired" rather than "gone" (kept for a while, then swept).

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "b2b_expired",
        sa.Column("message_id", sa.String(128), primary_key=True),
        sa.Column("box", sa.String(512), primary_key=True),
        sa.Column("at", sa.BigInteger, nullable=False),
    )
    op.create_index("b2b_expired_at", "b2b_expired", ["at"])


def downgrade() -> None:
    op.drop_index("b2b_expired_at", table_name="b2b_expired")
    op.drop_table("b2b_expired")
