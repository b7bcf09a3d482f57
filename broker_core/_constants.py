"""Acknowledgement and delivery modes, with the values JMS gives them."""

from __future__ import annotations

import enum

__all__ = ["AckMode", "DeliveryMode", "DEFAULT_PRIORITY", "DEFAULT_TIME_TO_LIVE", "DEFAULT_DELIVERY_MODE"]


class AckMode(enum.IntEnum):
    """How a non-transacted session acknowledges what it consumes.

    ``AUTO``: each message is acknowledged when ``receive`` returns it, or when
    its listener returns normally. ``CLIENT``: ``message.acknowledge()``
    acknowledges every message the session has consumed so far (JMS 1.1).
    ``DUPS_OK``: like ``AUTO`` but acknowledgements may be batched, so a crash
    may redeliver a few. ``INDIVIDUAL``: ``message.acknowledge()`` acknowledges
    that message only. ``NO_ACKNOWLEDGE``: the message is forgotten the moment
    it is dispatched; a failing listener loses it. ``TRANSACTED`` is what a
    transacted session reports; it is not passed in.
    """

    TRANSACTED = 0
    AUTO = 1
    CLIENT = 2
    DUPS_OK = 3
    INDIVIDUAL = 4
    NO_ACKNOWLEDGE = 100


class DeliveryMode(enum.IntEnum):
    """``PERSISTENT`` messages survive a crash of the broker (on a durable
    store); ``NON_PERSISTENT`` ones live in memory only."""

    NON_PERSISTENT = 1
    PERSISTENT = 2


DEFAULT_DELIVERY_MODE = DeliveryMode.PERSISTENT
DEFAULT_PRIORITY = 4
DEFAULT_TIME_TO_LIVE = 0
