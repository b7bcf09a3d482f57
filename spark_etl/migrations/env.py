"""Alembic environment of the warehouse load's own tables (``etl_runs``,
``etl_quarantine``, ``etl_lock``); version table ``b2b_etl_version``. Runs on
the connection the caller passes in ``config.attributes["connection"]``."""

from alembic import context

from spark_etl.state import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table="b2b_etl_version",
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
