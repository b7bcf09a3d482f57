"""Database faults: PostgreSQL restarted in the middle of a stream.

Senders retry transparently (the store retries writes through an outage for
``retry_for`` seconds); the consumer reconnects by itself; at the end every
message whose send returned was received exactly once.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import subprocess
import threading
import time

import pytest

from broker_core import AckMode, Broker, Queue

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("broker_core._sql") is None, reason="the SQL store is not installed"),
]


def local_cluster() -> tuple[str, str] | None:
    """(version, name) of the local cluster on port 5432 if this test may restart it."""
    if shutil.which("pg_ctlcluster") is None or shutil.which("pg_lsclusters") is None or os.geteuid() != 0:
        return None
    out = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "5432" and fields[3] == "online":
            return fields[0], fields[1]
    return None


def restart(cluster: tuple[str, str]) -> None:
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", cluster[0], cluster[1], "restart", "-m", "fast"],
        check=True,
        capture_output=True,
    )


def test_restart_postgres_mid_stream(postgres_schema):
    cluster = local_cluster()
    if cluster is None:
        pytest.skip(
            "the PostgreSQL server on port 5432 is not under this test's control "
            "(needs root, pg_ctlcluster and a local online cluster)"
        )
    total = 1500
    broker = Broker.open(postgres_schema, sweep_interval=0, retry_for=60.0, heartbeat_interval=0.5, lease_timeout=30.0)
    sent: list[str] = []
    received: list[str] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def produce() -> None:
        try:
            with broker.connect() as conn:
                session = conn.create_session()
                producer = session.create_producer(Queue("faults"))
                for i in range(total):
                    producer.send(session.create_text_message(f"m{i}"))
                    sent.append(f"m{i}")
                    time.sleep(0.001)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            done.set()

    def consume() -> None:
        try:
            with broker.connect() as conn:
                conn.start()
                session = conn.create_session(False, AckMode.CLIENT)
                consumer = session.create_consumer(Queue("faults"))
                idle_since = time.monotonic()
                while not (done.is_set() and time.monotonic() - idle_since > 3):
                    message = consumer.receive(timeout=0.5)
                    if message is None:
                        continue
                    idle_since = time.monotonic()
                    received.append(message.text)
                    message.acknowledge()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for thread in threads:
        thread.start()
    while len(sent) < 300 and not done.is_set():
        time.sleep(0.01)
    started = time.monotonic()
    restart(cluster)
    outage = time.monotonic() - started
    for thread in threads:
        thread.join(timeout=180)
    broker.close()
    assert not errors, errors
    lost = set(sent) - set(received)
    duplicated = len(received) - len(set(received))
    print(
        f"\nPostgreSQL restarted ({outage:.1f} s) after {300} sends: sent={len(sent)} received={len(received)} "
        f"lost={len(lost)} duplicated={duplicated}"
    )
    assert len(sent) == total
    assert (len(lost), duplicated) == (0, 0)


def test_a_commit_whose_answer_is_lost_is_neither_lost_nor_repeated(postgres_schema):
    """The connection drops while COMMIT is in flight: the server committed,
    the client got an error. The writer must find out that it committed, not
    run the sends (and the in-transaction writes) a second time."""
    import sqlalchemy as sa

    broker = Broker.open(postgres_schema, sweep_interval=0)
    try:
        writer = broker.store._writer
        real_connection = writer._connection
        lost_answers = []

        def connection_that_loses_one_answer():
            conn = real_connection()
            if lost_answers:
                return conn
            real_commit = conn.commit

            def commit():
                real_commit()  # the server commits ...
                lost_answers.append(True)
                conn.commit = real_commit
                # ... and the answer never arrives
                raise sa.exc.OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))

            conn.commit = commit
            return conn

        writer._connection = connection_that_loses_one_answer
        with broker.connect() as conn:
            conn.start()
            session = conn.create_session(transacted=True)
            producer = session.create_producer(Queue("faults.commit"))
            for i in range(3):
                producer.send(session.create_text_message(f"c{i}"))
            ran = []
            asyncio.run(
                session.commit_async(in_transaction=[lambda c: ran.append(c.exec_driver_sql("SELECT 1").scalar())])
            )
            assert lost_answers == [True]
            assert ran == [1]  # the in-transaction work ran once: the retry found the commit had happened
            consumer = conn.create_session().create_consumer(Queue("faults.commit"))
            texts = []
            while (message := consumer.receive(timeout=1)) is not None:
                texts.append(message.text)
        assert texts == ["c0", "c1", "c2"]
    finally:
        broker.close()
