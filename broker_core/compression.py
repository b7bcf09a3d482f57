"""The LZ4 frames the SQL store keeps large bodies in, made once per body.

A document the gateway accepts is stored twice in one transaction: as the message's body and as the ledger's
copy. Both are the same bytes object and both are compressed the same way, in the store's writer thread that
every commit waits for: :func:`lz4_frame` remembers the last body it compressed, so the second is free.
"""

from __future__ import annotations

import lz4.frame

__all__ = ["lz4_frame"]

_compress = lz4.frame.compress
#: (the bytes object last compressed, its frame): compared by identity, so the object is kept alive with it
_last: tuple[bytes, bytes] = (b"", _compress(b""))


def lz4_frame(data: bytes) -> bytes:
    """``lz4.frame.compress(data)`` (default settings, the standard frame format ``lz4 -d`` reads)."""
    global _last
    last = _last  # one read: another thread may replace it meanwhile, and the pair stays consistent
    if last[0] is data:
        return last[1]
    packed = _compress(data)
    _last = (data, packed)
    return packed
