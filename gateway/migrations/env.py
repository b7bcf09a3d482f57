"""Alembic environment of the gateway's document ledger: runs on the
connection the caller passes in ``config.attributes["connection"]``, with
its own version table so it lives beside the broker's tables."""

from alembic import context

from ledger_contract.tables import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table="b2b_gateway_version",
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
