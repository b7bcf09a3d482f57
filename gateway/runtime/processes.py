"""Serving from several processes: ``server.processes`` (``b2bgw serve --processes N``).

One gateway process is bound by the GIL: parsing, HTTP and the store's writer share one core's worth of
Python. With ``processes: N`` the command becomes a small supervisor that

* opens the store once (migrations run once; a store that cannot open fails before anything listens);
* binds one listening socket per serving process (``SO_REUSEPORT``) and passes each to its process
  (``python -m gateway.cli.main serve`` with hidden ``--listen-fd``, ``--process-index`` and ``--cpu``), so that
  the kernel spreads new connections evenly: with one shared socket, the process whose event loop woke first
  took whole bursts of connections while the other sat idle. It keeps no copy of a socket it handed over, so
  a dead process's socket leaves the port's group at once; a successor's socket listens only once it has
  started, so no connection waits in its queue meanwhile;
* forwards SIGINT/SIGTERM and waits for a graceful shutdown (SIGKILL after ``STOP_GRACE`` seconds);
* restarts a process that dies after it started serving, backing off from 1 s to 30 s; one that exits before
  its first start completed (a configuration error) stops them all with its exit code, since restarting
  would only repeat the error. A serving process reports that it is ready on a pipe (hidden ``--ready-fd``).

The processes are one broker through the SQL store (a memory store is refused): competing consumers never
get the same message, idempotency holds across them (the ledger's unique key), and the reconciler and the
nightly load take a lease. Process 0 alone runs the STOMP listener and schedules the nightly load.
With ``pin_processes`` (the default) process *i* is bound to the *i*-th usable CPU: a document is handed
between threads several times (event loop, store writer, handler), and a hand-over within one core is
cheaper than across cores. The nightly load's Spark JVM gets the whole CPU set back (``B2BGW_CPUS``).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from gateway.config.loader import Settings
from gateway.errors import ConfigError

__all__ = ["Supervisor", "process_count", "usable_cpus"]

log = logging.getLogger(__name__)

#: How long the processes get to finish their requests after SIGTERM.
STOP_GRACE = 20.0
_BACKOFF_MAX = 30.0
#: Environment variable naming the CPUs the supervisor had (for Spark's JVM).
CPUS_ENV = "B2BGW_CPUS"
#: prometheus_client's multiprocess directory: the supervisor makes one (unless set) and removes it at the end.
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"


def usable_cpus() -> list[int]:
    """The CPUs this process may run on, in order."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


def process_count(settings: Settings, override: int | None = None) -> int:
    """How many serving processes: the command line's, else ``server.processes``; 0 means one per usable CPU."""
    wanted = settings.processes if override is None else override
    if wanted < 0:
        raise ConfigError(f"--processes must be 0 (one per CPU) or more, not {wanted}")
    return wanted or len(usable_cpus())


def pin_to(cpu: int) -> None:
    """Bind the calling thread (at start-up: the whole process to come) to *cpu*."""
    os.sched_setaffinity(0, {cpu})


@dataclass
class _Child:
    index: int
    proc: subprocess.Popen | None = None
    started: float = 0.0
    first: bool = True
    backoff: float = 1.0
    restart_at: float | None = None
    ready_fd: int | None = None
    sock: socket.socket | None = None  # its listening socket (SO_REUSEPORT) until the process takes it


class Supervisor:
    """Runs *count* serving processes on one listening socket (see the module docstring)."""

    def __init__(
        self, settings: Settings, count: int, *, host: str, port: int, child_args: list[str], pin: bool = True
    ) -> None:
        if not settings.is_sql_store:
            raise ConfigError(
                f"server.processes = {count} needs a SQL store (sqlite:/// or postgresql+psycopg://): "
                f"the processes share messages through it, and {settings.store_url!r} cannot be shared",
                file=settings.where.file,
            )
        self.settings = settings
        self.count = count
        self.host = host
        self.port = port
        self.child_args = child_args
        cpus = usable_cpus()
        self.cpus = [cpus[i % len(cpus)] for i in range(count)] if pin else [None] * count
        self.all_cpus = cpus
        self.children = [_Child(i) for i in range(count)]
        self.family = socket.AF_INET
        self._bound = False
        self._stop = threading.Event()
        self.metrics_dir: str | None = os.environ.get(METRICS_ENV)
        self._own_metrics_dir = False

    # ------------------------------------------------------------------ start

    def bind(self) -> int:
        """Bind the port with one listening socket per process; the port (the system's choice for port 0)."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # sockets with SO_REUSEPORT share a port with any other such socket of this user: first make sure
        # nothing listens there (a probe without the option fails on any socket bound to the port)
        probe = socket.socket(family, socket.SOCK_STREAM)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((self.host, self.port))
            self.port = probe.getsockname()[1]
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {self.host}:{self.port}: {exc.strerror}; choose another port (--port or server.port)"
            ) from None
        finally:
            probe.close()
        self.family = family
        for child in self.children:
            child.sock = self._listen()
        self._bound = True
        return self.port

    def _listen(self, listen: bool = True) -> socket.socket:
        """A new socket on the port, in the port's SO_REUSEPORT group once it listens (*listen*: now; else
        its process listens when it has started: uvicorn does, after the app's start-up)."""
        sock = socket.socket(self.family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((self.host, self.port))
            if listen:
                sock.listen(2048)
        except OSError as exc:
            sock.close()
            raise ConfigError(
                f"cannot listen on {self.host}:{self.port}: {exc.strerror}; choose another port (--port or server.port)"
            ) from None
        sock.set_inheritable(True)
        return sock

    @staticmethod
    def _unlisten(child: _Child) -> None:
        if child.sock is not None:
            child.sock.close()
            child.sock = None

    def _spawn(self, child: _Child) -> None:
        if child.sock is None:  # a successor: its predecessor's socket went with it; the others serve meanwhile
            child.sock = self._listen(listen=False)
        args = [
            sys.executable,
            "-m",
            "gateway.cli.main",
            *self.child_args,
            "--listen-fd",
            str(child.sock.fileno()),
            "--process-index",
            str(child.index),
        ]
        cpu = self.cpus[child.index]
        if cpu is not None:
            args += ["--cpu", str(cpu)]
        env = dict(os.environ, **{CPUS_ENV: ",".join(map(str, self.all_cpus))})
        if self.metrics_dir is not None:  # prometheus_client's multiprocess mode: /metrics sums the processes
            env[METRICS_ENV] = self.metrics_dir
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        args += ["--ready-fd", str(write_end)]
        try:
            child.proc = subprocess.Popen(args, pass_fds=(child.sock.fileno(), write_end), env=env)
        finally:
            os.close(write_end)
            self._unlisten(child)  # the process holds it now, and it closes with the process
        self._close_ready(child)
        child.ready_fd = read_end
        child.started = time.monotonic()
        child.restart_at = None
        log.info(
            "started serving process %d (pid %d%s)",
            child.index,
            child.proc.pid,
            f", CPU {cpu}" if cpu is not None else "",
        )

    # ------------------------------------------------------------------ run

    def run(self) -> int:
        """Serve until SIGINT/SIGTERM (0) or until a process fails at start-up (its exit code)."""
        if not self._bound:
            self.bind()
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._on_hangup)  # reload the TLS certificate
        if self.metrics_dir is None:
            self.metrics_dir = tempfile.mkdtemp(prefix="b2bgw-metrics-")
            self._own_metrics_dir = True
        code = 0
        try:
            for child in self.children:
                self._spawn(child)
            log.info("serving on http://%s:%d with %d processes", self.host, self.port, self.count)
            while not self._stop.is_set():
                code = self._check()
                if code:
                    break
                self._stop.wait(0.2)
        finally:
            self._terminate()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for child in self.children:
                self._close_ready(child)
                self._unlisten(child)
            if self._own_metrics_dir and self.metrics_dir is not None:
                shutil.rmtree(self.metrics_dir, ignore_errors=True)
        return code

    def _on_signal(self, _signum: int, _frame: object) -> None:
        self._stop.set()

    def _on_hangup(self, _signum: int, _frame: object) -> None:
        """SIGHUP: passed on to every serving process (each reloads its TLS certificate)."""
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGHUP)

    @staticmethod
    def _close_ready(child: _Child) -> None:
        if child.ready_fd is not None:
            os.close(child.ready_fd)
            child.ready_fd = None

    @staticmethod
    def _has_started(child: _Child) -> bool:
        """Whether the process has said it is ready (its byte on the pipe)."""
        if child.ready_fd is None:
            return False
        try:
            return bool(os.read(child.ready_fd, 1))
        except BlockingIOError:
            return False

    def _check(self) -> int:
        now = time.monotonic()
        for child in self.children:
            proc = child.proc
            if proc is None:
                if child.restart_at is not None and now >= child.restart_at:
                    self._spawn(child)
                continue
            rc = proc.poll()
            if child.first and self._has_started(child):  # read after poll: a process ready, then gone, counts
                child.first = False
            if rc is None:
                if now - child.started > 60:
                    child.backoff = 1.0  # it has been serving a while: the next failure restarts at once
                continue
            child.proc = None
            self._close_ready(child)
            ran = now - child.started
            if child.first:
                log.error(
                    "serving process %d exited with code %s during start-up (after %.1f s); "
                    "stopping the others (see its error above)",
                    child.index,
                    rc,
                    ran,
                )
                return rc if rc and rc > 0 else 1
            child.restart_at = now + child.backoff
            log.error(
                "serving process %d exited with code %s after %.0f s; restarting it in %.0f s",
                child.index,
                rc,
                ran,
                child.backoff,
            )
            child.backoff = min(child.backoff * 2, _BACKOFF_MAX)
        return 0

    def _terminate(self) -> None:
        running = [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]
        for proc in running:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:  # pragma: no cover - it just exited
                pass
        deadline = time.monotonic() + STOP_GRACE
        for proc in running:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("serving process pid %d did not stop within %.0f s; killing it", proc.pid, STOP_GRACE)
                proc.kill()
                proc.wait()
