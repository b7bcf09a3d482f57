"""Alembic environment of the deliveries' tables (see broker_core.sql.migrate)."""

from broker_core.sql import run_migrations
from gateway.delivery.tables import metadata

run_migrations(metadata, "b2b_delivery_version")
