"""Alembic environment of the broker's SQL store (see broker_core.sql.migrate)."""

from broker_core._sql._schema import metadata
from broker_core.sql import VERSION_TABLE, run_migrations

run_migrations(metadata, VERSION_TABLE)
