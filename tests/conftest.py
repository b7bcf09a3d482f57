"""Fixtures shared by every test package.

``make_broker(**options)`` opens a broker on the store under test; the
semantic suite in tests/broker_core runs once per store: memory, SQLite and
PostgreSQL (when the SQL store is installed). PostgreSQL tests skip with a
reason when the server is absent, unless B2BGW_REQUIRE_POSTGRES=1 (set by
.ci/run), which turns the absence into a failure.
"""

from __future__ import annotations

import importlib.util
import os
import uuid

import pytest

from broker_core import Broker

POSTGRES_URL = os.environ.get("B2BGW_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REQUIRE_POSTGRES = os.environ.get("B2BGW_REQUIRE_POSTGRES") == "1"

HAVE_SQL_STORE = importlib.util.find_spec("sqlalchemy") is not None
#: Stores the semantic suite runs on; B2BGW_TEST_STORES=memory,sqlite narrows it.
STORES = [s for s in os.environ.get("B2BGW_TEST_STORES", "memory,sqlite,postgres").split(",") if s]
if not HAVE_SQL_STORE:
    STORES = [s for s in STORES if s == "memory"]


def postgres_available() -> str | None:
    """None when PostgreSQL answers, else the reason it does not."""
    try:
        import psycopg

        dsn = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return None
    except Exception as exc:  # any failure means: not usable here
        return f"PostgreSQL not reachable at {POSTGRES_URL}: {exc}"


def require_postgres() -> None:
    reason = postgres_available()
    if reason is not None:
        if REQUIRE_POSTGRES:
            pytest.fail(f"B2BGW_REQUIRE_POSTGRES=1 but {reason}")
        pytest.skip(reason)


@pytest.fixture(scope="session")
def _postgres_session_schema():
    """One migrated PostgreSQL schema for the whole run (dropped at the end)."""
    require_postgres()
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    dsn = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in POSTGRES_URL else "?"
    url = f"{POSTGRES_URL}{sep}schema={schema}"
    if HAVE_SQL_STORE:
        from broker_core.sql import upgrade_database

        upgrade_database(url)  # what `b2bgw db upgrade` does
    yield schema, url
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def postgres_schema(_postgres_session_schema):
    """The broker URL of an empty, migrated PostgreSQL schema: every table
    but Alembic's is truncated before each test."""
    import psycopg

    schema, url = _postgres_session_schema
    dsn = POSTGRES_URL.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename NOT LIKE %s", (schema, "%version")
            )
        ]
        if tables:
            conn.execute("TRUNCATE " + ", ".join(f'"{schema}"."{t}"' for t in tables) + " RESTART IDENTITY")
    return url


@pytest.fixture(params=STORES)
def store_kind(request) -> str:
    return request.param


@pytest.fixture
def broker_url(store_kind, tmp_path, request) -> str:
    if store_kind == "memory":
        return "memory://"
    if store_kind == "sqlite":
        return f"sqlite:///{tmp_path / 'broker.db'}"
    return request.getfixturevalue("postgres_schema")


@pytest.fixture
def make_broker(broker_url):
    """Open brokers on the store under test (closed at teardown).
    ``sweep_interval`` defaults to 0 so tests control expiry sweeps."""
    opened = []

    def make(**options) -> Broker:
        options.setdefault("sweep_interval", 0)
        broker = Broker.open(broker_url, **options)
        opened.append(broker)
        return broker

    yield make
    for broker in reversed(opened):
        broker.close()


@pytest.fixture
def broker(make_broker) -> Broker:
    return make_broker()
