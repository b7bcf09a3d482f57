"""The broker store's first schema: messages, entries, subscriptions, temporaries, instances, leases.

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
        "b2b_messages",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("message_id", sa.String(128), nullable=False),
        sa.Column("destination", sa.String(300), nullable=False),
        sa.Column("delivery_mode", sa.SmallInteger, nullable=False),
        sa.Column("timestamp", sa.BigInteger, nullable=False),
        sa.Column("correlation_id", sa.Text),
        sa.Column("reply_to", sa.String(300)),
        sa.Column("type", sa.Text),
        sa.Column("origin", sa.String(128)),
        sa.Column("kind", sa.String(10), nullable=False),
        sa.Column("properties", sa.Text, nullable=False),
        sa.Column("body", sa.LargeBinary),
        sqlite_autoincrement=True,
    )
    op.create_index("b2b_messages_message_id", "b2b_messages", ["message_id"])
    op.create_table(
        "b2b_entries",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("box", sa.String(512), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("priority", sa.SmallInteger, nullable=False),
        sa.Column("expiration", sa.BigInteger, nullable=False),
        sa.Column("state", sa.SmallInteger, nullable=False, server_default="0"),
        sa.Column("ready_at", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("owner", sa.String(64)),
        sa.Column("delivery_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("message", sa.BigInteger, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("b2b_entries_claim", "b2b_entries", ["box", "state", sa.text("priority DESC"), "seq"])
    op.create_index("b2b_entries_owner", "b2b_entries", ["owner", "state"])
    op.create_index("b2b_entries_expiration", "b2b_entries", ["expiration"])
    op.create_index("b2b_entries_message", "b2b_entries", ["message"])
    op.create_table(
        "b2b_subscriptions",
        sa.Column("box", sa.String(512), primary_key=True),
        sa.Column("topic", sa.String(300), nullable=False),
        sa.Column("selector", sa.Text),
        sa.Column("no_local", sa.Boolean, nullable=False),
        sa.Column("local_origin", sa.String(128)),
        sa.Column("client_id", sa.String(200)),
        sa.Column("name", sa.String(200)),
        sa.Column("owner", sa.String(64)),
    )
    op.create_index("ix_b2b_subscriptions_topic", "b2b_subscriptions", ["topic"])
    op.create_table(
        "b2b_temporaries",
        sa.Column("name", sa.String(300), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
    )
    op.create_index("ix_b2b_temporaries_owner", "b2b_temporaries", ["owner"])
    op.create_table(
        "b2b_instances",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("host", sa.String(200), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started", sa.BigInteger, nullable=False),
        sa.Column("heartbeat", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "b2b_leases",
        sa.Column("name", sa.String(200), primary_key=True),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("expires", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    for table in ("b2b_leases", "b2b_instances", "b2b_temporaries", "b2b_subscriptions", "b2b_entries",
                  "b2b_messages"):
        op.drop_table(table)
