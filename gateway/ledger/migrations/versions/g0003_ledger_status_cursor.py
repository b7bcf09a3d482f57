"""The status index carries the message id: the reconciler's cursor (status, updated_at, message_id).

The reconciler walks the documents of one status in (updated_at, message_id) order, 500 at a time, from
where its last batch ended. With the index on (status, updated_at) alone, the tie-break on message_id
could not be an index range: each batch read every row of that status (16 KB pages, the documents
inline), a cost growing with the backlog. With message_id in the index the batch is a range scan, whatever
the backlog.

Builds one index of b2b_ledger (on PostgreSQL, writes to the ledger wait while it is built).

Revision ID: g0003
Revises: g0002
"""

from alembic import op

revision = "g0003"
down_revision = "g0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_b2b_ledger_status", table_name="b2b_ledger")
    op.create_index("ix_b2b_ledger_status", "b2b_ledger", ["status", "updated_at", "message_id"])


def downgrade() -> None:
    op.drop_index("ix_b2b_ledger_status", table_name="b2b_ledger")
    op.create_index("ix_b2b_ledger_status", "b2b_ledger", ["status", "updated_at"])
