"""Alembic environment of the warehouse load's own tables (``etl_runs``, ``etl_quarantine``, ``etl_lock``;
see broker_core.sql.migrate)."""

from broker_core.sql import run_migrations
from spark_etl.state import metadata

run_migrations(metadata, "b2b_etl_version")
