"""Failed authentications per client address, refused before any hashing once too many.

A client that keeps sending wrong keys (or random tokens with a public key id) gets ``429
authentication-throttled`` with ``Retry-After`` after :data:`MAX_FAILURES` failures within
:data:`WINDOW` seconds, until the oldest of them is that old: its requests then cost a dictionary look-up.
A key that verified before is recognised first (a keyed digest, microseconds) and never throttled, so
honest partners behind the same address (a proxy, a NAT) keep working. IPv6 clients are counted by their
/64, the block one host usually has.
"""

from __future__ import annotations

import collections
import ipaddress
import math
import threading
import time
from collections.abc import Callable

from gateway.errors import AuthenticationThrottledError

__all__ = ["FailureThrottle", "MAX_FAILURES", "WINDOW"]

MAX_FAILURES = 20
WINDOW = 60.0
_MAX_ADDRESSES = 10_000


def _subject(address: str) -> str:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:100]
    if ip.version == 6 and ip.ipv4_mapped is None:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip.ipv4_mapped or ip) if ip.version == 6 else str(ip)


class FailureThrottle:
    """Failure times per address in a sliding window (a bounded number of addresses, oldest forgotten)."""

    def __init__(
        self, max_failures: int = MAX_FAILURES, window: float = WINDOW, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_failures = max_failures
        self.window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: collections.OrderedDict[str, collections.deque[float]] = collections.OrderedDict()

    def check(self, address: str | None) -> None:
        """Raise :class:`AuthenticationThrottledError` if *address* failed too often lately."""
        if address is None:
            return
        subject = _subject(address)
        now = self._clock()
        with self._lock:
            times = self._failures.get(subject)
            if not times:
                return
            while times and times[0] <= now - self.window:
                times.popleft()
            if len(times) < self.max_failures:
                return
            wait = times[0] + self.window - now
        raise AuthenticationThrottledError(
            f"Too many failed authentications from your address ({self.max_failures} within "
            f"{self.window:g} s); check the API key you send and retry after {math.ceil(wait)} s.",
            retry_after=math.ceil(wait),
        )

    def fail(self, address: str | None) -> None:
        if address is None:
            return
        subject = _subject(address)
        now = self._clock()
        with self._lock:
            times = self._failures.pop(subject, None) or collections.deque(maxlen=self.max_failures)
            times.append(now)
            self._failures[subject] = times
            while len(self._failures) > _MAX_ADDRESSES:
                self._failures.popitem(last=False)
