"""The HTTP edge's own bounds: a deadline for a request's headers, a cap on open connections.

Before a request's headers are complete nothing is known of the client, not even whether it has a key:
a client that opens connections and sends headers a byte at a time (slowloris) would hold a connection,
its parser and its buffered header bytes for as long as it liked. So each request's headers must be
complete :data:`HEADER_TIMEOUT` seconds after the connection opened or after the request's first byte;
otherwise the connection is closed without an answer. And a serving process keeps at most
:data:`MAX_CONNECTIONS` connections open: one more is closed as soon as it is accepted, costing the
event loop an accept and a close.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gateway.http.protocol import GatewayHttpProtocol

__all__ = ["EdgeHttpProtocol", "HEADER_TIMEOUT", "MAX_CONNECTIONS", "protocol_options"]

log = logging.getLogger(__name__)

#: Seconds a client has to send a request's headers (from the connection's start or the request's first byte).
HEADER_TIMEOUT = 10.0
#: Open connections per serving process; more are closed at once.
MAX_CONNECTIONS = 1024


class EdgeHttpProtocol(GatewayHttpProtocol):
    """:class:`GatewayHttpProtocol` with the header deadline and the connection cap (module docstring)."""

    header_timeout: float = HEADER_TIMEOUT
    max_connections: int = MAX_CONNECTIONS
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections:
            transport.abort()  # never registered: nothing else to undo
            return
        super().connection_made(transport)
        self._arm_header_timer()

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._disarm_header_timer()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # an idle keep-alive connection is uvicorn's timeout_keep_alive's to close; the next request's first
        # byte arms the deadline again

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        if getattr(self, "transport", None) is None:  # refused in connection_made
            return
        super().connection_lost(exc)


def protocol_options() -> dict[str, Any]:
    """uvicorn ``Config`` options that serve with :class:`~gateway.http.protocol.GatewayHttpProtocol` and the
    edge's bounds (a header deadline, a connection cap)."""
    return {"http": EdgeHttpProtocol}
