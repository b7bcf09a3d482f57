"""AS2: how each received message's MDN went to the partner, or why it was not sent.

An asynchronous MDN goes to a URL the partner names in the message; one the partner's agreement does not
list, or whose address is private, is not sent, and the operator needs to see why. One nullable column.

Revision ID: g0009
Revises: g0008
"""

import sqlalchemy as sa
from alembic import op

revision = "g0009"
down_revision = "g0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("b2b_as2_messages") as batch:
        batch.add_column(sa.Column("mdn_delivery", sa.String(300)))


def downgrade() -> None:
    with op.batch_alter_table("b2b_as2_messages") as batch:
        batch.drop_column("mdn_delivery")
