"""A STOMP server on 127.0.0.1, port chosen by the OS, its event loop in a thread."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from broker_core import Broker
from broker_core.stomp import StompServer, StompUser, hash_passcode

_HASHES: dict[str, str] = {}


def passcode_hash(passcode: str) -> str:
    """The hash of *passcode*, made once per test run (scrypt is slow by design)."""
    if passcode not in _HASHES:
        _HASHES[passcode] = hash_passcode(passcode)
    return _HASHES[passcode]


def trusted(login: str = "user", passcode: str = "pw") -> StompUser:
    """A user with every right: the tests of the protocol log in as ``user``/``pw``."""
    return StompUser.with_all_rights(login, passcode_hash(passcode))


class ServerThread:
    def __init__(self, broker: Broker, **options: Any) -> None:
        self.broker = broker
        self.loop = asyncio.new_event_loop()
        options.setdefault("users", [trusted()])
        self.server = StompServer(broker, host="127.0.0.1", port=0, **options)
        self._thread = threading.Thread(target=self.loop.run_forever, name="stomp-test-loop", daemon=True)
        self._thread.start()
        self.call(self.server.start())
        self.port = self.server.port

    def call(self, coro: Any, timeout: float = 15) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        try:
            self.call(self.server.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)


@pytest.fixture
def stomp_user() -> Any:
    """``stomp_user(login, passcode, **rights)``: a StompUser (every right unless some are given)."""

    def make(login: str = "user", passcode: str = "pw", **rights: Any) -> StompUser:
        if not rights:
            return trusted(login, passcode)
        return StompUser(login, passcode_hash(passcode), **rights)

    return make


@pytest.fixture
def broker() -> Iterator[Broker]:
    b = Broker.open("memory://")
    yield b
    b.close()


@pytest.fixture
def sqlite_url() -> str:
    os.makedirs("/tmp/stomp", exist_ok=True)
    return f"sqlite:////tmp/stomp/test-{uuid.uuid4().hex}.db"


@pytest.fixture
def start_server() -> Iterator[Any]:
    servers: list[ServerThread] = []

    def start(broker: Broker, **options: Any) -> ServerThread:
        server = ServerThread(broker, **options)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def server(broker: Broker, start_server: Any) -> ServerThread:
    return start_server(broker, heartbeat=(0, 0))
