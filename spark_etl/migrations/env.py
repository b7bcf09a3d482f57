"""Alembic environment of the warehouse load's own tables (``etl_runs``, ``etl_quarantine``, ``etl_lock``;
see broker_core.sql.migrate)."""

from spark_etl.state import metadata
from broker_core.sql import run_migrations

run_migrations(metadata, "b2b_etl_version")
