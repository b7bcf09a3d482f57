"""The LZ4 frames the SQL store keeps large bodies in, made once per body.

A document the gateway accepts is stored twice in one transaction: as the message's body and as the ledger's
copy. Both are the same bytes object and both are compressed the same way, in the store's writer thread that
every commit waits for: :func:`lz4_frame` remembers the frames it made, by the identity of their bytes, until
the writer's transaction ends (:func:`forget_frames`), so the second copy costs nothing.
"""

from __future__ import annotations

import lz4.frame

__all__ = ["MEMO_BYTES", "forget_frames", "lz4_frame"]

_compress = lz4.frame.compress
#: The most bytes of bodies remembered at once; past it the memo starts again (a transaction of many large
#: bodies compresses some twice rather than holding them all).
MEMO_BYTES = 64 * 1024 * 1024
#: id(bytes) -> (the bytes, their frame): the bytes are kept with it, so the id cannot be reused meanwhile
_memo: dict[int, tuple[bytes, bytes]] = {}
_memo_bytes = 0


def lz4_frame(data: bytes) -> bytes:
    """``lz4.frame.compress(data)`` (default settings, the standard frame format ``lz4 -d`` reads)."""
    global _memo_bytes
    if type(data) is not bytes:  # only immutable bytes can be known by their identity
        return _compress(data)
    known = _memo.get(id(data))
    if known is not None and known[0] is data:
        return known[1]
    packed = _compress(data)
    if _memo_bytes + len(data) > MEMO_BYTES:
        forget_frames()
    _memo[id(data)] = (data, packed)
    _memo_bytes += len(data)
    return packed


def forget_frames() -> None:
    """Drop the remembered frames (the store's writer calls it as each transaction ends)."""
    global _memo_bytes
    _memo.clear()
    _memo_bytes = 0
