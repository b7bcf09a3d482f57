"""The intake of large documents, in worker processes.

A large document's intake holds the interpreter lock for tens of milliseconds at a time in places (libxml2
freeing a tree of megabytes, the text checks of the hardened parse, XPath over thousands of lines). On a
thread of the serving process that time is taken from the event loop, the store's writer and every other
partner's requests, whatever the thread's priority. So bodies over ``inline_max_bytes`` are taken in by worker
processes with their own interpreter: each rebuilds the gateway's schemas and routes from its settings once,
runs niced, and takes one document at a time through the same stages (parse, route, validate, extract,
transform, facts). The serving process keeps what needs its state: the keys accepted lately, the legacy keys,
the full error report (:class:`gateway.intake.explainer.Explainer`) and everything after the intake.

What comes back is JSON and byte strings, read with size caps: a process that parsed hostile bytes is trusted
with nothing that could run code in the serving process (no pickle), and an error comes back as its class
name, detail and plain fields, rebuilt only as one of the gateway's own error classes.

Workers start with the first large document (a gateway that never gets one never pays for them). Until one
is ready, and for settings a worker cannot rebuild (not built from a mapping), large documents are taken in on
threads as before. A document that takes more than :data:`WORKER_TIMEOUT` of processor time or more than
:data:`WORKER_MEMORY` kills its worker (another starts) and is refused with a 400. Processor time, since the
workers are niced and a loaded machine gives them little of it; one that is still within that budget after
:data:`WORKER_LONGEST` on the clock is stopped all the same, and the document gets 503 gateway-busy (the
load's doing, not the document's: it may be sent again).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gateway.errors import GatewayBusyError, GatewayError, XMLSecurityError, clip
from gateway.helpers.budget import OverloadedError, wait_readable
from gateway.helpers.errors import error_to_data
from gateway.helpers.framing import read_frame, write_frame
from gateway.helpers.workers import HelperProcess, SharedHelpers, helper_pipes, limit_address_space
from gateway.intake.documents import received_document

__all__ = [
    "IntakeWorkers",
    "WORKER_TIMEOUT",
    "WORKER_LONGEST",
    "WORKER_MEMORY",
    "WORKER_NICE",
]

log = logging.getLogger(__name__)

#: The processor time one document may take in a worker before the worker is killed and the document refused
#: (s). The intake limits keep every document far below it; it bounds what they do not foresee.
WORKER_TIMEOUT = 10.0
#: The longest one document waits for a worker on the clock, however little of the processor the worker got
#: (then 503 gateway-busy, and the worker is replaced).
WORKER_LONGEST = 20.0
#: Address space a worker may use beyond what it holds once ready (a 10 MiB document's tree and copies).
WORKER_MEMORY = 2 * 1024 * 1024 * 1024
#: Added to the workers' nice value: the serving process and its small documents come first.
WORKER_NICE = 10
#: A worker that failed to start is not started again before this many seconds.
RESTART_INTERVAL = 30.0
#: The most an answer's JSON part and its byte strings may take.
MAX_ANSWER_HEAD = 16 * 1024 * 1024
MAX_ANSWER_BYTES = 256 * 1024 * 1024
#: The pipes' buffer (Linux's default most for a user, /proc/sys/fs/pipe-max-size).
PIPE_BYTES = 1024 * 1024


class _WorkerBusyError(Exception):
    """The worker had the document, but the machine gave it too little of the processor to finish in time."""


class _WorkerLostError(Exception):
    """The worker died, answered nonsense or ran out of time: *sent* says whether it had the document."""

    def __init__(self, why: str, sent: bool) -> None:
        super().__init__(why)
        self.sent = sent


# --------------------------------------------------------------------------- frames on the pipes
#
# Frames (:mod:`gateway.helpers.framing`): the serving process sends the start frame (its settings), the worker
# answers with the fingerprint of what it built; then per document the head and the body, and the worker
# answers ``ok`` (the byte strings in the payload), ``error`` or ``refused``.


def _write_frame(fd: int, head: dict[str, Any], payload: bytes = b"") -> None:
    write_frame(fd, head, payload, default=str)


def _read_answer(fd: int, deadline: float | None = None) -> tuple[Any, bytes]:
    return read_frame(fd, deadline, max_head=MAX_ANSWER_HEAD, max_payload=MAX_ANSWER_BYTES)


def _refused(why: str) -> XMLSecurityError:
    log.warning("a large document was refused: its intake %s", why)
    return XMLSecurityError(
        f"The gateway could not take the document in within its bounds ({WORKER_TIMEOUT:g} s of processing and its "
        "memory limit for one document); it is refused for safety. Send a smaller or simpler document."
    )


# --------------------------------------------------------------------------- the serving process's side


class _Worker:
    """One worker process; used by one thread at a time (the pool hands it out)."""

    def __init__(self, helper: HelperProcess) -> None:
        self.helper = helper
        self.process: subprocess.Popen[bytes] = helper.process
        self.fd_in = helper.fd_in
        self.fd_out = helper.fd_out
        helper.set_pipe_size(PIPE_BYTES)  # fewer, larger writes: each takes the interpreter lock again

    def run(
        self, head: dict[str, Any], body: bytes, timeout: float, longest: float = WORKER_LONGEST
    ) -> tuple[dict[str, Any], bytes]:
        """Send the document and read the answer, within *timeout* of the worker's processor time and
        *longest* on the clock (:class:`gateway.helpers.budget.Budget`; from the start of the sending, which a
        starved worker slows down too)."""
        budget = self.helper.budget(timeout, longest, time.monotonic())
        try:
            _write_frame(self.fd_in, head, body)
        except OSError as exc:
            raise _WorkerLostError(f"could not be sent: {exc}", sent=False) from None
        try:
            wait_readable(self.fd_out, budget)
            answer, payload = _read_answer(self.fd_out, time.monotonic() + timeout)
        except OverloadedError as exc:
            raise _WorkerBusyError(str(exc)) from None
        except TimeoutError:
            raise _WorkerLostError(f"took more than {timeout:g} s of the processor", sent=True) from None
        except (EOFError, OSError, ValueError) as exc:
            why = f"ended its worker ({type(exc).__name__}, exit code {self.process.poll()})"
            raise _WorkerLostError(why, sent=True) from None
        if not isinstance(answer, dict):
            raise _WorkerLostError("got an answer that is not an object", sent=True)
        return answer, payload

    def kill(self) -> None:
        self.helper.kill()


class IntakeWorkers:
    """The worker processes of the gateways of this process that share one configuration.

    :meth:`take_in` runs on a thread of the gateway's (never on the event loop) and blocks it for the
    document's intake; it returns None, and starts the workers, when none is ready.
    """

    _shared: SharedHelpers[IntakeWorkers] = SharedHelpers()

    @classmethod
    def shared(cls, assembly: Any, limits: Any, *, workers: int) -> IntakeWorkers | None:
        """The workers for *assembly* (one set per configuration in this process, stopped when it exits); None
        when its settings cannot be rebuilt in another process or *workers* is 0."""
        settings = assembly.settings
        if workers <= 0 or settings.source is None or not hasattr(os, "fork"):
            return None
        from gateway.intake.xmlsafe import LIMIT_FIELDS

        init = {
            "source": settings.source,
            "config_path": str(settings.config_path) if settings.config_path is not None else None,
            "base_dir": str(settings.base_dir),
            "registry": assembly.registry.registrations(),
            "limits": {name: getattr(limits, name) for name in LIMIT_FIELDS},
        }
        try:
            key = json.dumps([init, workers], sort_keys=True, default=str)
        except ValueError:  # a circular mapping: not from YAML
            return None

        def make() -> IntakeWorkers:
            made = cls(init, fingerprint(assembly.registry, assembly.routes), workers)
            made._key = key
            return made

        return cls._shared.acquire(key, make)

    def release(self) -> None:
        """One gateway of :meth:`shared` is done with the workers: the last one stops them."""
        self._shared.release(self._key, self)

    def __init__(
        self,
        init: dict[str, Any],
        fingerprint: str,
        workers: int,
        *,
        timeout: float = WORKER_TIMEOUT,
        longest: float = WORKER_LONGEST,
        memory: int = WORKER_MEMORY,
    ) -> None:
        self.init = {**init, "memory": memory}
        self.fingerprint = fingerprint
        self.workers = workers
        self.timeout = timeout
        self.longest = longest
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._alive = 0  # ready, busy or starting
        self._all: set[_Worker] = set()
        self._failed_at = float("-inf")
        self._stopped = False
        self._key = ""
        #: documents taken in by a worker; refused for its bounds; taken in on a thread (no worker ready);
        #: answered 503 since their worker got too little of the processor
        self.counts = {"worker": 0, "refused": 0, "thread": 0, "busy": 0}

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start workers in the background until there are :attr:`workers` (unless one failed lately)."""
        with self._lock:
            if self._stopped or time.monotonic() - self._failed_at < RESTART_INTERVAL:
                return
            missing = self.workers - self._alive
            self._alive += max(0, missing)
        for _ in range(missing):
            threading.Thread(target=self._launch, name="b2bgw-intake-worker", daemon=True).start()

    def _launch(self) -> None:
        worker = None
        try:
            # a process group of its own (a terminal's ^C is for the serving process, which stops it), not a
            # session: Linux's autogroups give each session an equal share of the CPUs whatever its nice value,
            # so a worker in a session of its own would weigh as much as the whole serving process
            worker = _Worker(HelperProcess("gateway.exchange.intake_workers", process_group=True))
            answer, _ = worker.helper.handshake(lambda fd: _write_frame(fd, self.init), _read_answer, 300)
            if answer.get("fingerprint") != self.fingerprint:
                raise ValueError(answer.get("error") or "its schemas and routes differ from the serving process's")
        except (OSError, ValueError, EOFError, TimeoutError) as exc:
            log.warning("an intake worker did not start (large documents are taken in on threads): %s", exc)
            if worker is not None:
                worker.kill()
            with self._lock:
                self._alive -= 1
                self._failed_at = time.monotonic()
            return
        with self._lock:
            if self._stopped:
                worker.kill()
                return
            self._all.add(worker)
        log.info("intake worker ready (pid %d)", worker.process.pid)
        self._idle.put(worker)

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._all.discard(worker)
            self._alive -= 1
        self.start()

    @property
    def idle(self) -> int:
        """Workers ready and waiting for a document."""
        return self._idle.qsize()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            workers, self._all = list(self._all), set()
        for worker in workers:
            worker.kill()

    # ----------------------------------------------------------------- documents

    def take_in(
        self, partner_id: str, body: bytes, charset: str | None, header: str | None, *, busy: bool, facts: str
    ) -> tuple[dict[str, Any], bytes] | None:
        """A worker's intake of *body*: its answer (``ok``: what the intake made of it, the byte strings in
        the payload; ``error``: the error as :func:`error_to_data` gives it), or None when no worker is ready
        (the caller takes the document in itself). Raises the refusal when the document ends its worker."""
        while True:
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                self.start()
                self.counts["thread"] += 1
                return None
            if worker.process.poll() is None:
                break
            self._discard(worker)  # it died while waiting: another starts
        head = {"partner": partner_id, "charset": charset, "header": header, "busy": busy, "facts": facts}
        try:
            answer = worker.run(head, body, self.timeout, self.longest)
        except _WorkerBusyError as busy:
            self._discard(worker)
            self.counts["busy"] += 1
            log.warning("a large document's intake had %s (the machine is overloaded); its worker was stopped", busy)
            raise GatewayBusyError(
                "The gateway is too busy to take this document in now; nothing was accepted. Send it again in "
                f"{GatewayBusyError.default_retry_after} s."
            ) from None
        except _WorkerLostError as lost:
            self._discard(worker)
            if not lost.sent:  # it died before it had the document: not the document's doing
                self.counts["thread"] += 1
                return None
            self.counts["refused"] += 1
            raise _refused(str(lost)) from None
        if answer[0].get("refused"):  # it ran out of memory: answered, then exits
            self._discard(worker)
            self.counts["refused"] += 1
            raise _refused(f"ran out of memory ({answer[0]['refused']})")
        self._idle.put(worker)
        self.counts["worker"] += 1
        return answer


def fingerprint(registry: Any, routes: Any) -> str:
    """What the serving process and a worker must agree on: the schemas and the routes."""
    return json.dumps(
        [
            registry.registrations(),
            [[r.id, r.root, r.schema, r.doc_type, r.request_reply, len(r.properties)] for r in routes],
        ],
        sort_keys=True,
        default=str,
    )


# --------------------------------------------------------------------------- the worker process


def _build(init: dict[str, Any]) -> Any:
    """The intake stages of the serving process's configuration (without its state)."""
    from gateway.config.loader import settings_from_mapping
    from gateway.exchange.stages import IntakeStages
    from gateway.intake.schemas import SchemaRegistry
    from gateway.intake.xmlsafe import IntakeLimits
    from gateway.routing.partners import PartnerRegistry
    from gateway.routing.route_compiler import compile_routes

    config_path = Path(init["config_path"]) if init["config_path"] else None
    settings = settings_from_mapping(init["source"], config_path=config_path, base_dir=Path(init["base_dir"]))
    registry = SchemaRegistry.from_registrations(init["registry"])  # each schema compiled when first used
    partners = PartnerRegistry.from_settings(settings)
    # the serving process checked the routes' paths against the schemas (xmlschema: seconds): not again
    routes, errors = compile_routes(settings, registry, partners, check_paths=False)
    if errors:
        raise ValueError(f"the routes did not compile: {errors[0]}")
    return IntakeStages(registry, routes, IntakeLimits(**init["limits"]))


def _take_in(stages: Any, head: dict[str, Any], body: bytes) -> tuple[dict[str, Any], bytes]:
    """One document through the stages; the answer's JSON part and byte strings."""
    result = stages.run(
        head["partner"], body, head["charset"], head["header"], False, busy=bool(head["busy"]), facts=head["facts"]
    )
    parts: list[bytes] = []
    sizes: dict[str, int] = {}
    own_document = result.document == received_document(body)
    for name, value in (
        ("text", None if result.text_is_document else result.text.encode("utf-8")),
        ("document", None if own_document else result.document),
        ("rules", result.rules if isinstance(result.rules, bytes) else None),
    ):
        if value is not None:
            sizes[name] = len(value)
            parts.append(value)
    ok = {
        "route": result.route.id,
        "doc_id": result.doc_id,
        "key": result.key,
        "digest": result.digest,
        "party": result.party,
        "properties": result.properties,
        "own": result.text_is_document,
        "sizes": sizes,
        "facts": result.facts,
        "facts_deferred": result.facts_deferred,
    }
    return {"ok": ok}, b"".join(parts)


def _worker_main() -> None:
    """A worker: rebuild the stages from the start frame, then take documents in until EOF."""
    fin, fout = helper_pipes(nice=WORKER_NICE, ignore_interrupts=True)  # the serving process stops it
    try:
        init, _ = read_frame(fin, max_head=1 << 30, max_payload=MAX_ANSWER_BYTES)
        stages = _build(init)
    except (EOFError, OSError):
        return
    except Exception as exc:  # told to the serving process
        _write_frame(fout, {"error": clip(f"{type(exc).__name__}: {exc}", 2000)})
        return
    _write_frame(fout, {"fingerprint": fingerprint(stages.registry, stages.routes)})
    limit_address_space(int(init.get("memory", WORKER_MEMORY)))
    while True:
        try:
            head, body = read_frame(fin, max_head=64 * 1024, max_payload=1 << 31)
        except (EOFError, OSError):
            return
        try:
            answer, payload = _take_in(stages, head, body)
        except GatewayError as exc:
            answer, payload = {"error": error_to_data(exc)}, b""
        except (MemoryError, RecursionError) as exc:
            del body
            try:
                _write_frame(fout, {"refused": type(exc).__name__})
            except OSError:
                pass
            return  # its state is not to be trusted any more
        except Exception as exc:  # a bug: say what kind, never what the document held
            print(f"gateway.exchange.intake_workers: the intake failed: {type(exc).__name__}", file=sys.stderr)
            answer, payload = {"error": {"type": "bug"}}, b""
        del body
        try:
            _write_frame(fout, answer, payload)
        except OSError:  # the serving process is gone
            return


if __name__ == "__main__":
    _worker_main()
