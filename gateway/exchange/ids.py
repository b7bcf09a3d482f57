"""Message ids and timestamps made on every accepted document, cheaply.

:func:`uuid7_str` makes the ids the gateway generates (a correlation id the partner did not give, the
idempotency key of a document without one): UUID version 7 (RFC 9562), the Unix time in milliseconds
followed by 74 random bits. They are as hard to guess as before, and they sort by time, so the ledger's
indexes on them grow at one end: with random UUIDs each insert rewrote a page of its own in the store's
write-ahead log (16 KB, a quarter of what an accepted order wrote). The random bits come from a per-thread
pool refilled a page at a time, and :func:`iso_ms` formats a second once for all the receipts made within it.
"""

from __future__ import annotations

import os
import threading
import time

from broker_core.clock import iso_ms

__all__ = ["uuid7_str", "iso_ms"]


class _RandomPool(threading.local):
    """Random bytes fetched 4 KiB at a time (one ``getrandom`` system call per 256 ids, not per id)."""

    data = b""
    pos = 0


_RANDOM = _RandomPool()
_RANDOM_BITS = (1 << 74) - 1
_VERSION_7 = 0x7 << 76  # the version nibble, above the 12 bits of rand_a
_VARIANT = 0x2 << 62  # RFC 9562's variant (10), above the 62 bits of rand_b


def uuid7_str() -> str:
    """A UUID version 7 as ``str(uuid.UUID(...))`` writes it: 48 bits of Unix milliseconds, then 74 random
    bits (``os.urandom``) around the version and variant fields."""
    pool = _RANDOM
    pos = pool.pos
    if pos >= len(pool.data):
        pool.data = os.urandom(4096)
        pos = 0
    pool.pos = pos + 10
    rand = int.from_bytes(pool.data[pos : pos + 10], "big") & _RANDOM_BITS
    value = (
        (time.time_ns() // 1_000_000) << 80
        | _VERSION_7
        | (rand >> 62) << 64  # rand_a: 12 bits
        | _VARIANT
        | rand & ((1 << 62) - 1)  # rand_b: 62 bits
    )
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
