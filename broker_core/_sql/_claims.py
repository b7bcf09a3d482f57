"""Consumers' claims of waiting rows, and the versions that tell a reader
whether claiming again could find anything.

A mixin of :class:`~broker_core._sql._store.SQLStore`, below its readers:
``_reader`` calls these, and they touch only the store's writer, its
availability versions and ``_next_ready``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._envelope import Envelope
from .._errors import StoreError
from .._store import Delivery
from .._waiters import loop_future
from . import _codec
from ._common import _body_size

if TYPE_CHECKING:
    from ._reader import _SQLReader


class _Claims:
    """Availability versions per box and the claims of a box's waiting rows."""

    # ------------------------------------------------------------ availability

    def _touched(self, boxes: set[str]) -> None:
        for box in boxes:
            self._available(box)
        if self._wakeups is not None and boxes:
            self._wakeups.boxes_available(boxes)

    def _available(self, box: str) -> None:
        if box == "*":
            self._all_version = next(self._tick)
            self._next_ready.clear()
        else:
            self._versions[box] = next(self._tick)
        self._broker_wake(box)

    def _version(self, box: str) -> int:
        """Changes whenever messages may have become available in ``box``."""
        return max(self._versions.get(box, 0), self._all_version)

    # ------------------------------------------------------------ claims

    def _claim_rows(self, box: str, limit: int, ids: list[int] | None, now: int) -> list[Delivery]:
        result = self._write(lambda batch: self._op_claim(batch, box, limit, ids, now), durable=False)
        return self._claimed(box, ids, result)

    async def _claim_rows_async(self, reader: _SQLReader, limit: int, now: int) -> tuple[int, int]:
        """:meth:`_claim_rows` for an event loop: the writer's completion wakes it (no thread waits). The rows
        go to *reader* from the writer's thread, as a hand-over does (back to the box if it closed meanwhile),
        so that a claim whose task is cancelled while it waits loses nothing. How many it got, and their
        bodies' bytes."""
        future, settle = loop_future()
        if self._closed or self._writer is None:
            raise StoreError("the store is closed")
        box = reader._box

        def landed(result: Any, error: BaseException | None) -> None:
            got = (0, 0)
            if error is None:
                try:
                    rows = self._claimed(box, None, result)
                    got = (len(rows), sum(_body_size(d.envelope) for d in rows))
                    if rows:  # the task awaiting the claim is woken by its future, not by the reader
                        self._hand_over({reader: rows}, wake=False)
                except Exception as exc:  # the waiting task gets it
                    error = exc
            settle(got, error)

        self._writer.submit(
            lambda batch: self._op_claim(batch, box, limit, None, now), callback=landed, durable=False, awaited=True
        )
        return await future

    def _claimed(self, box: str, ids: list[int] | None, result: Any) -> list[Delivery]:
        claimed, next_ready = result
        if next_ready is not None:
            self._next_ready[box] = next_ready
        elif ids is None:
            self._next_ready.pop(box, None)
        out = []
        for entry_box, entry_id, count, priority, expiration, found in claimed:
            if type(found) is not Envelope:  # a message row
                env = _codec.row_envelope(found, priority, expiration, 1)
            elif found.priority != priority or found.expiration != expiration:
                env = found.replace(priority=priority, expiration=expiration)
            else:
                env = found
            out.append(Delivery(entry_box, entry_id, env, count))
        return out
