"""Alembic environment of the broker's SQL store: runs on the connection the
caller passes in ``config.attributes["connection"]``."""

from alembic import context

from broker_core._sql._schema import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table="b2b_broker_version",
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
