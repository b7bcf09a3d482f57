"""An HTTPS-only listener that answers plain HTTP clearly.

Given the TLS context to the event loop's ``create_server``, a client speaking plain HTTP to the HTTPS port
sees only a closed connection (OpenSSL fails the handshake on ``GET /``). :class:`HttpsOnlyProtocol` takes
the connection first instead and looks at its first byte: a TLS handshake record (``0x16``) starts TLS over
the connection (asyncio's own :class:`~asyncio.sslproto.SSLProtocol`, handed the bytes already read) with
the HTTP protocol above it, as the loop would have; anything else is answered
``400 The plain HTTP request was sent to an HTTPS port`` in plain text and closed, as nginx does.
A connection that sends nothing is closed after :data:`FIRST_BYTE_TIMEOUT`.
"""

from __future__ import annotations

import asyncio
import ssl
from asyncio import sslproto
from collections.abc import Callable
from typing import Any

__all__ = ["FIRST_BYTE_TIMEOUT", "HttpsOnlyProtocol", "https_only_factory"]

#: Seconds a new connection has to send its first byte.
FIRST_BYTE_TIMEOUT = 30.0
#: How long a TLS handshake may take once started (asyncio's default is 60 s).
HANDSHAKE_TIMEOUT = 30.0
_TLS_HANDSHAKE = 0x16

PLAIN_HTTP_ANSWER = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"
    b"Content-Length: 93\r\n\r\n"
    b"The plain HTTP request was sent to an HTTPS port: this listener speaks HTTPS only (https://).\n"
)


class HttpsOnlyProtocol(asyncio.Protocol):
    """The first protocol of each connection (module docstring)."""

    def __init__(
        self,
        make_protocol: Callable[[], asyncio.BaseProtocol],
        context: ssl.SSLContext,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.make_protocol = make_protocol
        self.context = context
        self.loop = loop
        self.transport: Any = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self._timer = self.loop.call_later(FIRST_BYTE_TIMEOUT, transport.close)

    def data_received(self, data: bytes) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not data:
            return
        if data[0] != _TLS_HANDSHAKE:
            self.transport.write(PLAIN_HTTP_ANSWER)
            self.transport.close()
            return
        tls = sslproto.SSLProtocol(
            self.loop,
            self.make_protocol(),
            self.context,
            None,
            server_side=True,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT,
        )
        self.transport.set_protocol(tls)
        tls.connection_made(self.transport)
        view = memoryview(data)
        while view:
            buffer = tls.get_buffer(len(view))
            n = min(len(buffer), len(view))
            buffer[:n] = view[:n]
            tls.buffer_updated(n)
            view = view[n:]

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def https_only_factory(protocol_class: Any, context: ssl.SSLContext) -> Callable[..., asyncio.Protocol]:
    """A uvicorn ``http`` protocol factory: *protocol_class*'s connections over TLS with *context*, plain
    HTTP answered 400 (uvicorn itself is then given no TLS context)."""

    def factory(*, config: Any, server_state: Any, app_state: Any, _loop: Any = None) -> asyncio.Protocol:
        loop = _loop or asyncio.get_running_loop()
        return HttpsOnlyProtocol(
            lambda: protocol_class(config=config, server_state=server_state, app_state=app_state, _loop=_loop),
            context,
            loop,
        )

    return factory
