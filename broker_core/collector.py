"""The garbage collector of a long-running process (a broker, a STOMP listener, a gateway).

Once started, such a process holds a few hundred thousand long-lived objects (modules, the store, compiled
schemas and routes): :func:`settle_collector` moves them out of the collector's sight, so a full collection no
longer walks them.

A STOMP listener also collects its young generation less often: each message in flight allocates dozens of
objects that live until its commit, and with Python's default threshold (700) the young collections ran every
few messages and promoted them, to be walked again by the older generations (a quarter of the listener's CPU
on a stream of persistent SENDs). A gateway keeps the default: at 5,000 its one-way phases spent 0.07 s in the
collector instead of 0.44 s, but under hostile documents (large refused bodies, deep trees) the slowest
``/healthz`` went from 10-19 ms to 58-106 ms in two runs each, the rarer collections being the longer.
"""

from __future__ import annotations

import gc

__all__ = ["STOMP_YOUNG", "settle_collector"]

#: Young-generation threshold of a STOMP listener (frames of bounded size, hundreds of messages in flight).
STOMP_YOUNG = 20000


def settle_collector(young: int | None = None) -> None:
    """After start-up: collect and freeze what is left (``gc.freeze``); with *young*, collect the young
    generation every *young* net allocations (the older ones every 20 collections of the one below)."""
    gc.collect()
    gc.freeze()
    if young is not None:
        gc.set_threshold(young, 20, 20)
