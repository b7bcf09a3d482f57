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
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["GatewayHttpProtocol", "LINGER_SECONDS", "LINGER_BYTES", "DRAIN_PAUSE"]

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
    """Discards what a half-closed connection's client still sends, then closes it."""

    def __init__(self, protocol: GatewayHttpProtocol, sock: socket.socket) -> None:
        self.protocol = protocol
        self.loop: asyncio.AbstractEventLoop = protocol.loop
        self.sock = sock
        self.left = LINGER_BYTES
        self.timer = self.loop.call_later(LINGER_SECONDS, self.finish)
        self.resume: asyncio.TimerHandle | None = None
        self.loop.add_reader(sock.fileno(), self.drain)

    def drain(self) -> None:
        try:
            while self.left > 0:
                n = self.sock.recv_into(_DISCARD, min(self.left, _DRAIN_CHUNK), _TRUNC)
                if n == 0:  # the client closed its end: it has had the answer
                    break
                self.left -= n
            self.finish()
        except (BlockingIOError, InterruptedError):  # all drained for now: the next drain after a pause
            self.loop.remove_reader(self.sock.fileno())
            self.resume = self.loop.call_later(DRAIN_PAUSE, self.loop.add_reader, self.sock.fileno(), self.drain)
        except OSError:
            self.finish()

    def finish(self) -> None:
        """Stop draining and close the connection (idempotent)."""
        if self.sock.fileno() < 0:
            return
        self.timer.cancel()
        if self.resume is not None:
            self.resume.cancel()
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        self.protocol._drain = None
        self.protocol.transport.close()


class GatewayHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol; a response sent before its request's body was read ends the connection
    in stages (see the module docstring) instead of reading the rest of the body through the parser."""

    _drain: _Drain | None = None

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

    def connection_lost(self, exc: Exception | None) -> None:
        drain = self._drain
        if drain is not None:
            drain.finish()
        super().connection_lost(exc)


def protocol_options() -> dict[str, Any]:
    """uvicorn ``Config`` options that serve with :class:`GatewayHttpProtocol`."""
    return {"http": GatewayHttpProtocol}
