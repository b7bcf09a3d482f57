"""Hooking the store's key digests into a serving process's partner registry."""

from __future__ import annotations

import logging
from typing import Any

from gateway.security.keys import KeyDigests

__all__ = ["attach_key_digests"]

log = logging.getLogger(__name__)


def attach_key_digests(partners: Any, runtime: Any) -> None:
    """Give *partners* the server secret and migrated digests of *runtime*'s store (when it has a SQL store)."""
    broker = getattr(runtime, "broker", None)
    if broker is None or getattr(broker, "engine", None) is None:
        return
    partners.attach(KeyDigests.for_broker(broker))
