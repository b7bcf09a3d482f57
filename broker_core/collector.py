"""The garbage collector of a long-running process (a broker, a STOMP listener, a gateway).

Once started, such a process holds a few hundred thousand long-lived objects (modules, the store, compiled
schemas and routes): :func:`settle_collector` moves them out of the collector's sight, so a full collection no
longer walks them. And each message or document in flight allocates dozens of objects that live until its
commit: with Python's default threshold (700) the young collections ran every few requests and promoted those
objects, to be walked again by the older generations. Measured on the gateway's one-way intake, the collector
took about 17 µs of CPU per accepted order at 700 and under 2 µs at 5,000.

A higher threshold keeps unreachable cycles longer: the project's code breaks the cycles that would hold a
request's body (an error's traceback, say), so what waits is small.
"""

from __future__ import annotations

import gc

__all__ = ["GATEWAY_YOUNG", "STOMP_YOUNG", "settle_collector"]

#: Young-generation threshold of a gateway's serving process (documents up to megabytes in flight).
GATEWAY_YOUNG = 5000
#: ... of a STOMP listener (frames of bounded size, hundreds of messages in flight).
STOMP_YOUNG = 20000


def settle_collector(young: int) -> None:
    """After start-up: collect, freeze what is left (``gc.freeze``), and collect the young generation every
    *young* net allocations (the older ones every 20 collections of the one below)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(young, 20, 20)
