"""Fixtures of the broker_core semantic suite.

They build only on ``broker`` / ``make_broker`` from tests/conftest.py, so the
suite runs unchanged on every store.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from broker_core import AckMode, Connection, Destination, Message, MessageConsumer, Session


@pytest.fixture
def conn(broker) -> Connection:
    """A started connection without a client id."""
    connection = broker.connect()
    connection.start()
    return connection


@pytest.fixture
def session(conn) -> Session:
    """An AUTO_ACKNOWLEDGE session on ``conn``."""
    return conn.create_session(ack_mode=AckMode.AUTO)


@pytest.fixture
def send(session) -> Callable[..., list[Message]]:
    """``send(destination, *texts, **send_options)``: send text messages from
    ``session``; returns the sent messages (their headers are set)."""

    def send(destination: Destination, *texts: str, **options) -> list[Message]:
        producer = session.create_producer(destination)
        sent = []
        for text in texts:
            message = session.create_text_message(text)
            producer.send(message, **options)
            sent.append(message)
        producer.close()
        return sent

    return send


@pytest.fixture
def drain() -> Callable[..., list[Message]]:
    """``drain(consumer, timeout=0)``: receive until nothing comes for
    ``timeout`` s (by default until nothing is available now: sends return
    once stored, so what was sent before is available at once)."""

    def drain(consumer: MessageConsumer, timeout: float = 0.0) -> list[Message]:
        out = []
        while True:
            message = consumer.receive(timeout=timeout) if timeout else consumer.receive_no_wait()
            if message is None:
                return out
            out.append(message)

    return drain


@pytest.fixture
def run_threads() -> Callable[..., list]:
    """``run_threads(fn, n, timeout=60)``: run ``fn(i)`` in ``n`` threads, join
    them with a timeout, re-raise the first failure, return the results."""

    def run(fn: Callable[[int], object], n: int, timeout: float = 60.0) -> list:
        results: list = [None] * n
        errors: list[BaseException] = []

        def target(i: int) -> None:
            try:
                results[i] = fn(i)
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=target, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in threads), f"threads still running after {timeout} s"
        if errors:
            raise errors[0]
        return results

    return run
