"""Partners, keys and certificate pins changed from the admin side, over partners.yaml.

One row per change (a partner added, a key issued or revoked, a pin added or removed), in order; every
serving process polls the greatest ``seq`` and folds the rows over the partners file when it grows. Keys
are stored as their scrypt hash only.

A key id is issued once and a partner added once, whichever process is first (unique partial indexes).
One new table; nothing existing is rewritten.

Revision ID: g0011
Revises: g0010
"""

import sqlalchemy as sa
from alembic import op

revision = "g0011"
down_revision = "g0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "b2b_partner_changes",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("at", sa.BigInteger, nullable=False),
        sa.Column("operator", sa.String(64), nullable=False),
        sa.Column("action", sa.String(20), nullable=False),
        sa.Column("partner", sa.String(100), nullable=False),
        sa.Column("key_id", sa.String(64)),
        sa.Column("sha256", sa.String(64)),
        sa.Column("data", sa.Text),
        sqlite_autoincrement=True,
    )
    for name, column, action in (
        ("ux_b2b_partner_changes_key", "key_id", "key-issue"),
        ("ux_b2b_partner_changes_partner", "partner", "partner-add"),
    ):
        op.create_index(
            name,
            "b2b_partner_changes",
            [column],
            unique=True,
            sqlite_where=sa.text(f"action = '{action}'"),
            postgresql_where=sa.text(f"action = '{action}'"),
        )


def downgrade() -> None:
    op.drop_index("ux_b2b_partner_changes_partner", table_name="b2b_partner_changes")
    op.drop_index("ux_b2b_partner_changes_key", table_name="b2b_partner_changes")
    op.drop_table("b2b_partner_changes")
