"""The error report of an invalid document, worked out in another process within a time budget.

xmlschema's report (every error, with a reason) is pure Python: it holds the interpreter lock while it
runs, and its cost grows faster than the document (an element with many attributes can take minutes). Run
in the serving process it would starve the event loop, the store's writer thread and its heartbeats; a
thread cannot be stopped. So it runs here:

* a helper process (``python -m gateway.intake.explainer``), started when the first invalid document comes (a
  gateway that never gets one never pays for it), builds the schemas once (lxml and xmlschema, niced) and
  then only waits for jobs: it never reads a document itself;
* for each job it forks a child (copy-on-write: cheap) that parses the body with the same
  hardened intake, validates its tree with lxml and sends libxml2's report (lines, columns, paths), then
  works out xmlschema's and sends that: it runs niced, under a memory limit, and is killed (SIGKILL)
  when the job's time is up;
* the serving process waits up to the budget for the job and takes the best report in by then:
  xmlschema's, else the child's libxml2 report, else (the helper busy, down, or the document over
  ``max_bytes``) the caller's own fallback, libxml2's errors as the serving process has them.

At most ``workers`` children run at once; the jobs behind them wait in the helper, their time running.
What comes back is JSON, read with a size cap: a child that parsed hostile bytes is trusted with nothing
more than a bounded list of numbers and strings.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import SchemaValidationError
from gateway.helpers.errors import report_from_data, report_to_data
from gateway.helpers.framing import read_frame, take_frame, write_frame
from gateway.helpers.workers import HelperProcess, SharedHelpers, helper_pipes, limit_address_space

__all__ = ["Explainer", "DEFAULT_TIMEOUT", "DEFAULT_WORKERS", "EXPLAIN_MAX_BYTES"]

log = logging.getLogger(__name__)

#: Seconds a report may take, from the request's point of view (queueing in the helper included; from the
#: start of the document's intake when the caller says when that was).
DEFAULT_TIMEOUT = 1.0
#: Children working out reports at once (each takes one CPU while it runs).
DEFAULT_WORKERS = 1
#: Larger bodies get the caller's fallback at once: xmlschema would not finish them in time anyway.
EXPLAIN_MAX_BYTES = 1024 * 1024
#: Address space a child may use beyond what it inherits from the helper.
CHILD_MEMORY = 1024 * 1024 * 1024
#: The most a child may send back for one job (its report is at most max_errors clipped entries).
MAX_REPLY_BYTES = 1024 * 1024
#: The most the serving process sends the helper: its start frame's JSON, and a job's (its body apart).
MAX_START_BYTES = 64 * 1024 * 1024
MAX_JOB_HEAD = 64 * 1024


# --------------------------------------------------------------------------- the serving process's side


@dataclass
class _Job:
    done: threading.Event = field(default_factory=threading.Event)
    report: SchemaValidationError | None = None
    final: bool = False


class Explainer:
    """Works out the reports of invalid documents in a helper process (see the module docstring).

    :meth:`start` launches the helper in the background; :meth:`explain` does so when the helper is not
    running, and returns None at once until it is ready. :meth:`explain` blocks its calling thread (an intake
    or executor thread, never the event loop) for at most ``timeout`` seconds. A helper that dies is
    started again on the next job, at most once every ``restart_interval`` seconds.
    """

    _shared: SharedHelpers[Explainer] = SharedHelpers()

    @classmethod
    def shared(
        cls, registry: Any, limits: Any, *, timeout: float = DEFAULT_TIMEOUT, workers: int = DEFAULT_WORKERS
    ) -> Explainer:
        """One explainer (one helper process) for every gateway of this process with the same schemas,
        limits and settings; stopped when the process exits."""
        key = json.dumps([registry.registrations(), repr(limits), timeout, workers], sort_keys=True)
        return cls._shared.acquire(key, lambda: cls(registry, limits, timeout=timeout, workers=workers))

    def __init__(
        self,
        registry: Any,
        limits: Any,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        workers: int = DEFAULT_WORKERS,
        max_bytes: int = EXPLAIN_MAX_BYTES,
        restart_interval: float = 30.0,
    ) -> None:
        self.registry = registry
        self.limits = limits
        self.timeout = timeout
        self.workers = workers
        self.max_bytes = max_bytes
        self.restart_interval = restart_interval
        self._lock = threading.Lock()
        self._jobs: dict[int, _Job] = {}
        self._next_id = 0
        self._helper: HelperProcess | None = None
        self._ready = False
        self._stopped = False
        self._started_at = float("-inf")
        #: reports by where they came from: "xmlschema", "libxml2" (the child's), "fallback" (the caller's)
        self.counts = {"xmlschema": 0, "libxml2": 0, "fallback": 0}

    # ----------------------------------------------------------------- lifecycle

    @property
    def _process(self) -> subprocess.Popen[bytes] | None:
        helper = self._helper
        return helper.process if helper is not None else None

    def start(self) -> None:
        """Start the helper in the background, unless it runs or was started lately."""
        with self._lock:
            if self._stopped or self._helper is not None and self._helper.poll() is None:
                return
            if time.monotonic() - self._started_at < self.restart_interval:
                return
            self._started_at = time.monotonic()
            self._ready = False
        threading.Thread(target=self._launch, name="b2bgw-explainer", daemon=True).start()

    def _launch(self) -> None:
        helper = None
        try:
            helper = HelperProcess("gateway.intake.explainer")
            write_frame(
                helper.fd_in,
                {
                    "registry": self.registry.registrations(),
                    "limits": {name: getattr(self.limits, name) for name in _limit_fields()},
                    "workers": self.workers,
                    "memory": CHILD_MEMORY,
                },
            )
        except (OSError, ValueError) as exc:
            log.warning("the error-report helper did not start: %s", exc)
            if helper is not None:
                helper.kill()
            return
        with self._lock:
            if self._stopped:
                helper.signal()
                return
            self._helper = helper
        self._read(helper)

    def _read(self, helper: HelperProcess) -> None:
        """The helper's answers, until it exits (runs in the launching thread)."""
        try:
            while True:
                try:
                    message, _ = read_frame(helper.fd_out, max_head=MAX_REPLY_BYTES, max_payload=None)
                except EOFError:
                    break
                if message.get("ready"):
                    self._ready = True
                    log.info("error-report helper ready (pid %d)", helper.pid)
                    continue
                self._answer(message)
        except (OSError, ValueError) as exc:
            log.warning("the error-report helper's answer was unreadable: %s", exc)
        finally:
            with self._lock:
                if self._helper is helper:
                    self._helper, self._ready = None, False
                pending = list(self._jobs.values())
            for job in pending:  # their reports will not come: the callers fall back now
                job.done.set()
            if not self._stopped:
                log.warning("the error-report helper exited (code %s)", helper.poll())
            helper.signal()  # its pipes stay open: a writer may hold their descriptors
            helper.process.wait()

    def _answer(self, message: dict[str, Any]) -> None:
        job = self._jobs.get(message.get("id"))  # type: ignore[arg-type]
        if job is None:
            return
        stage = message.get("stage")
        if stage in ("libxml2", "final"):
            report = report_from_data(message.get("error"))
            if report is not None and not job.final:
                job.report, job.final = report, stage == "final"
        if stage != "libxml2":  # final, valid, failed, timeout: nothing more will come
            job.done.set()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self) -> None:
        with self._lock:  # not while a job is being written to the helper
            self._stopped = True
            helper, self._helper = self._helper, None
            try:
                if helper is not None:
                    helper.process.stdin.close()  # type: ignore[union-attr]  # the helper kills its children, exits
            except OSError:
                helper.signal()  # type: ignore[union-attr]
                return
        if helper is not None:
            try:
                helper.process.wait(5)
            except subprocess.TimeoutExpired:
                helper.signal()

    @property
    def ready(self) -> bool:
        return self._ready

    # ----------------------------------------------------------------- jobs

    def explain(
        self, body: bytes, charset: str | None, schema: str, *, started: float | None = None
    ) -> SchemaValidationError | None:
        """The best report of the invalid document *body* ready within ``timeout`` seconds, or None (the
        caller then answers with its own: libxml2's errors as it has them). With *started* (a
        ``time.monotonic()`` reading: when the document's intake began) the seconds count from then, so
        that the time the document spent before it was found invalid comes out of the report's budget,
        not on top of it."""
        report, source = self._explain(body, charset, schema, started)
        self.counts[source] += 1
        return report

    def _explain(
        self, body: bytes, charset: str | None, schema: str, started: float | None
    ) -> tuple[SchemaValidationError | None, str]:
        timeout = self.timeout if started is None else self.timeout - (time.monotonic() - started)
        if len(body) > self.max_bytes or timeout <= 0:
            return None, "fallback"
        helper = self._helper
        if helper is None or not self._ready:
            self.start()
            return None, "fallback"
        with self._lock:
            self._next_id += 1
            job_id = self._next_id
            job = self._jobs[job_id] = _Job()
        try:
            try:
                header = {"id": job_id, "charset": charset, "schema": schema, "timeout": timeout}
                with self._lock:  # one writer at a time on the pipe, and not once it is closed
                    if helper.process.stdin.closed:  # type: ignore[union-attr]
                        raise ValueError("the helper is closed")
                    write_frame(helper.fd_in, header, body)
            except (OSError, ValueError):
                return None, "fallback"
            job.done.wait(timeout + 0.05)
            if job.report is None:
                return None, "fallback"
            return job.report, "xmlschema" if job.final else "libxml2"
        finally:
            with self._lock:
                self._jobs.pop(job_id, None)


def _limit_fields() -> tuple[str, ...]:
    from gateway.intake.xmlsafe import LIMIT_FIELDS

    return LIMIT_FIELDS


# --------------------------------------------------------------------------- the helper process


@dataclass
class _Running:
    job_id: int
    pid: int
    fd: int
    deadline: float
    buffer: bytearray | None = field(default_factory=bytearray)  # None once the job is answered


def _helper() -> None:
    """The helper's main loop: build the schemas, then fork a child per job (see the module docstring)."""
    stdin_fd, stdout = helper_pipes(nice=10)  # the serving process comes first; the children inherit this
    try:
        init, _ = read_frame(stdin_fd, max_head=MAX_START_BYTES, max_payload=None)
    except EOFError:
        return
    from gateway.intake.schemas import SchemaRegistry
    from gateway.intake.xmlsafe import IntakeLimits

    registry = SchemaRegistry.from_registrations(init["registry"])
    registry.compile(details=True)
    limits = IntakeLimits(**init["limits"])
    workers, memory = max(1, int(init["workers"])), int(init["memory"])
    write_frame(stdout, {"ready": True})

    queue: deque[tuple[dict[str, Any], bytes, float]] = deque()
    running: dict[int, _Running] = {}
    while True:
        now = time.monotonic()
        for job in [r for r in running.values() if r.deadline <= now]:
            os.kill(job.pid, signal.SIGKILL)
            _reap(job, running)
            write_frame(stdout, {"id": job.job_id, "stage": "timeout"})
        while queue and queue[0][2] <= now:  # waited its whole time in the queue
            header, _, _ = queue.popleft()
            write_frame(stdout, {"id": header["id"], "stage": "timeout"})
        while queue and len(running) < workers:
            header, body, deadline = queue.popleft()
            child = _fork(header, body, registry, limits, memory, [stdin_fd, stdout])
            if child is None:
                write_frame(stdout, {"id": header["id"], "stage": "failed"})
            else:
                running[child[0]] = _Running(header["id"], child[0], child[1], deadline)
        deadlines = [r.deadline for r in running.values()] + [q[2] for q in queue]
        wait = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        readable, _, _ = select.select([stdin_fd] + [r.fd for r in running.values()], [], [], wait)
        for fd in readable:
            if fd == stdin_fd:
                try:
                    header, body = read_frame(stdin_fd, max_head=MAX_JOB_HEAD, max_payload=None)
                except EOFError:  # the serving process is gone: so are we, and our children
                    for job in list(running.values()):
                        os.kill(job.pid, signal.SIGKILL)
                        _reap(job, running)
                    return
                timeout = min(float(header.get("timeout", DEFAULT_TIMEOUT)), 60.0)
                queue.append((header, body, time.monotonic() + timeout))
                continue
            job = next(r for r in running.values() if r.fd == fd)
            chunk = os.read(fd, 65536)
            if chunk:
                if job.buffer is None:
                    continue  # answered already
                job.buffer += chunk
                if len(job.buffer) > MAX_REPLY_BYTES:
                    os.kill(job.pid, signal.SIGKILL)
                    _reap(job, running)
                    write_frame(stdout, {"id": job.job_id, "stage": "failed"})
                    continue
                _forward(job, stdout)
            else:  # the child is done
                if job.buffer is not None:
                    _forward(job, stdout)
                _reap(job, running)
                if job.buffer is not None:  # it ended without a last word
                    write_frame(stdout, {"id": job.job_id, "stage": "failed"})


def _forward(job: _Running, stdout: int) -> None:
    """Send on each complete frame the child wrote (its header only: a child sends no payload)."""
    buffer = job.buffer
    assert buffer is not None
    while True:
        frame = take_frame(buffer, max_head=MAX_REPLY_BYTES, max_payload=0)
        if frame is None:
            break
        head, _ = frame
        try:
            message = json.loads(head)
        except ValueError:
            continue
        message["id"] = job.job_id  # whatever the child said, it answers its own job
        write_frame(stdout, message)
        if message.get("stage") in ("final", "valid", "failed"):
            job.buffer = None  # answered: nothing more to say when it exits
            return


def _reap(job: _Running, running: dict[int, _Running]) -> None:
    running.pop(job.pid, None)
    try:
        os.close(job.fd)
    except OSError:
        pass
    try:
        os.waitpid(job.pid, 0)
    except ChildProcessError:
        pass


def _fork(
    header: dict[str, Any], body: bytes, registry: Any, limits: Any, memory: int, close: list[int]
) -> tuple[int, int] | None:
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        return None
    if pid:
        os.close(write_fd)
        return pid, read_fd
    # the child: everything it does ends in os._exit
    try:
        os.close(read_fd)
        for fd in close:
            os.close(fd)
        limit_address_space(memory)
        _child(header, body, registry, limits, write_fd)
    finally:
        os._exit(0)


def _child(header: dict[str, Any], body: bytes, registry: Any, limits: Any, out: int) -> None:
    from gateway.errors import GatewayError
    from gateway.intake.xmlsafe import parse_document_text

    job_id = header["id"]
    try:
        root, _ = parse_document_text(body, limits, declared_charset=header.get("charset"))

        def libxml2(report: SchemaValidationError) -> None:
            write_frame(out, {"id": job_id, "stage": "libxml2", "error": report_to_data(report)})

        report = registry.explain(root, header["schema"], source=body, on_libxml2=libxml2)
        if report is None:
            write_frame(out, {"id": job_id, "stage": "valid"})
        else:
            write_frame(out, {"id": job_id, "stage": "final", "error": report_to_data(report)})
    except (GatewayError, MemoryError, RecursionError):
        write_frame(out, {"id": job_id, "stage": "failed"})
    except Exception as exc:  # a bug: say what kind, never what the document held
        print(f"gateway.intake.explainer: the report failed: {type(exc).__name__}", file=sys.stderr)
        write_frame(out, {"id": job_id, "stage": "failed"})


if __name__ == "__main__":
    _helper()
