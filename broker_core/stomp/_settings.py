"""What every connection of one listener shares: its settings, its users and
the state they have in common (connections per user, client ids claimed,
reply grants, the memory budget)."""

from __future__ import annotations

import dataclasses
from typing import Any

from ._auth import Authenticator
from ._grants import ReplyGrants
from ._limits import MemoryBudget, StompLimits

__all__ = ["ListenerSettings"]


@dataclasses.dataclass
class ListenerSettings:
    broker: Any
    heartbeat: tuple[int, int]
    prefetch: int
    max_frame_size: int
    max_headers: int
    max_header_bytes: int
    string_numbers: bool
    limits: StompLimits
    authenticator: Authenticator
    memory: MemoryBudget
    grants: ReplyGrants = dataclasses.field(default_factory=ReplyGrants)
    #: open connections per login
    per_user: dict[str, int] = dataclasses.field(default_factory=dict)
    #: client id -> the login that first claimed it since the listener started
    client_owners: dict[str, str] = dataclasses.field(default_factory=dict)
