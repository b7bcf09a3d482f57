"""Counters and consumers every process sharing the store can see, and the entries of each box.

``b2b_box_counters`` holds, per box, how many messages were enqueued,
acknowledged, expired, dead-lettered and redelivered since the store was
created; each process adds what it counted about once a second (with its
heartbeat). ``b2b_consumers`` holds each live broker instance's open
consumers per box, so that ``Broker.destinations()`` counts the consumers of
every process (a dead instance's rows go when it is reaped). ``b2b_box_depth``
holds each box's entries as deltas per instance, written in the transactions
that insert and delete them, so that counting what waits never scans the
entries (seeded here from the entries already stored).

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "b2b_box_counters",
        sa.Column("box", sa.String(512), primary_key=True),
        sa.Column("enqueued", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("dequeued", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("expired", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("dead_lettered", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("redelivered", sa.BigInteger, nullable=False, server_default="0"),
    )
    op.create_table(
        "b2b_box_depth",
        sa.Column("instance", sa.String(64), primary_key=True),
        sa.Column("box", sa.String(512), primary_key=True),
        sa.Column("entries", sa.BigInteger, nullable=False),
    )
    op.execute("INSERT INTO b2b_box_depth (instance, box, entries) SELECT '', box, count(*) FROM b2b_entries "
               "GROUP BY box")
    op.create_table(
        "b2b_consumers",
        sa.Column("instance", sa.String(64), primary_key=True),
        sa.Column("box", sa.String(512), primary_key=True),
        sa.Column("consumers", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("b2b_consumers")
    op.drop_table("b2b_box_depth")
    op.drop_table("b2b_box_counters")
