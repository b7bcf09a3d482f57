"""The engine's per-endpoint policies: backoff with full jitter, the circuit breaker and the rate limit.

All three are plain asyncio objects of the engine's own event loop; none of them blocks a thread.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

from gateway.delivery.config import Backoff, Breaker

__all__ = ["CircuitBreaker", "RateLimiter", "backoff_delay"]


def backoff_delay(
    backoff: Backoff, attempt: int, retry_after: float | None = None, rand: Callable[[], float] = random.random
) -> float:
    """Seconds before the attempt after *attempt* (1-based): full jitter, a random time up to
    ``min(max, initial * 2**(attempt-1))``; never less than the partner's ``Retry-After``."""
    ceiling = min(backoff.maximum, backoff.initial * (2 ** min(attempt - 1, 60)))
    delay = ceiling * rand()
    if retry_after is not None:
        delay = max(delay, retry_after)
    return delay


class CircuitBreaker:
    """Closed while attempts succeed; open for ``cooldown`` after ``failures`` consecutive failures; then
    half open: one probe, whose outcome closes it or opens it again. Only retryable failures count (a
    permanent refusal shows the endpoint is up)."""

    def __init__(self, breaker: Breaker, clock: Callable[[], float] = time.monotonic) -> None:
        self.breaker = breaker
        self.clock = clock
        self.failures = 0
        self.open_until = 0.0
        self._probing = False
        self._changed = asyncio.Event()

    @property
    def state(self) -> str:
        if self.failures < self.breaker.failures:
            return "closed"
        return "half_open" if self.clock() >= self.open_until else "open"

    async def admit(self) -> None:
        """Wait until an attempt may be made (at once while closed)."""
        while True:
            if self.failures < self.breaker.failures:
                return
            wait = self.open_until - self.clock()
            if wait <= 0 and not self._probing:
                self._probing = True
                return
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=max(wait, 0.05) if wait > 0 else 1.0)
            except TimeoutError:
                pass

    def record(self, outcome: str) -> None:
        """After an admitted attempt: ``delivered``/``failed`` close the breaker, ``retry`` counts."""
        probing, self._probing = self._probing, False
        if outcome == "retry":
            self.failures += 1
            if self.failures >= self.breaker.failures or probing:
                self.failures = max(self.failures, self.breaker.failures)
                self.open_until = self.clock() + self.breaker.cooldown
        else:
            self.failures = 0
        self._changed.set()

    def release(self) -> None:
        """An admitted attempt was not made after all (shutdown): let another probe."""
        if self._probing:
            self._probing = False
            self._changed.set()


class RateLimiter:
    """A token bucket: ``rate`` attempts per second, bursts of up to ``max(1, rate)``."""

    def __init__(self, rate: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.clock = clock
        self.capacity = max(1.0, rate or 1.0)
        self.tokens = self.capacity
        self.stamp = clock()

    async def acquire(self) -> None:
        if self.rate is None:
            return
        while True:
            now = self.clock()
            self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens >= 1:
                self.tokens -= 1
                return
            await asyncio.sleep((1 - self.tokens) / self.rate)
