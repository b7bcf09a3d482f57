"""Business rules at intake: the configured Schematron rule sets, run by worker processes.

The ``rules:`` section names rule sets (``sets: {name: {file, phase}}``); a route lists the ones it applies
after schema validation. :func:`build_rule_book` compiles them at start-up (through the cache of
:func:`gateway.rules.schematron.load_schematron`), each problem a :class:`~gateway.errors.ConfigError` with
``file:line``.

:class:`RulesRunner` runs them. SaxonC cannot be interrupted, so a document whose rules run too long could
hold a thread for good: the transforms run in ``rules.workers`` worker processes (``python -m
gateway.rules.rulesets``), each with every rule set compiled, fed one document at a time over a pipe. The intake hands
a document over (:meth:`RulesRunner.submit`: a future) and goes on with its other stages; a worker that has
spent ``limits.rules_seconds`` of processor time on a document is killed and replaced, and the document gets
:class:`~gateway.errors.RulesTimeoutError` (422), so that a costly document costs the server that budget and
no more (a worker that needs more than ``rules.worker_memory_mb`` stops by itself).

The budget is processor time (:class:`gateway.helpers.budget.Budget`): a loaded machine gives a worker less of the
processor, and an honest document must not be refused as too costly for it. Time on the clock is bounded
too: at :data:`WALL_FACTOR` times the budget the worker is stopped all the same and the document gets
:class:`~gateway.errors.GatewayBusyError` (503, retry), which blames the load and not the document.

Findings come back as :class:`~gateway.rules.schematron.Finding`: those of flag ``fatal``, ``error`` or none
(:attr:`Finding.is_error`) refuse the document (:func:`violation`: 400 ``business-rule-violation``); the
others are warnings the receipt, the ledger and the message carry.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import json
import logging
import os
import resource
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lxml import etree

from gateway.errors import (
    BusinessRuleViolationError,
    ConfigError,
    GatewayBusyError,
    GatewayError,
    RuleFailureDetail,
    RulesEvaluationError,
    RulesTimeoutError,
    clip,
)
from gateway.helpers.budget import Budget, OverloadedError
from gateway.helpers.framing import pack_record, read_record, take_record, write_record
from gateway.helpers.workers import HelperProcess, helper_pipes
from gateway.rules.schematron import (
    CompiledSchematron,
    Finding,
    SaxonRules,
    SchematronError,
    default_cache_dir,
    load_schematron,
    locate,
    parse_output,
)

__all__ = [
    "DEFAULT_RULES_SECONDS",
    "WALL_FACTOR",
    "RuleBook",
    "RuleSet",
    "RulesRunner",
    "build_rule_book",
    "rules_cache_dir",
    "violation",
    "warnings_of",
]

log = logging.getLogger(__name__)

#: ``limits.rules_seconds`` by default: the most a document's business rules may take.
DEFAULT_RULES_SECONDS = 2.0
#: A document's rules are given at most this many times ``limits.rules_seconds`` on the clock, however little
#: of the processor the worker got meanwhile (then 503 gateway-busy).
WALL_FACTOR = 5
#: How long a new worker may take to compile the rule sets before the gateway gives up on it.
START_SECONDS = 60.0
#: The most findings a worker sends back for one document (a report of many is cut here).
MAX_FINDINGS = 1000
#: The most warnings a receipt lists (the count on the message is the whole number).
MAX_RECEIPT_WARNINGS = 50
#: ``rules.worker_memory_mb`` by default: a worker that needs more for a document stops (the document gets
#: 422 rules-error) and another takes its place.
DEFAULT_WORKER_MEMORY_MB = 1024


@dataclass
class RuleSet:
    """A configured rule set, compiled."""

    name: str
    compiled: CompiledSchematron
    where: Any = None


@dataclass
class RuleBook:
    """The configured rule sets by name, compiled (those that compiled; the rest are in the errors)."""

    sets: dict[str, RuleSet] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.sets)

    def __contains__(self, name: object) -> bool:
        return name in self.sets


def rules_cache_dir(settings: Any) -> Path:
    """``rules.cache_dir``; else ``rules-cache`` beside a SQLite store's file (the store's var folder),
    else the user's cache folder."""
    if settings.rules_cache_dir is not None:
        return settings.rules_cache_dir
    url = settings.store_url
    if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
        return Path(url[len("sqlite:///") :].split("?", 1)[0]).absolute().parent / "rules-cache"
    return default_cache_dir()


def build_rule_book(settings: Any, errors: list[ConfigError]) -> RuleBook:
    """Compile the ``rules.sets`` of *settings*; each problem is appended to *errors* (file:line)."""
    book = RuleBook()
    if not settings.rule_sets:
        return book
    cache = rules_cache_dir(settings)
    checker: SaxonRules | None = None
    for entry in settings.rule_sets:
        if not entry.path.is_file():
            errors.append(entry.where.error(f"rule set {entry.name!r}: no such file {entry.path}"))
            continue
        try:
            compiled = load_schematron(entry.path, entry.phase, cache_dir=cache, check=checker)
        except SchematronError as exc:
            for err in exc.errors:
                errors.append(ConfigError(f"rule set {entry.name!r}: {err.detail}", file=err.file, line=err.line))
            continue
        except ConfigError as exc:
            errors.append(
                ConfigError(f"rule set {entry.name!r}: {exc.detail}", file=exc.file or str(entry.path), line=exc.line)
            )
            continue
        book.sets[entry.name] = RuleSet(entry.name, compiled, entry.where)
    return book


# --------------------------------------------------------------------------- findings for the HTTP answer


def violation(findings: list[Finding], body: bytes | None, parse: Any = None) -> BusinessRuleViolationError:
    """The 400 of a document with failures: every failure (at most 50 listed), with the line and column of
    its node in *body* when it can be found (*parse*: the intake's parser, ``bytes -> root``)."""
    failures = [f for f in findings if f.is_error]
    positions: dict[int, tuple[int | None, int | None]] = {}
    if body is not None and parse is not None:
        positions = _positions(failures[: BusinessRuleViolationError.max_errors], body, parse)
    details = []
    for i, f in enumerate(failures):
        line, column = positions.get(i, (None, None))
        details.append(RuleFailureDetail(f.assertion.id, f.assertion.flag, f.location, f.text, line, column))
    first = details[0]
    count = f"{len(failures)} business rules" if len(failures) > 1 else "a business rule"
    detail = (
        f"The document breaks {count} agreed for this route (first: "
        f"{first.id + ': ' if first.id else ''}{first.text}); fix it and send it again."
    )
    return BusinessRuleViolationError(detail, details)


def _positions(failures: list[Finding], body: bytes, parse: Any) -> dict[int, tuple[int | None, int | None]]:
    from gateway.intake.locations import _decode_source, _locate  # the schema errors' own way of placing an element

    try:
        root = parse(body)
    except Exception:  # the document parsed at intake; positions are best effort
        return {}
    found: dict[int, etree._Element] = {}
    for i, f in enumerate(failures):
        el = locate(root, f.path)
        if el is not None:
            found[i] = el
    if not found:
        return {}
    text = _decode_source(root, body)
    places = _locate(root, text, set(found.values())) if text is not None else {}
    return {i: places.get(el, (el.sourceline, None)) for i, el in found.items()}


def warnings_of(findings: list[Finding]) -> list[dict[str, Any]]:
    """The findings that do not refuse the document, as the receipt lists them (at most
    :data:`MAX_RECEIPT_WARNINGS`)."""
    return [f.to_dict() for f in findings if not f.is_error][:MAX_RECEIPT_WARNINGS]


# --------------------------------------------------------------------------- worker processes
#
# Records on the pipes (:mod:`gateway.helpers.framing`: a 4-byte big-endian length, then the bytes). The parent
# sends one start record (the rule sets, JSON), the worker answers b"ok" or b"error:" + why; then per document
# the parent sends b"<set numbers, comma-separated>\n" + the document's UTF-8 text, and the worker answers
# b"R" + the raw outputs (joined by NUL, which no XML text holds), b"P" + a parse error or b"E" + an error of
# the rules.


def _worker_main() -> None:
    """A worker process: compile the rule sets of the start record, then run documents until EOF."""
    fin, fout = helper_pipes(ignore_interrupts=True)  # the parent stops it (Ctrl-C goes to the whole group)
    try:
        start = json.loads(read_record(fin))
        if start.get("memory"):  # Saxon's heap is mapped memory: RLIMIT_DATA bounds it (RLIMIT_AS would not:
            limit = int(start["memory"])  # the native image reserves far more address space than it uses)
            resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        rules = SaxonRules()
        for text in start["sets"]:
            rules.add(CompiledSchematron.from_json(text))
        rules.lock()
    except Exception as exc:  # told to the parent
        write_record(fout, b"error:" + str(exc).encode("utf-8", "replace")[:2000])
        return
    write_record(fout, b"ok")
    saxon_error = rules._saxon.PySaxonApiError
    while True:
        try:
            frame = read_record(fin)
        except EOFError:
            return
        head, _, document = frame.partition(b"\n")
        numbers = [int(n) for n in head.split(b",") if n]
        try:
            node = rules.parse(document.decode("utf-8"))
        except saxon_error as exc:
            write_record(fout, b"P" + str(exc).encode("utf-8", "replace")[:2000])
            continue
        try:
            outputs = []
            for number in numbers:
                executable = rules.sets[number][1]
                executable.set_global_context_item(xdm_item=node)
                outputs.append(executable.apply_templates_returning_string(xdm_value=node, encoding="UTF-8") or "")
        except saxon_error as exc:
            write_record(fout, b"E" + str(exc).encode("utf-8", "replace")[:2000])
            continue
        write_record(fout, b"R" + "\0".join(outputs).encode("utf-8"))


class _Worker:
    """One worker process, driven from the event loop (no thread: a thread would wait for the GIL on
    every document while the loop is busy)."""

    def __init__(self, runner: RulesRunner, number: int) -> None:
        self.runner = runner
        self.number = number
        self.helper: HelperProcess | None = None
        self.job: _Job | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.buffer = bytearray()
        self.pending = b""
        self.timer: asyncio.TimerHandle | None = None
        self.budget: Budget | None = None  # the job's
        self.starting = False
        self.reading: tuple[asyncio.AbstractEventLoop, int] | None = None  # where the answers are awaited

    # ----------------------------------------------------------------- the process

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        helper = self.helper
        return helper.process if helper is not None else None

    def spawn(self) -> None:
        """Start the process and wait until it has compiled the rule sets (blocking: call it off the loop)."""
        root = str(Path(__file__).resolve().parents[2])  # the folder that holds the gateway package
        helper = HelperProcess("gateway.rules.rulesets", new_session=True, cwd=root, quiet=True)
        try:
            answer = helper.handshake(lambda fd: write_record(fd, self.runner.start_frame), read_record, START_SECONDS)
        except (OSError, EOFError, TimeoutError) as exc:
            raise RuntimeError(f"a rules worker did not start: {exc!r}") from None
        if answer != b"ok":
            helper.kill(timeout=5)
            raise RuntimeError(f"a rules worker did not start: {answer.decode('utf-8', 'replace')[:500]}")
        helper.set_blocking(False)
        self.helper = helper

    @property
    def ready(self) -> bool:
        return self.helper is not None and self.job is None and not self.starting

    def _forget(self) -> HelperProcess | None:
        """Take the process out of the worker and its pipes off the loop."""
        helper, self.helper = self.helper, None
        loop, self.reading = self.loop, None
        if helper is not None and loop is not None and not loop.is_closed():
            for fd in (helper.fd_out, helper.fd_in):
                try:
                    loop.remove_reader(fd)
                    loop.remove_writer(fd)
                except (RuntimeError, ValueError):  # pragma: no cover - the loop is going away
                    pass
        return helper

    def _replace(self) -> None:
        """Stop the process (the document it runs has had its time) and start another off the loop."""
        helper = self._forget()
        if helper is not None:
            helper.signal()
        self.buffer.clear()
        self.pending = b""
        if self.runner.stopped:
            if helper is not None:
                threading.Thread(target=helper.kill, args=(5,), daemon=True).start()
            return
        self.starting = True

        def restart() -> None:
            if helper is not None:
                helper.kill(timeout=5)
            error = None
            for _ in range(3):
                try:
                    self.spawn()
                    error = None
                    break
                except RuntimeError as exc:
                    error = exc
            if error is not None:
                log.error("%s", error)
            self.starting = False
            if self.runner.stopped and self.helper is not None:
                self.helper.kill(timeout=5)
                self.helper = None
            self.runner._wake()

        threading.Thread(target=restart, name=f"b2bgw-rules-restart-{self.number}", daemon=True).start()

    # ----------------------------------------------------------------- one document

    def run(self, job: _Job) -> None:
        loop = asyncio.get_running_loop()
        helper = self.helper
        assert helper is not None
        self.loop = loop
        self.job = job
        self.buffer.clear()
        self.pending = pack_record(job.payload)
        fd = helper.fd_out
        if self.reading != (loop, fd):  # registered once per process (and loop), not per document
            loop.add_reader(fd, self._readable)
            self.reading = (loop, fd)
        runner = self.runner
        self.budget = helper.budget(runner.seconds, runner.seconds * WALL_FACTOR, loop.time())
        self.timer = loop.call_later(runner.seconds, self._check)
        self._writable()

    def _writable(self) -> None:
        helper = self.helper
        if helper is None or not self.pending:
            return
        fd = helper.fd_in
        try:
            written = os.write(fd, self.pending)
        except BlockingIOError:
            written = 0
        except OSError:
            self._failed("the rules worker stopped")
            return
        self.pending = self.pending[written:]
        assert self.loop is not None
        if self.pending:
            self.loop.add_writer(fd, self._writable)
        else:
            self.loop.remove_writer(fd)

    def _readable(self) -> None:
        helper = self.helper
        if helper is None:
            return
        try:
            chunk = os.read(helper.fd_out, 1 << 20)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._failed("the rules worker stopped")
            return
        if self.job is None:  # nothing asked: not an answer
            return
        self.buffer += chunk
        answer = take_record(self.buffer)
        if answer is None:
            return
        self._finish()
        job, self.job = self.job, None
        assert job is not None
        self.runner._answered(job, answer)

    def _finish(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        helper = self.helper
        if helper is not None and self.loop is not None and self.pending:
            self.loop.remove_writer(helper.fd_in)
        self.buffer.clear()
        self.pending = b""

    def _check(self) -> None:
        """The budget's time on the clock is up: stop the worker if the document has had its processor time
        (or the longest wait is up), else look again when it could have."""
        self.timer = None
        loop, budget = self.loop, self.budget
        assert loop is not None and budget is not None
        extended = budget.extended
        try:
            wait = budget.check(loop.time())
        except TimeoutError:
            self._stop(RulesTimeoutError(seconds=self.runner.seconds))
            return
        except OverloadedError as exc:
            self.runner.overloads += 1
            log.warning("business rules: a document had %s (the machine is overloaded); its worker was stopped", exc)
            self._stop(
                GatewayBusyError(
                    "The gateway is too busy to run the business rules on this document now; nothing was accepted. "
                    f"Send it again in {GatewayBusyError.default_retry_after} s."
                )
            )
            return
        if budget.extended and not extended:
            self.runner.extended += 1
        self.timer = loop.call_later(wait, self._check)

    def _stop(self, error: GatewayError) -> None:
        job, self.job = self.job, None
        self._finish()
        if isinstance(error, RulesTimeoutError):
            self.runner.timeouts += 1
            log.warning(
                "business rules: a document took over %g s of the processor; its worker was stopped",
                self.runner.seconds,
            )
        self._replace()
        if job is not None:
            _fail(job.future, error)
        self.runner._dispatch()

    def _failed(self, why: str) -> None:
        job, self.job = self.job, None
        self._finish()
        log.error("business rules: %s", why)
        self._replace()
        if job is not None:
            _fail(
                job.future,
                RulesEvaluationError(
                    "The business rules could not be run on this document: the process running them stopped (out of "
                    f"its {self.runner.memory_mb} MB of memory, or failed); nothing was accepted."
                ),
            )
        self.runner._dispatch()


@dataclass(eq=False)
class _Job:
    names: tuple[str, ...]
    payload: bytes
    future: asyncio.Future[list[Finding]]


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    """Fail a job's future; marked as retrieved, since nobody awaits the job of a replayed document."""
    if not future.done():
        future.set_exception(error)
        future.exception()


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return clip(" ".join(lines[:2]) if lines else "no detail", 300)


class RulesRunner:
    """Runs the rule sets of a :class:`RuleBook` in worker processes, each document within *seconds*.

    :meth:`start` starts the processes (blocking); :meth:`submit` is called on the event loop, which
    then drives the workers' pipes itself."""

    def __init__(
        self,
        book: RuleBook,
        *,
        workers: int = 1,
        seconds: float = DEFAULT_RULES_SECONDS,
        memory_mb: int = DEFAULT_WORKER_MEMORY_MB,
    ) -> None:
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self.book = book
        self.seconds = seconds
        self.memory_mb = memory_mb
        self.names = list(book.sets)
        self.numbers = {name: i for i, name in enumerate(self.names)}
        self.start_frame = json.dumps(
            {"sets": [book.sets[n].compiled.to_json() for n in self.names], "memory": memory_mb * 1024 * 1024}
        ).encode()
        self._workers = [_Worker(self, i) for i in range(workers)]
        self._queue: collections.deque[_Job] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop of the latest submit
        #: documents stopped at their budget (422 rules-timeout); stopped at the longest wait (503
        #: gateway-busy); given more time on the clock than the budget since their worker was starved
        self.timeouts = 0
        self.overloads = 0
        self.extended = 0
        self._started = False
        self.stopped = False

    def start(self) -> None:
        """Start the worker processes (each compiles every rule set: under a second from the cache)."""
        if self._started:
            return
        pool = concurrent.futures.ThreadPoolExecutor(len(self._workers))
        try:
            list(pool.map(lambda w: w.spawn(), self._workers))
        finally:
            pool.shutdown()
        self._started = True

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        for worker in self._workers:
            if worker.timer is not None:
                worker.timer.cancel()
            helper = worker._forget()
            if helper is not None:
                helper.kill(timeout=5)
        for job in self._queue:
            _fail(job.future, RulesEvaluationError("The gateway is stopping; retry in a moment."))
        self._queue.clear()

    def submit(self, names: Iterable[str], text: str | bytes) -> asyncio.Future[list[Finding]]:
        """Run the rule sets *names* on a document's text (:func:`~gateway.rules.schematron.document_text`, or its
        UTF-8 encoding); call it on the event loop. The future's result is every finding, or
        RulesTimeoutError / RulesEvaluationError."""
        if not self._started or self.stopped:
            raise RuntimeError("the rules runner is not running")
        names = tuple(names)
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        payload = ",".join(str(self.numbers[n]) for n in names).encode("ascii") + b"\n" + data
        loop = asyncio.get_running_loop()
        self._loop = loop
        job = _Job(names, payload, loop.create_future())
        self._queue.append(job)
        self._dispatch()
        return job.future

    async def check_async(self, names: Iterable[str], text: str) -> list[Finding]:
        return await self.submit(names, text)

    def check(self, names: Iterable[str], text: str) -> list[Finding]:
        """:meth:`submit` and wait, outside an event loop (tools and benchmarks)."""
        return asyncio.run(self.check_async(names, text))

    def _wake(self) -> None:
        """Dispatch waiting documents from the loop they were submitted on (any thread)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._dispatch)
            except RuntimeError:  # pragma: no cover - closed meanwhile
                pass

    def _dispatch(self) -> None:
        queue_ = self._queue
        while queue_:
            worker = next((w for w in self._workers if w.ready), None)
            if worker is None:
                if all(w.helper is None and not w.starting for w in self._workers):  # none would start
                    while queue_:
                        _fail(
                            queue_.popleft().future,
                            GatewayError(
                                "The business rules cannot be run right now (their processes do not start); retry "
                                "later or contact the operator."
                            ),
                        )
                    for w in self._workers:  # and try again for the next documents
                        w._replace()
                return
            if worker.helper is not None and worker.helper.poll() is not None:  # died while idle
                log.error(
                    "business rules: worker %d exited (status %s); starting another",
                    worker.number,
                    worker.helper.returncode,
                )
                worker._replace()
                continue
            job = queue_.popleft()
            if job.future.done():  # cancelled: the client went away
                continue
            worker.run(job)

    def _answered(self, job: _Job, answer: bytes) -> None:
        try:
            findings = self._findings(job, answer)
        except GatewayError as exc:
            _fail(job.future, exc)
        else:
            if not job.future.done():
                job.future.set_result(findings)
        self._dispatch()

    def _findings(self, job: _Job, answer: bytes) -> list[Finding]:
        kind, rest = answer[:1], answer[1:].decode("utf-8", "replace")
        if kind == b"P":  # the intake parsed it: not expected, but the document is what Saxon refuses
            raise RulesEvaluationError(f"The business rules could not read this document: {_first_line(rest)}")
        if kind != b"R":
            raise RulesEvaluationError(
                f"The business rules failed on this document: {_first_line(rest)}; check the values they name."
            )
        findings: list[Finding] = []
        for name, output in zip(job.names, rest.split("\0"), strict=False):
            findings.extend(parse_output(self.book.sets[name].compiled, output, MAX_FINDINGS))
        return findings


if __name__ == "__main__":  # a worker process (RulesRunner starts it)
    _worker_main()
