"""A STOMP 1.2 listener (1.0 and 1.1 accepted) over the broker core.

``StompServer(broker, host, port, users=[StompUser(...)], limits=StompLimits(...),
heartbeat=..., max_frame_size=..., prefetch=...)`` with ``await start()`` /
``await stop()`` / ``await serve_forever()``; ``python -m broker_core.stomp
--url URL --port N --user LOGIN:HASH`` runs one alone. Every client logs in
as one of ``users`` (passcodes kept as scrypt hashes: :func:`hash_passcode`)
and uses only the destinations its rights name (``_users``); the limits of
:class:`StompLimits` bound what clients hold. Destinations, headers and
acknowledgement modes map to JMS the way ActiveMQ maps them (see
``_mapping``).
"""

from ._frames import Frame, FrameError, FrameParser, encode
from ._limits import StompLimits
from ._passcodes import generate_passcode, hash_passcode, is_passcode_hash, verify_passcode
from ._server import DEFAULT_PORT, NoUsersError, StompServer
from ._users import ALL_DESTINATIONS, DestinationPattern, StompUser

__all__ = [
    "StompServer",
    "StompUser",
    "StompLimits",
    "NoUsersError",
    "DestinationPattern",
    "ALL_DESTINATIONS",
    "DEFAULT_PORT",
    "Frame",
    "FrameError",
    "FrameParser",
    "encode",
    "hash_passcode",
    "verify_passcode",
    "is_passcode_hash",
    "generate_passcode",
]
