"""What the gateway's helper processes (error reports, business rules, large documents' intake) share:
their environment, writing and reading a pipe (against a deadline), bounding a process's memory, and the
budget of processor time a helper may spend on one document (:class:`Budget`)."""

from __future__ import annotations

import os
import select
import time
from pathlib import Path

__all__ = ["Budget", "OverloadedError", "cpu_clock", "helper_environment", "limit_address_space", "read_exactly",
           "wait_readable", "write_all"]

#: A job given more time on the clock than its budget is looked at again at least this often (seconds).
RECHECK_SECONDS = 0.02


def helper_environment() -> dict[str, str]:
    """This process's environment, with the gateway's packages importable first: what ``python -m
    gateway.<helper>`` needs wherever the serving process was started from."""
    root = str(Path(__file__).resolve().parents[2])  # the folder that holds the gateway package
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


def write_all(fd: int, data: bytes) -> None:
    """Write all of *data* to *fd* (a pipe takes at most its buffer per write)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_exactly(fd: int, size: int, deadline: float | None) -> bytes:
    """*size* bytes from *fd*; TimeoutError once ``time.monotonic()`` passes *deadline* (None: no
    deadline), EOFError when the other end closes first."""
    chunks = []
    while size:
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise TimeoutError()
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            raise EOFError()
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def limit_address_space(extra: int) -> None:
    """Let this process map at most *extra* bytes more than it has now (RLIMIT_AS): past that an allocation
    fails (MemoryError) instead of taking the machine's memory. Best effort: a no-op where unsupported."""
    try:
        import resource

        with open("/proc/self/statm") as statm:
            size = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (size + extra, size + extra))
    except (OSError, ValueError, ImportError):
        pass


# --------------------------------------------------------------------------- processor time


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
    Without a clock (None) the budget is *seconds* on the clock."""

    __slots__ = ("clock", "seconds", "longest", "started", "cpu_started", "extended")

    def __init__(self, clock: int | None, seconds: float, longest: float, now: float) -> None:
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
