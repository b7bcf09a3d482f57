"""The ``as2`` and ``as2-mdn`` delivery endpoint kinds: loaded by name by the delivery engine, they register the
AS2 transports (messages we send; asynchronous MDNs of messages we received)."""

from __future__ import annotations

from gateway.as2 import mdn_delivery
from gateway.as2.outbound import register

__all__ = ["REGISTERED"]

#: Whether the kinds are registered (the delivery engine is part of the gateway).
REGISTERED = register() and mdn_delivery.register()
