"""Store commits and closes from asyncio code.

Below the session and the broker: sessions, producers, the requestor, the
broker's ``write_async`` and the STOMP connection all start a store commit
and await it, or close a store-backed object from an event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._waiters import loop_completion

if TYPE_CHECKING:
    from ._store import Delivery

__all__ = ["close_off_loop", "store_commit_async"]


def store_commit_async(
    store: Any,
    sends: Sequence[Any],
    acks: Sequence[Delivery],
    in_transaction: Sequence[Callable[[Any], Any]] = (),
    *,
    durable: bool = True,
    loop: asyncio.AbstractEventLoop | None = None,
) -> asyncio.Future[None]:
    """Start a store commit and return a future of the running loop that
    completes when it is durable. A caller that commits often passes the
    running *loop* (looking it up costs a system call)."""
    future, complete, post = loop_completion(loop)
    store.commit(sends, acks, in_transaction, complete, durable=durable, finish_on=post)
    return future


async def close_off_loop(store: Any, close: Callable[[], None]) -> None:
    """``close()`` for ``async with``: inline on a store whose calls never
    wait (memory), in a thread on one whose may (SQL: giving back prefetched
    rows, rolling back, is a write)."""
    if getattr(store, "shared", False):
        await asyncio.to_thread(close)
    else:
        close()
