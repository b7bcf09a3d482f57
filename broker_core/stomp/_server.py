"""The asyncio STOMP server: accepts connections, one task each."""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_module
from collections.abc import Iterable, Mapping
from typing import Any

from ._auth import Authenticator
from ._connection import StompConnection
from ._frames import DEFAULT_MAX_FRAME_SIZE, DEFAULT_MAX_HEADER_BYTES, DEFAULT_MAX_HEADERS, Frame, encode
from ._limits import MemoryBudget, StompLimits
from ._settings import ListenerSettings
from ._users import StompUser

__all__ = ["StompServer", "DEFAULT_PORT", "NoUsersError"]

log = logging.getLogger(__name__)

DEFAULT_PORT = 61613


class NoUsersError(ValueError):
    """Raised by :class:`StompServer` given no users: a listener that would
    accept any login is never started."""


class StompServer:
    """A STOMP 1.2 listener (1.0 and 1.1 clients accepted) over ``broker``.

    ``users``: the :class:`StompUser` s allowed to CONNECT (a list, or a
    ``{login: user}`` mapping), each with its passcode's hash and its rights;
    at least one (:class:`NoUsersError` otherwise). ``limits``: a
    :class:`StompLimits` (default: its safe defaults). ``heartbeat``: the (send, receive)
    milliseconds the server offers in CONNECTED. ``max_frame_size``: the
    largest body accepted. ``prefetch``: unacknowledged messages per
    client-ack subscription unless its SUBSCRIBE says otherwise
    (``activemq.prefetchSize`` or ``prefetch``). ``selector_string_numbers``
    (``convert`` or ``strict``; default: the broker's, ``convert`` unless
    ``Broker.open`` was told otherwise): ``convert`` marks every message sent
    here so that selectors read its string properties (STOMP headers are all
    strings) as numbers where they want one, as ActiveMQ does, so that
    ``amount > 100`` matches ``amount:150``; ``strict`` keeps the JMS rule,
    under which a string never compares with a number. ``port=0`` lets the
    OS choose; :attr:`port` is the actual port once started.
    """

    def __init__(
        self,
        broker: Any,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        users: Iterable[StompUser] | Mapping[str, StompUser] | None = None,
        heartbeat: tuple[int, int] = (10000, 10000),
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        prefetch: int = 1000,
        max_headers: int = DEFAULT_MAX_HEADERS,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
        selector_string_numbers: str | None = None,
        limits: StompLimits | None = None,
        ssl: ssl_module.SSLContext | None = None,
    ) -> None:
        if isinstance(users, Mapping):
            users = list(users.values())
        found = list(users or ())
        if not found:
            raise NoUsersError(
                "a STOMP listener needs at least one user (login, passcode hash, rights): without "
                "users it would accept any login"
            )
        for user in found:
            if not isinstance(user, StompUser):
                raise TypeError(
                    f"users must be StompUser objects (the passcode's hash and the rights), got {type(user).__name__}"
                )
        if prefetch < 1:
            raise ValueError("prefetch must be at least 1")
        if selector_string_numbers is None:
            selector_string_numbers = getattr(broker, "selector_string_numbers", "convert")
        if selector_string_numbers not in ("strict", "convert"):
            raise ValueError(f"selector_string_numbers must be 'strict' or 'convert', not {selector_string_numbers!r}")
        self.selector_string_numbers = selector_string_numbers
        #: whether messages sent here are marked for selectors that read strings as numbers
        self.string_numbers = selector_string_numbers == "convert"
        self.broker = broker
        self.host = host
        self.port = port
        self.users = {user.login: user for user in found}
        self.heartbeat = (int(heartbeat[0]), int(heartbeat[1]))
        self.max_frame_size = max_frame_size
        self.max_headers = max_headers
        self.max_header_bytes = max_header_bytes
        self.prefetch = prefetch
        self.limits = limits if limits is not None else StompLimits()
        #: STOMP over TLS: the server context (its certificate may be reloaded in place by its owner)
        self.ssl = ssl
        self.settings = ListenerSettings(
            broker=broker,
            heartbeat=self.heartbeat,
            prefetch=prefetch,
            max_frame_size=max_frame_size,
            max_headers=max_headers,
            max_header_bytes=max_header_bytes,
            string_numbers=self.string_numbers,
            limits=self.limits,
            authenticator=Authenticator(self.users),
            memory=MemoryBudget(self.limits.memory_bytes),
        )
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[StompConnection] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def connections(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._accept,
            self.host,
            self.port,
            limit=256 * 1024,
            ssl=self.ssl,
            # a handshake that does not finish is refused like a CONNECT that does not come
            ssl_handshake_timeout=self.limits.connect_timeout if self.ssl is not None else None,
        )
        sockets = self._server.sockets or ()
        if sockets:
            self.port = sockets[0].getsockname()[1]
        log.info("STOMP listener on %s:%d%s", self.host, self.port, " (TLS)" if self.ssl is not None else "")

    @property
    def memory_held(self) -> int:
        """Bytes of messages the listener holds in memory now (see :class:`MemoryBudget`)."""
        return self.settings.memory.snapshot()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._connections) >= self.limits.connections:
            try:  # refused before anything is read
                writer.write(
                    encode(
                        Frame(
                            "ERROR",
                            {"message": "too many connections", "content-type": "text/plain"},
                            f"the listener already has {len(self._connections)} connections (its "
                            "limit); try again later".encode(),
                        ),
                        "1.0",
                    )
                )
                writer.close()
            except Exception:
                pass
            log.warning(
                "STOMP connection from %s refused: %d connections open",
                writer.get_extra_info("peername"),
                len(self._connections),
            )
            return
        conn = StompConnection(self.settings, reader, writer, on_closed=self._connection_done)
        self._connections.add(conn)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await conn.run()
        finally:
            if task is not None:
                self._tasks.discard(task)

    def _connection_done(self, conn: StompConnection) -> None:
        self._connections.discard(conn)

    async def stop(self) -> None:
        """Stop listening, close every connection (their unacknowledged
        messages are redelivered) and wait for them to finish."""
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.closed = True
            try:
                conn.transport.close()
            except Exception:
                pass
        tasks = list(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=10)
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 5)
            except TimeoutError:
                pass
            self._server = None

    async def serve_forever(self) -> None:
        """Start (if needed) and serve until cancelled; then stop."""
        if self._server is None:
            await self.start()
        try:
            await asyncio.Event().wait()
        finally:
            await self.stop()

    async def __aenter__(self) -> StompServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()
