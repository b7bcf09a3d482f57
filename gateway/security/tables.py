"""The security tables: the server secret, migrated key digests, login failures (ledger migration g0007), and
the partner changes made from the admin side (g0011)."""

from __future__ import annotations

import sqlalchemy as sa

__all__ = ["key_digests", "login_failures", "metadata", "partner_changes", "server_secrets"]

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

#: Partners, keys and pins changed from the admin side, over partners.yaml: one row per change, in order
#: (gateway.routing.overlay folds them). ``action``: partner-add, key-issue, key-revoke, pin-add, pin-remove.
#: The greatest ``seq`` is the version every serving process polls. A key is stored as its scrypt hash only.
partner_changes = sa.Table(
    "b2b_partner_changes",
    metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("at", sa.BigInteger, nullable=False),  # epoch ms
    sa.Column("operator", sa.String(64), nullable=False),
    sa.Column("action", sa.String(20), nullable=False),
    sa.Column("partner", sa.String(100), nullable=False),
    sa.Column("key_id", sa.String(64)),
    sa.Column("sha256", sa.String(64)),
    sa.Column("data", sa.Text),  # JSON: name; hash, label, not_before, not_after (epoch ms); pin label
    # a key id issued once, a partner added once, whichever process is first
    sa.Index(
        "ux_b2b_partner_changes_key",
        "key_id",
        unique=True,
        sqlite_where=sa.text("action = 'key-issue'"),
        postgresql_where=sa.text("action = 'key-issue'"),
    ),
    sa.Index(
        "ux_b2b_partner_changes_partner",
        "partner",
        unique=True,
        sqlite_where=sa.text("action = 'partner-add'"),
        postgresql_where=sa.text("action = 'partner-add'"),
    ),
    sqlite_autoincrement=True,
)
