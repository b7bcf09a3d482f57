"""AS2: one row per AS2 message received or sent, with its MIC, its MDN and the MDN's disposition.

``b2b_as2_messages`` is keyed by direction, partner and AS2 Message-ID: a partner's resend finds the MDN
already sent (and gets it again), an asynchronous MDN finds the message it answers. One new table; nothing
existing is rewritten.

Revision ID: g0008
Revises: g0007
"""

import sqlalchemy as sa
from alembic import op

revision = "g0008"
down_revision = "g0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "b2b_as2_messages",
        sa.Column("direction", sa.String(3), primary_key=True),
        sa.Column("partner", sa.String(100), primary_key=True),
        sa.Column("as2_message_id", sa.String(255), primary_key=True),
        sa.Column("message_id", sa.String(128)),
        sa.Column("mic", sa.String(200)),
        sa.Column("disposition", sa.String(200)),
        sa.Column("mdn", sa.LargeBinary),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_b2b_as2_messages_message", "b2b_as2_messages", ["message_id"])
    op.create_index("ix_b2b_as2_messages_created", "b2b_as2_messages", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_b2b_as2_messages_created", table_name="b2b_as2_messages")
    op.drop_index("ix_b2b_as2_messages_message", table_name="b2b_as2_messages")
    op.drop_table("b2b_as2_messages")
