"""The security tables (ledger migration g0007): the server secret, migrated key digests, login failures."""

from __future__ import annotations

import sqlalchemy as sa

__all__ = ["key_digests", "login_failures", "metadata", "server_secrets"]

metadata = sa.MetaData()

#: Secrets the serving processes share, by name (``partner-keys``: the HMAC key of partner key digests).
server_secrets = sa.Table(
    "b2b_server_secrets",
    metadata,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("value", sa.String(200), nullable=False),  # URL-safe base64
    sa.Column("created_at", sa.BigInteger, nullable=False),
)

#: A partner key configured as a scrypt hash, once verified: its HMAC digest, so later checks skip scrypt.
#: ``source`` is the scrypt hash it was verified against (a changed hash in partners.yaml voids the row).
key_digests = sa.Table(
    "b2b_key_digests",
    metadata,
    sa.Column("key_id", sa.String(64), primary_key=True),
    sa.Column("source", sa.String(300), nullable=False),
    sa.Column("digest", sa.String(100), nullable=False),
    sa.Column("migrated_at", sa.BigInteger, nullable=False),
)

#: Failed operator logins by (operator name, client address): the lockout every process shares.
login_failures = sa.Table(
    "b2b_login_failures",
    metadata,
    sa.Column("subject", sa.String(200), primary_key=True),  # "<name>\n<address>"
    sa.Column("failures", sa.Integer, nullable=False),
    sa.Column("locked_until", sa.BigInteger, nullable=False),  # epoch ms
    sa.Column("updated_at", sa.BigInteger, nullable=False),
    sa.Index("ix_b2b_login_failures_updated", "updated_at"),
)
