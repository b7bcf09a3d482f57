"""The ``as2`` delivery endpoint kind: loaded by name by the delivery engine, it registers the AS2 transport."""

from __future__ import annotations

from gateway.as2.outbound import register

__all__ = ["REGISTERED"]

#: Whether the kind is registered (the delivery engine is part of the gateway).
REGISTERED = register()
