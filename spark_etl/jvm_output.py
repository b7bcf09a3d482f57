"""Where the JVM that PySpark starts writes its own output.

Spark's JVM inherits the terminal of the process that starts it: its log4j banner, its WARN lines and the
JDK's own notices would land in the middle of ``b2bgw etl run``'s answer. A command that wants one line per
run names a file here before the session starts; the JVM (and the Python workers it starts) then write to
that file for their whole life, while this process's own output stays on the terminal.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

__all__ = ["jvm_log_path", "keep_jvm_output", "quiet_jvm", "started_with_output"]

#: the file a JVM started from now on writes to; None: the terminal (Spark's own behaviour)
_path: str | None = None


def quiet_jvm() -> str:
    """Send the output of a JVM started from now on to a new temporary file; its path."""
    global _path
    fd, _path = tempfile.mkstemp(prefix="b2bgw-etl-spark-", suffix=".log")
    os.close(fd)
    return _path


def keep_jvm_output() -> None:
    """Let a JVM started from now on write to the terminal (``--verbose``)."""
    global _path
    _path = None


def jvm_log_path() -> str | None:
    return _path


@contextlib.contextmanager
def started_with_output() -> Iterator[None]:
    """Around the start of the JVM: file descriptors 1 and 2 point at the chosen file while it starts (it
    inherits them), then back at the terminal."""
    if _path is None:
        yield
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved = [os.dup(1), os.dup(2)]
    target = os.open(_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)
