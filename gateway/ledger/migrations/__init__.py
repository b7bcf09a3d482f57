"""The document ledger's Alembic migrations (version table ``b2b_gateway_version``)."""
