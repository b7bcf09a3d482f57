"""Deliveries: one row per outbound document, one per attempt, the notifications' cursor (gateway.delivery.tables).

Revision ID: d0001
Revises:
"""

from alembic import op

from gateway.delivery.tables import attempts, cursors, deliveries

revision = "d0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    deliveries.create(bind, checkfirst=True)
    attempts.create(bind, checkfirst=True)
    cursors.create(bind, checkfirst=True)


def downgrade() -> None:
    bind = op.get_bind()
    cursors.drop(bind, checkfirst=True)
    attempts.drop(bind, checkfirst=True)
    deliveries.drop(bind, checkfirst=True)
