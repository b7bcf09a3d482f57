"""One-token wake-up primitives for threads and for asyncio.

A waiter holds at most one pending wake-up: ``wake()`` before ``wait()`` makes
the next ``wait()`` return at once, so a wake-up that races a wait is never
lost. ``wake()`` may be called from any thread.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["ThreadWaiter", "AsyncWaiter", "loop_future", "loop_completion"]


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
                async with asyncio.timeout(timeout):  # unlike wait_for, no task per wait
                    await self._event.wait()
            except TimeoutError:
                return False
        self._event.clear()
        return True


class _LoopBridge:
    """Hands completions from store threads to one event loop: one wake-up of
    the loop per burst of completions, not one per message."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._pending: list[tuple[Callable[[Any], None], Any]] = []
        self._scheduled = False
        self._lock = threading.Lock()

    def post(self, fn: Callable[[Any], None], arg: Any) -> None:
        with self._lock:
            self._pending.append((fn, arg))
            if self._scheduled:
                return
            self._scheduled = True
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop closed meanwhile: nobody waits any more
            pass

    def _drain(self) -> None:
        with self._lock:
            items, self._pending = self._pending, []
            self._scheduled = False
        for fn, arg in items:
            fn(arg)


_bridges: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopBridge] = weakref.WeakKeyDictionary()


def _bridge(loop: asyncio.AbstractEventLoop | None = None) -> _LoopBridge:
    if loop is None:
        loop = asyncio.get_running_loop()  # asks the system for the process id, every time
    bridge = _bridges.get(loop)
    if bridge is None:
        bridge = _bridges[loop] = _LoopBridge(loop)
    return bridge


def loop_completion(
    loop: asyncio.AbstractEventLoop | None = None,
) -> tuple[asyncio.Future[None], Callable[[BaseException | None], None], Callable[[Callable[[], None]], None]]:
    """A future of the running loop (*loop*, if the caller knows it is the running one); ``complete(error)``,
    which completes it and is called on the loop; and ``post(fn)``, which runs ``fn()`` on the loop from any
    thread: a store's completion handed over whole, so that what follows the commit runs where its caller
    waits (see ``Store.commit``)."""
    bridge = _bridge(loop)
    future: asyncio.Future[None] = bridge.loop.create_future()

    def complete(error: BaseException | None) -> None:
        if not future.done():
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

    def post(fn: Callable[[], None]) -> None:
        bridge.post(_call, fn)

    return future, complete, post


def _call(fn: Callable[[], None]) -> None:
    fn()


def loop_future() -> tuple[asyncio.Future[Any], Callable[[Any, BaseException | None], None]]:
    """A future of the running loop, and ``settle(result, error)``, which
    completes it from any thread (a store writer's completion callback)."""
    bridge = _bridge()
    future: asyncio.Future[Any] = bridge.loop.create_future()

    def complete(outcome: tuple[Any, BaseException | None]) -> None:
        if not future.done():
            if outcome[1] is None:
                future.set_result(outcome[0])
            else:
                future.set_exception(outcome[1])

    def settle(result: Any, error: BaseException | None) -> None:
        bridge.post(complete, (result, error))

    return future, settle
