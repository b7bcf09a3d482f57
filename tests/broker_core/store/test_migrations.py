"""The store's schema migrations: a database made by an older release is
upgraded at open (SQLite) and keeps its messages."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from broker_core import Broker, Queue
from broker_core.sql import MIGRATIONS, VERSION_TABLE, current_revision, head_revision, make_engine, write_connection


def test_an_older_sqlite_store_is_upgraded_at_open_and_keeps_its_messages(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    with Broker.open(url, sweep_interval=0) as broker, broker.connect() as conn:
        session = conn.create_session()
        session.create_producer(Queue("kept")).send(session.create_text_message("from before"))
    engine = make_engine(url)
    cfg = Config()
    cfg.set_main_option("script_location", MIGRATIONS)
    with write_connection(engine) as connection:
        cfg.attributes["connection"] = connection
        command.downgrade(cfg, "0001")
        connection.commit()
    assert current_revision(engine, VERSION_TABLE) == "0001"
    assert "last_commit" not in {c["name"] for c in sa.inspect(engine).get_columns("b2b_instances")}
    engine.dispose()

    with Broker.open(url, sweep_interval=0) as broker, broker.connect() as conn:
        conn.start()
        message = conn.create_session().create_consumer(Queue("kept")).receive(timeout=2)
        assert message is not None and message.text == "from before"
    engine = make_engine(url)
    assert current_revision(engine, VERSION_TABLE) == head_revision(MIGRATIONS)
    assert "last_commit" in {c["name"] for c in sa.inspect(engine).get_columns("b2b_instances")}
    engine.dispose()


def test_an_unreachable_store_is_named_without_its_password():
    """The error reaches logs and terminals: it names the store, never its password."""
    from broker_core import StoreUnavailableError

    with pytest.raises(StoreUnavailableError) as info:
        Broker.open("postgresql+psycopg://app:s3cret-pw@127.0.0.1:1/nowhere")
    message = str(info.value)
    assert "s3cret-pw" not in message
    assert "127.0.0.1:1/nowhere" in message
