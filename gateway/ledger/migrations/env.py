"""Alembic environment of the gateway's document ledger (see broker_core.sql.migrate)."""

from broker_core.sql import run_migrations
from ledger_contract.tables import metadata

run_migrations(metadata, "b2b_gateway_version")
