"""Message ids and timestamps made on every accepted document, cheaply.

:func:`uuid4_str` draws its randomness from a per-thread pool refilled a page at a time, and :func:`iso_ms`
formats a second once for all the receipts made within it.
"""

from __future__ import annotations

import os
import threading

from broker_core.clock import iso_ms

__all__ = ["uuid4_str", "iso_ms"]


class _RandomPool(threading.local):
    """Random bytes fetched 4 KiB at a time (one ``getrandom`` system call per 256 ids, not per id)."""

    data = b""
    pos = 0


_RANDOM = _RandomPool()
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


def uuid4_str() -> str:
    """``str(uuid.uuid4())`` with the same randomness (``os.urandom``), without a system call per id."""
    pool = _RANDOM
    pos = pool.pos
    if pos >= len(pool.data):
        pool.data = os.urandom(4096)
        pos = 0
    pool.pos = pos + 16
    h = "%032x" % (int.from_bytes(pool.data[pos : pos + 16], "big") & _UUID4_CLEAR | _UUID4_SET)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
