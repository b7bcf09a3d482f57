"""Security: the server secret, partner key digests migrated from scrypt, and failed operator logins.

``b2b_server_secrets`` holds the secret every serving process keys partner key digests with (made on first
use); ``b2b_key_digests`` the HMAC digest of each scrypt-hashed key once it verified, so that later checks
cost an HMAC; ``b2b_login_failures`` the operators' lockout by name and address, shared by the processes.

Three new tables; nothing existing is rewritten.

Revision ID: g0007
Revises: g0006
"""

import sqlalchemy as sa
from alembic import op

revision = "g0007"
down_revision = "g0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "b2b_server_secrets",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(200), nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "b2b_key_digests",
        sa.Column("key_id", sa.String(64), primary_key=True),
        sa.Column("source", sa.String(300), nullable=False),
        sa.Column("digest", sa.String(100), nullable=False),
        sa.Column("migrated_at", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "b2b_login_failures",
        sa.Column("subject", sa.String(200), primary_key=True),
        sa.Column("failures", sa.Integer, nullable=False),
        sa.Column("locked_until", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    )
    op.create_index("ix_b2b_login_failures_updated", "b2b_login_failures", ["updated_at"])


def downgrade() -> None:
    op.drop_index("ix_b2b_login_failures_updated", table_name="b2b_login_failures")
    op.drop_table("b2b_login_failures")
    op.drop_table("b2b_key_digests")
    op.drop_table("b2b_server_secrets")
