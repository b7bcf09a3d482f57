"""The budget of processor time a helper process may spend on one job (:class:`Budget`), read on the
process's own clock (:func:`cpu_clock`), and waiting for its answer within it (:func:`wait_readable`)."""

from __future__ import annotations

import select
import time
from collections.abc import Callable

__all__ = ["RECHECK_SECONDS", "Budget", "OverloadedError", "cpu_clock", "wait_readable"]

#: A job given more time on the clock than its budget is looked at again at least this often (seconds).
RECHECK_SECONDS = 0.02


def cpu_clock(pid: int) -> int | None:
    """The clock of process *pid*'s processor time, all its threads' (native ones too), or None where the
    system has no such clock. Linux has: ``clock_gettime`` on ``MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)``,
    under a microsecond to read, so it can be read for every document."""
    clock = ((~pid) << 3) | 2
    try:
        time.clock_gettime(clock)
    except (OSError, OverflowError):
        return None
    return clock


class OverloadedError(Exception):
    """Raised by :meth:`Budget.check` when the longest wait is up before the job has spent its processor
    time: the machine gave the helper too little of it, which is the load's doing, not the job's."""

    def __init__(self, used: float, elapsed: float) -> None:
        super().__init__(f"{used:.2f} s of the processor in {elapsed:.1f} s")
        self.used = used
        self.elapsed = elapsed


class Budget:
    """What one job of a helper process may cost: *seconds* of the process's processor time (read on
    *clock*, from :func:`cpu_clock`), waited for at most *longest* seconds on the clock.

    Processor time and not time on the clock, because a loaded machine gives a helper less of the
    processor: one partner's burst would otherwise have another's honest document refused as too costly.
    Without a clock (None) the budget is *seconds* on the clock. The clock may also be a function that reads
    the processor seconds (None once the process has gone): the tests keep time with it."""

    __slots__ = ("clock", "seconds", "longest", "started", "cpu_started", "extended")

    def __init__(
        self, clock: int | Callable[[], float | None] | None, seconds: float, longest: float, now: float
    ) -> None:
        self.clock = clock
        self.seconds = seconds
        self.longest = max(longest, seconds)
        self.started = now
        self.cpu_started = self._cpu()
        #: the job was given more time on the clock than *seconds* (its process was starved)
        self.extended = False

    def _cpu(self) -> float | None:
        if self.clock is None:
            return None
        if callable(self.clock):
            return self.clock()
        try:
            return time.clock_gettime(self.clock)
        except OSError:  # the process has gone; reading its pipe says so
            return None

    def check(self, now: float) -> float:
        """Seconds to wait before looking again (*now*: the same clock as the one given at the start);
        TimeoutError once the job has spent its processor time, :class:`OverloadedError` once the longest wait
        is up."""
        elapsed = now - self.started
        cpu = self._cpu()
        if cpu is None or self.cpu_started is None:
            if elapsed >= self.seconds:
                raise TimeoutError()
            return self.seconds - elapsed
        used = cpu - self.cpu_started
        if used >= self.seconds:
            raise TimeoutError()
        if elapsed >= self.longest:
            raise OverloadedError(used, elapsed)
        if elapsed >= self.seconds:
            self.extended = True
        return max(RECHECK_SECONDS, min(self.seconds - used, self.longest - elapsed))


def wait_readable(fd: int, budget: Budget) -> None:
    """Wait until *fd* (the pipe of the helper process the budget is about) can be read: TimeoutError or
    :class:`OverloadedError` as :meth:`Budget.check` raises them."""
    while True:
        wait = budget.check(time.monotonic())
        if select.select([fd], [], [], wait)[0]:
            return
