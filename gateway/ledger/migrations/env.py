"""Alembic environment of the gateway's document ledger (see broker_core.sql.migrate)."""

from ledger_contract.tables import metadata
from broker_core.sql import run_migrations

run_migrations(metadata, "b2b_gateway_version")
