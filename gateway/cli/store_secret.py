"""The server secret read (or made) from a store URL, for commands that run without a broker."""

from __future__ import annotations

from gateway.errors import ConfigError
from gateway.security.secret import read_or_create_secret

__all__ = ["store_secret"]


def store_secret(url: str) -> bytes:
    """The partner keys' secret in the store at *url* (SQLite: its tables are made or upgraded first)."""
    from broker_core.sql import make_engine, write_connection
    from gateway.ledger.records import current_revision, head_revision, upgrade_ledger

    if not url.startswith(("sqlite:", "postgresql")):
        raise ConfigError(
            "store.url: the server secret is kept in a SQL store (sqlite:///PATH or postgresql+psycopg://USER@HOST/DB)"
        )
    engine = make_engine(url)
    try:
        if engine.dialect.name == "sqlite":
            upgrade_ledger(engine)
        elif current_revision(engine) != head_revision():
            raise ConfigError("the ledger tables are behind the gateway's: run `b2bgw db upgrade` first")
        with write_connection(engine) as conn, conn.begin():
            return read_or_create_secret(conn)
    finally:
        engine.dispose()
