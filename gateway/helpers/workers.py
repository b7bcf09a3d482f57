"""Helper processes: starting one (``python -m <module>``, with the gateway's packages importable, in a
process group or session of its own when asked), its side of the pipes (niced, deaf to the terminal's
interrupt, under a memory limit), waiting for its ready message, budgeting a job's processor time, killing
it, and the objects that own helpers shared by the gateways of a process and released when it exits."""

from __future__ import annotations

import atexit
import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from gateway.helpers.budget import Budget, cpu_clock

__all__ = ["HelperProcess", "SharedHelpers", "helper_environment", "helper_pipes", "limit_address_space"]

T = TypeVar("T")


def helper_environment() -> dict[str, str]:
    """This process's environment, with the gateway's packages importable first: what ``python -m
    gateway.<helper>`` needs wherever the serving process was started from."""
    root = str(Path(__file__).resolve().parents[2])  # the folder that holds the gateway package
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


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


# --------------------------------------------------------------------------- the helper's side


def helper_pipes(*, nice: int = 0, ignore_interrupts: bool = False) -> tuple[int, int]:
    """In a helper process: its ends of the pipes (the descriptors of its stdin and stdout), with
    ``sys.stdout`` sent to stderr, since nothing but messages goes to the serving process; niced by *nice*
    (the serving process comes first; children inherit it); deaf to SIGINT when *ignore_interrupts* (a
    terminal's ^C goes to the whole group, and the serving process stops its helpers itself)."""
    if ignore_interrupts:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    fin, fout = sys.stdin.fileno(), sys.stdout.fileno()
    sys.stdout = sys.stderr
    if nice:
        try:
            os.nice(nice)
        except OSError:
            pass
    return fin, fout


# --------------------------------------------------------------------------- the serving process's side


class HelperProcess:
    """One helper process, ``python -m <module>``, and the serving process's ends of its pipes.

    *process_group*: a process group of its own (a terminal's ^C is for the serving process, which stops
    it); *new_session*: a session of its own (Linux's autogroups then give it its own share of the CPUs,
    whatever its nice value); *quiet*: its stderr discarded."""

    def __init__(
        self,
        module: str,
        *,
        process_group: bool = False,
        new_session: bool = False,
        cwd: str | None = None,
        quiet: bool = False,
    ) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", module],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL if quiet else None,
            env=helper_environment(),
            close_fds=True,
            cwd=cwd,
            start_new_session=new_session,
            process_group=0 if process_group else None,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.pid = self.process.pid
        self.fd_in = self.process.stdin.fileno()
        self.fd_out = self.process.stdout.fileno()
        #: the process's processor-time clock (None: a budget is time on the clock)
        self.clock = cpu_clock(self.pid)

    def handshake(self, send: Callable[[int], None], receive: Callable[[int, float], T], seconds: float) -> T:
        """Send the start message (*send* writes it to the helper's stdin) and read its ready message within
        *seconds* (*receive* reads it from its stdout before the deadline it is given); the process is killed
        when either fails."""
        try:
            send(self.fd_in)
            return receive(self.fd_out, time.monotonic() + seconds)
        except BaseException:
            self.kill(timeout=5)
            raise

    def set_pipe_size(self, size: int) -> None:
        """Give both pipes a buffer of *size* bytes (fewer, larger writes); best effort."""
        for fd in (self.fd_in, self.fd_out):
            try:
                fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), size)
            except OSError:
                pass

    def set_blocking(self, blocking: bool) -> None:
        os.set_blocking(self.fd_in, blocking)
        os.set_blocking(self.fd_out, blocking)

    def budget(self, seconds: float, longest: float, now: float) -> Budget:
        """The budget of one job of this process: *seconds* of its processor time, at most *longest* on the
        clock from *now* (:class:`gateway.helpers.budget.Budget`)."""
        return Budget(self.clock, seconds, longest, now)

    def poll(self) -> int | None:
        return self.process.poll()

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def signal(self) -> None:
        """SIGKILL, without waiting (:meth:`kill` waits)."""
        try:
            self.process.kill()
        except OSError:
            pass

    def kill(self, timeout: float | None = None) -> None:
        """Kill the process, close the pipes and wait for it (at most *timeout* seconds; None: until it has
        gone, which SIGKILL does not make long)."""
        self.signal()
        for stream in (self.process.stdin, self.process.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait for anything
            pass


class _Stoppable(Protocol):
    @property
    def stopped(self) -> bool: ...

    def stop(self) -> None: ...


C = TypeVar("C", bound=_Stoppable)


class SharedHelpers(Generic[C]):
    """The objects that own helper processes, one per configuration (a key) in this process: shared by every
    gateway with that configuration, counted, and stopped when the process exits."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._found: dict[str, C] = {}
        self._users: dict[str, int] = {}
        self._at_exit = False

    def acquire(self, key: str, make: Callable[[], C]) -> C:
        """The object for *key*, made by *make* unless one is running; one user more."""
        with self.lock:
            found = self._found.get(key)
            if found is None or found.stopped:
                found = self._found[key] = make()
                self._users[key] = 0
                if not self._at_exit:
                    atexit.register(self.stop_all)
                    self._at_exit = True
            self._users[key] += 1
            return found

    def release(self, key: str, found: C) -> None:
        """One user is done with *found* (from :meth:`acquire`): the last one stops it."""
        with self.lock:
            if self._found.get(key) is found:
                self._users[key] -= 1
                if self._users[key] > 0:
                    return
                del self._found[key], self._users[key]
        found.stop()

    def stop_all(self) -> None:
        with self.lock:
            found, self._found, self._users = list(self._found.values()), {}, {}
        for item in found:
            item.stop()
