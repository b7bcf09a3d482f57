"""A STOMP 1.2 listener (1.0 and 1.1 accepted) over the broker core.

``StompServer(broker, host, port, users=..., heartbeat=..., max_frame_size=...,
prefetch=...)`` with ``await start()`` / ``await stop()`` /
``await serve_forever()``; ``python -m broker_core.stomp --url URL --port N``
runs one alone. Destinations, headers and acknowledgement modes map to JMS
the way ActiveMQ maps them (see ``_mapping``).
"""

from ._frames import Frame, FrameError, FrameParser, encode
from ._server import DEFAULT_PORT, StompServer

__all__ = ["StompServer", "DEFAULT_PORT", "Frame", "FrameError", "FrameParser", "encode"]
