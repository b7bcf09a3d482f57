"""The server secret: made once, kept in the store, read by every process that serves from it.

It keys the HMAC-SHA256 digests of partner keys (:mod:`gateway.security.keys`). Kept in the store's own
database (``b2b_server_secrets``), it is where every serving process (``--processes N``, several hosts on one
PostgreSQL) already looks, it is backed up with the data it protects, and nothing else need be configured or
copied. The first process that needs it inserts a random one; a concurrent first insert is ignored and both
read the one that won.
"""

from __future__ import annotations

import base64
import secrets
import time

import sqlalchemy as sa

from gateway.security.tables import server_secrets

__all__ = ["PARTNER_KEYS", "read_or_create_secret"]

#: The name of the partner keys' HMAC secret.
PARTNER_KEYS = "partner-keys"


def _insert_ignoring_conflict(conn: sa.Connection, row: dict[str, object]) -> None:
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    conn.execute(insert(server_secrets).values(**row).on_conflict_do_nothing(index_elements=["name"]))


def read_or_create_secret(conn: sa.Connection, name: str = PARTNER_KEYS) -> bytes:
    """The secret *name* (32 bytes), inserted at random first if the store has none (in *conn*'s transaction)."""
    query = sa.select(server_secrets.c.value).where(server_secrets.c.name == name)
    value = conn.execute(query).scalar()
    if value is None:
        fresh = base64.urlsafe_b64encode(secrets.token_bytes(32)).decode("ascii")
        _insert_ignoring_conflict(conn, {"name": name, "value": fresh, "created_at": int(time.time() * 1000)})
        value = conn.execute(query).scalar()
    return base64.urlsafe_b64decode(value)
