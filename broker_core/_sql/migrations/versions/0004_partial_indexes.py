"""Partial indexes on ``b2b_entries``: each entry is in the index its state
needs and no other. Waiting entries are in the claim index, in-flight ones in
the owner index, and only entries with a time-to-live in the expiration index.
A claim then moves an entry out of one index into another instead of
rewriting three, an insert touches two fewer indexes, and an
acknowledgement (delete by id and owner) is planned on the primary key: with
the full ``(owner, state)`` index, SQLite walked every in-flight entry of the
owner for each acknowledgement.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_WAITING = sa.text("state = 0")
_IN_FLIGHT = sa.text("state = 1")
_EXPIRING = sa.text("expiration > 0")


def _partial(name: str, columns: list, where: sa.TextClause) -> None:
    op.create_index(name, "b2b_entries", columns, sqlite_where=where, postgresql_where=where)


def upgrade() -> None:
    op.drop_index("b2b_entries_claim", table_name="b2b_entries")
    op.drop_index("b2b_entries_owner", table_name="b2b_entries")
    op.drop_index("b2b_entries_expiration", table_name="b2b_entries")
    _partial("b2b_entries_claim", ["box", sa.text("priority DESC"), "seq"], _WAITING)
    _partial("b2b_entries_owner", ["owner"], _IN_FLIGHT)
    _partial("b2b_entries_expiration", ["expiration"], _EXPIRING)


def downgrade() -> None:
    op.drop_index("b2b_entries_claim", table_name="b2b_entries")
    op.drop_index("b2b_entries_owner", table_name="b2b_entries")
    op.drop_index("b2b_entries_expiration", table_name="b2b_entries")
    op.create_index("b2b_entries_claim", "b2b_entries", ["box", "state", sa.text("priority DESC"), "seq"])
    op.create_index("b2b_entries_owner", "b2b_entries", ["owner", "state"])
    op.create_index("b2b_entries_expiration", "b2b_entries", ["expiration"])
