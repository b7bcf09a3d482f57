"""uvicorn's HTTP protocol, with a cheap close after an early answer.

The gateway answers some requests before it has read their body: a partner over its limits (429), a bad API
key (401), a wrong media type (415). uvicorn then keeps the connection and reads the rest of the body
through its parser, to throw it away: a client that sends 10 MiB and gets a 429 at once still makes the
event loop read 10 MiB, a copy and a parser call per chunk. A flood of such requests would cost the serving
process the event loop time its honest partners need. (A 413 by declared length says ``Connection: close``,
and uvicorn closes that connection at once.)

:class:`GatewayHttpProtocol` closes such a connection in stages, as RFC 9112 (section 9.6) asks: it sends
the answer and then its end of the connection (a half-close), so the client learns that nothing more will be
read; it throws away what the client still sends without copying it (``recv`` with ``MSG_TRUNC``, which
TCP on Linux discards in the kernel; at most every :data:`DRAIN_PAUSE`), and closes once the client has
closed its end, or after :data:`LINGER_SECONDS` or :data:`LINGER_BYTES`, whichever comes first. Closing
while unread data waits would reset the connection, and a client that is still sending might never read
the answer; draining first lets it read the answer however it sends.

The draining is done by one thread of the process (:class:`_Drainer`), not by the event loop: a partner
that keeps sending large bodies over its limits has megabytes discarded for each, and each ``recv`` holds
up the thread that makes it while the kernel frees them. On the event loop that time would come out of
every other partner's requests; the drainer's thread holds the interpreter lock only between its system
calls, and the event loop hears of a drained connection once, to close it.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import logging
import os
import selectors
import socket
import sys
import threading
import time
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.trust.peer import tls_extension

__all__ = ["GatewayHttpProtocol", "LINGER_SECONDS", "LINGER_BYTES", "DRAIN_PAUSE"]

log = logging.getLogger(__name__)

#: The longest a connection lingers after an early answer, draining what its client still sends.
LINGER_SECONDS = 5.0
#: The most bytes drained after an early answer (a body is at most ``limits.max_bytes``; this bounds the
#: work for a client that sends more than it declared).
LINGER_BYTES = 64 * 1024 * 1024
#: How much one ``recv`` discards. With MSG_TRUNC the kernel never writes into the buffer, but CPython wants
#: one of the size asked for: one, shared by every connection.
_DRAIN_CHUNK = 1024 * 1024
_DISCARD = bytearray(_DRAIN_CHUNK)
#: Seconds between two drains of one connection. Draining on every arrival would wake the event loop for each
#: segment a fast client sends (hundreds for a 9 MB body), every wake-up a wait for the interpreter lock;
#: meanwhile TCP's flow control holds the client to what the receive buffer takes.
DRAIN_PAUSE = 0.05
#: MSG_TRUNC discards TCP data in the kernel on Linux; elsewhere the drain copies into the buffer.
_TRUNC = getattr(socket, "MSG_TRUNC", 0) if sys.platform.startswith("linux") else 0


class _Drain:
    """A half-closed connection whose client may still be sending: what is left to discard, until when."""

    def __init__(self, protocol: GatewayHttpProtocol, sock: socket.socket) -> None:
        self.protocol = protocol
        self.loop: asyncio.AbstractEventLoop = protocol.loop
        self.sock = sock
        self.left = LINGER_BYTES
        self.deadline = time.monotonic() + LINGER_SECONDS
        self.cancelled = False  # the connection was lost meanwhile (set on the event loop)

    def drain(self) -> bool:
        """Discard what has come (on the drainer's thread); False once the connection is done with."""
        try:
            while self.left > 0:
                n = self.sock.recv_into(_DISCARD, min(self.left, _DRAIN_CHUNK), _TRUNC)
                if n == 0:  # the client closed its end: it has had the answer
                    return False
                self.left -= n
            return False
        except (BlockingIOError, InterruptedError):  # all drained for now: the next drain after a pause
            return True
        except OSError:
            return False

    def closed(self) -> None:
        """The drainer has closed its socket: close the transport (on the event loop)."""
        if self.protocol._drain is self:
            self.protocol._drain = None
        self.protocol.transport.close()


class _Drainer:
    """The thread that drains every connection of the process answered before its body was read."""

    _instance: _Drainer | None = None
    _instance_lock = threading.Lock()

    @classmethod
    def get(cls) -> _Drainer:
        with cls._instance_lock:
            if cls._instance is None or not cls._instance.thread.is_alive():
                cls._instance = cls()
            return cls._instance

    def __init__(self) -> None:
        self.selector = selectors.DefaultSelector()
        self.wake_in, self.wake_out = socket.socketpair()
        for end in (self.wake_in, self.wake_out):
            end.setblocking(False)
        self.selector.register(self.wake_in, selectors.EVENT_READ, None)
        self.added: collections.deque[_Drain] = collections.deque()
        self.thread = threading.Thread(target=self._run, name="b2bgw-http-drain", daemon=True)
        self.thread.start()

    def add(self, drain: _Drain) -> None:
        self.added.append(drain)
        self.wake()

    def wake(self) -> None:
        try:
            self.wake_out.send(b"\0")
        except (BlockingIOError, OSError):  # a wake-up is pending already
            pass

    def _run(self) -> None:
        active: set[_Drain] = set()
        paused: list[tuple[float, int, _Drain]] = []  # (when to listen again, tie-break, drain)
        order = itertools.count()
        while True:
            try:
                while self.added:
                    drain = self.added.popleft()
                    active.add(drain)
                    self.selector.register(drain.sock, selectors.EVENT_READ, drain)
                now = time.monotonic()
                wait = min([d.deadline for d in active] + [p[0] for p in paused[:1]], default=now + 60) - now
                for key, _ in self.selector.select(max(0.0, wait)):
                    drain = key.data
                    if drain is None:
                        self.wake_in.recv(4096)
                        continue
                    if drain.cancelled:
                        continue
                    if drain.drain():
                        self.selector.unregister(drain.sock)
                        heapq.heappush(paused, (time.monotonic() + DRAIN_PAUSE, next(order), drain))
                    else:
                        self._finish(drain, active)
                now = time.monotonic()
                while paused and paused[0][0] <= now:
                    drain = heapq.heappop(paused)[2]
                    if drain in active:
                        self.selector.register(drain.sock, selectors.EVENT_READ, drain)
                for drain in [d for d in active if d.cancelled or d.deadline <= now]:
                    self._finish(drain, active)
            except Exception:  # a bug here must not leave connections open for ever
                log.exception("the connection drainer failed; closing what it drained")
                for drain in list(active):
                    self._finish(drain, active)
                paused.clear()

    def _finish(self, drain: _Drain, active: set[_Drain]) -> None:
        active.discard(drain)
        try:
            self.selector.unregister(drain.sock)
        except (KeyError, ValueError):  # paused: not listened to
            pass
        drain.sock.close()
        try:
            drain.loop.call_soon_threadsafe(drain.closed)
        except RuntimeError:  # the event loop has closed: so has the transport
            pass


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol; a response sent before its request's body was read ends the connection
    in stages (see the module docstring) instead of reading the rest of the body through the parser."""

    _drain: _Drain | None = None
    #: the connection's ASGI TLS extension (gateway.trust.peer), None over plain TCP
    _tls: dict[str, Any] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._tls = tls_extension(transport)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._tls is not None:
            self.scope["extensions"] = {"tls": self._tls}

    def on_response_complete(self) -> None:
        cycle = self.cycle
        transport = self.transport
        if cycle is None or not cycle.more_body or transport.is_closing():
            super().on_response_complete()
            return
        # answered before the body was read: no more requests on this connection
        self.server_state.total_requests += 1
        self._unset_keepalive_if_required()
        self.flow.pause_reading()
        sock = transport.get_extra_info("socket")
        try:
            own = socket.socket(fileno=os.dup(sock.fileno()))  # the transport's fd is its own to watch
            own.setblocking(False)
        except (OSError, AttributeError, ValueError):
            transport.close()
            return
        if transport.can_write_eof():
            transport.write_eof()  # after the answer: the client sees the end of the connection
        self._drain = _Drain(self, own)
        _Drainer.get().add(self._drain)

    def connection_lost(self, exc: Exception | None) -> None:
        drain, self._drain = self._drain, None
        if drain is not None:
            drain.cancelled = True
            _Drainer.get().wake()
        super().connection_lost(exc)
