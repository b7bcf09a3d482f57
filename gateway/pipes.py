"""What the gateway's helper processes (error reports, business rules, large documents' intake) share:
their environment, writing and reading a pipe (against a deadline), and bounding a process's memory."""

from __future__ import annotations

import os
import select
import time
from pathlib import Path

__all__ = ["helper_environment", "write_all", "read_exactly", "limit_address_space"]


def helper_environment() -> dict[str, str]:
    """This process's environment, with the gateway's packages importable first: what ``python -m
    gateway.<helper>`` needs wherever the serving process was started from."""
    root = str(Path(__file__).resolve().parent.parent)
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
