"""One-token wake-up primitives for threads and for asyncio.

A waiter holds at most one pending wake-up: ``wake()`` before ``wait()`` makes
the next ``wait()`` return at once, so a wake-up that races a wait is never
lost. ``wake()`` may be called from any thread.
"""

from __future__ import annotations

import asyncio
import threading

__all__ = ["ThreadWaiter", "AsyncWaiter"]


class ThreadWaiter:
    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def wake(self) -> None:
        try:
            self._lock.release()
        except RuntimeError:  # already woken: one token at most
            pass

    def wait(self, timeout: float | None = None) -> bool:
        """Block until woken (True) or until ``timeout`` seconds pass (False)."""
        if timeout is None:
            return self._lock.acquire()
        return self._lock.acquire(timeout=max(0.0, timeout))


class AsyncWaiter:
    __slots__ = ("_loop", "_event", "_thread")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._event = asyncio.Event()
        self._thread = threading.get_ident()

    def wake(self) -> None:
        if threading.get_ident() == self._thread:
            self._event.set()
        else:
            try:
                self._loop.call_soon_threadsafe(self._event.set)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass

    async def wait(self, timeout: float | None = None) -> bool:
        if not self._event.is_set():
            try:
                await asyncio.wait_for(self._event.wait(), timeout)
            except (asyncio.TimeoutError, TimeoutError):
                return False
        self._event.clear()
        return True
