"""The streamed request body, refused as soon as it passes the size limit: never more than the limit is
held in memory."""

from __future__ import annotations

from collections.abc import AsyncIterable

from gateway.errors import (
    DocumentTooLargeError,
)

# --------------------------------------------------------------------------- body


async def read_body(
    chunks: AsyncIterable[bytes],
    max_bytes: int,
    *,
    declared_length: int | None = None,
) -> bytes:
    """Read a streamed request body, refusing it once it passes *max_bytes*.

    Raises :class:`~gateway.errors.DocumentTooLargeError` as soon as the
    running size exceeds the limit: the chunk that crosses it is never kept,
    so at most ``max_bytes`` plus that one chunk is ever in memory. A
    *declared_length* (the ``Content-Length``) over the limit is refused before
    anything is read. On refusal the iterator is closed if it can be
    (``aclose``), so an ASGI body stream stops there.
    """
    if max_bytes < 0:
        raise ValueError("max_bytes must not be negative")
    if declared_length is not None and declared_length > max_bytes:
        raise DocumentTooLargeError(limit=max_bytes)
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in chunks:
            if not chunk:
                continue
            size += len(chunk)
            if size > max_bytes:
                raise DocumentTooLargeError(limit=max_bytes)
            parts.append(bytes(chunk))
    except DocumentTooLargeError:
        parts.clear()
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except Exception:  # pragma: no cover - closing is best effort
                pass
        raise
    return b"".join(parts)
