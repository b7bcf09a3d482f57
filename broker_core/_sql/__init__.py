"""The SQL store (SQLite and PostgreSQL) for persistent delivery."""

from ._store import SQLStore, upgrade_database

__all__ = ["SQLStore", "upgrade_database"]
