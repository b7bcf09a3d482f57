"""The gateway's work for one document, independent of HTTP.

:meth:`Gateway.submit` takes an authenticated partner's request body and
returns an :class:`Outcome` (a receipt, or a reply) or raises a typed
:class:`~gateway.errors.GatewayError`:

1. parse (hardened intake) -> :meth:`RouteTable.select` (422 / 403) ->
   validate against the route's schema (lxml; the full report of an invalid
   document in a helper process, within a time budget: see below) ->
   extract the document id and properties -> transform (XSLT) if the route
   says so;
2. idempotency: a document's key is, per partner, its ``Idempotency-Key``;
   else the values of the route's own key XPaths; else its document type and
   id, with its sender party when its type has one
   (:data:`gateway.routes.SENDER_PARTIES`: two buyers' orders relayed through
   one account may share a number). A document posted again under a key
   already taken gets the first answer again, and nothing is enqueued, if it
   is the same document: the same digest (SHA-256 of the body as received,
   kept in the ledger). Another document under a taken key is refused with
   :class:`~gateway.errors.IdempotencyConflictError` (409) naming the first;
   it never gets the first one's receipt or reply. The ledger's unique key
   decides: the insert of a duplicate fails its commit (message included)
   and the document is answered from the row that holds the key. Keys this
   process accepted lately are remembered with their digests, so the usual
   replay (a client retrying against the same gateway) skips the doomed
   insert and its cost (a refused insert fails the whole group commit, which
   the store then redoes one operation at a time) -- a database read per
   request would cost more than that on the hot path. Rows written before
   the ledger kept digests are compared by their stored document instead;
   and for :data:`LEGACY_KEY_WINDOW` after the newest of them, a document
   whose key now has its sender party is also checked against the key it had
   before (the recent ones are read once, at start), so that a retry across
   the upgrade is still a replay. Once retention has purged a document
   (``ledger.retention``), its tombstone keeps holding its key: the ledger
   insert refuses it, and the document is answered with
   :class:`~gateway.errors.ArchivedReplayError` (409, the same document) or
   the conflict (another one), never accepted as new;
3. one-way: the message is sent in a transacted session and committed with
   the ledger insert (``in_transaction``): the receipt is returned only once
   both are durable. Request-reply: the route's long-lived
   :class:`broker_core.Requestor` sends it (ledger insert in the same
   commit) and waits up to the route's timeout; the reply is recorded in the
   ledger (status ``replied``, or ``failed`` for a reply carrying
   ``B2BError``) as it is returned (the write is not awaited: it would add
   a commit to every round trip; until it lands the reply is kept in memory
   for replays and GET). No reply in time:
   :class:`~gateway.errors.ReplyTimeoutError` (504), and a reply that comes
   later is still recorded (``on_late_reply``), so ``GET`` shows it.

Everything done with the parsed tree (parse, route, validate, document id,
properties, transform, warehouse facts) runs in four stages, and the tree is
freed after the last: on the event loop by default (bodies up to
:data:`INLINE_MAX_BYTES`), where the documents that arrived together (up to
:data:`INTAKE_BATCH` of them, :data:`INTAKE_BATCH_BYTES` in all) go through the stages together, each stage for all of
them before the next, so that the parser's, the schema's and the extractor's
code and data stay in the CPU's caches across the burst; or on one of
``server.intake_threads`` intake
threads, where libxml2 parses and validates without holding the GIL while the
event loop serves HTTP and the broker. Measured on this project's two-core
machine, the threads win when other work keeps the cores busy and lose on a
machine the gateway has to itself (every hand-over then wakes a sleeping core),
hence 0 by default. Bodies over :data:`INLINE_MAX_BYTES` always go to the
default executor, so one 10 MB document does not hold up the small ones.

Validation and its error report are bounded whatever a document holds. Bodies up to
:data:`TREE_VALIDATION_MAX_BYTES` are validated on their tree (the report of its errors costs, per error, a
walk of the siblings before it: small at this size); larger ones are validated while they are parsed
(:func:`gateway.xmlintake.parse_and_validate`: a constant cost per error, their number capped) and never
on the event loop. The full report of an invalid document is worked out in a helper process and waited for
``server.explain_timeout`` at most (:class:`gateway.explainer.Explainer`); then libxml2's errors answer.

Document work holds up the other threads (the store's writer, its heartbeats and housekeeping, the event
loop) only briefly: lxml parses and validates without the interpreter lock, passes over a long text go a
megabyte at a time, xmlschema runs in another process. The bound: a thread that needs the lock waits for
document work at most the interpreter's switch interval (5 ms) plus one such slice (a few milliseconds), or
the release of a large parsed tree, which libxml2 does under the lock (about 1 ms per 10,000 nodes, tens of
milliseconds at ``max_elements``). tests/gateway/test_bounded_slices.py measures a commit's latency and the
longest gap of a 1 ms ticker while hostile documents go through.

The warehouse facts are the one stage the intake can leave out: the nightly
load extracts them from the stored XML, with the same extractor and the same
result, when a document has none. ``server.intake_facts`` says when they are
made at intake: ``always``; ``when_idle`` (the default): unless the intake is
saturated, :data:`INTAKE_BUSY` documents or more waiting for it together (a
batch of that many on the event loop, or that many queued for the intake
threads), when a burst is better served by accepting more documents than by
saving the night some work (the facts take about a quarter of the CPU an
accepted order costs); or ``never``.
"""

from __future__ import annotations

import asyncio
import codecs
import collections
import concurrent.futures
import hashlib
import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from lxml import etree

from broker_core import (
    Broker,
    Message,
    Requestor,
    RequestTimeoutError,
    StoreUnavailableError as BrokerStoreUnavailable,
    XMLMessage,
)

from .assemble import Assembly
from .config import INTAKE_FACTS
from .errors import (
    ArchivedReplayError,
    BackendError,
    DocumentArchivedError,
    GatewayError,
    IdempotencyConflictError,
    NotFoundError,
    ReplyTimeoutError,
    StoreUnavailableError,
    clip,
)
from .explainer import Explainer
from ledger_contract import facts as warehouse_facts
from .ledger import DuplicateDocument, Ledger, LedgerRecord, NewDocument, Tombstone, now_ms
from .partners import Partner
from .routes import Route
from .rules import RulesRunner, violation, warnings_of
from .schematron import document_utf8
from .xmlintake import Validated, parse_and_validate, parse_document, parse_document_text

__all__ = ["Gateway", "Outcome", "INLINE_MAX_BYTES", "DOCUMENTS_PATH", "LEGACY_KEY_WINDOW", "document_digest",
           "iso_ms"]

log = logging.getLogger(__name__)

#: Bodies up to this size are parsed and validated by the intake threads; larger ones in the default executor.
INLINE_MAX_BYTES = 256 * 1024
#: Bodies up to this size are validated on their tree, and may be taken in on the event loop. The report of a
#: tree's validation errors walks, for each error, the siblings before its element: a cost that grows with the
#: square of the document in the worst case (milliseconds at this size, seconds at ten times it). Larger bodies
#: are validated while they are parsed (each error a constant cost, their number capped), off the event loop.
TREE_VALIDATION_MAX_BYTES = 24 * 1024
#: Threads that parse, validate and extract (0: on the event loop).
INTAKE_THREADS = 0
#: The most documents the event loop takes through the intake's stages together...
INTAKE_BATCH = 32
#: ... and the most bytes of them (beyond the first): it bounds the trees alive at once.
INTAKE_BATCH_BYTES = 1024 * 1024
#: This many documents waiting for the intake together make it saturated: ``intake_facts: when_idle`` then leaves
#: their warehouse facts to the nightly load.
INTAKE_BUSY = 4
#: Where a document's status lives (``DOCUMENTS_PATH + message_id``).
DOCUMENTS_PATH = "/v1/documents/"
#: The property a back end sets on a reply to say it failed (its value: why).
ERROR_PROPERTY = "B2BError"
#: At most this many timed-out requests per route wait for a late reply.
MAX_LATE = 100_000
#: For this long (s) after the newest ledger row without a digest (accepted before the ledger kept them, under
#: a key without the sender party), a document is also checked against the key it would have had then: a
#: client's retry of a document accepted just before the upgrade is still a replay.
LEGACY_KEY_WINDOW = 7 * 24 * 3600
#: The most keys of such rows kept in memory for that (the newest).
LEGACY_KEYS_MAX = 1_000_000


def document_digest(body: bytes) -> str:
    """The ledger's digest of a request body as received (the prefix names the algorithm).

    SHA-256 rather than BLAKE2: with the CPU's SHA instructions, which OpenSSL uses, it is the faster."""
    return "sha256:" + hashlib.sha256(body).hexdigest()


class _RandomPool(threading.local):
    """Random bytes fetched 4 KiB at a time (one ``getrandom`` system call per 256 ids, not per id)."""

    data = b""
    pos = 0


_RANDOM = _RandomPool()
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


def uuid4_str() -> str:
    """``str(uuid.uuid4())``, the same randomness (``os.urandom``), about a third of the cost."""
    pool = _RANDOM
    pos = pool.pos
    if pos >= len(pool.data):
        pool.data = os.urandom(4096)
        pos = 0
    pool.pos = pos + 16
    h = "%032x" % (int.from_bytes(pool.data[pos:pos + 16], "big") & _UUID4_CLEAR | _UUID4_SET)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _receipt_json(receipt: dict[str, Any]) -> str:
    """Compact JSON (values are str or None)."""
    return orjson.dumps(receipt).decode("utf-8")


_ISO_SECOND: tuple[int, str] = (-1, "")  # the last second formatted (receipts come many to the second)


def iso_ms(epoch_ms: int | None) -> str | None:
    """``2024-03-14T09:30:00.123Z`` from epoch milliseconds."""
    global _ISO_SECOND
    if epoch_ms is None:
        return None
    seconds, ms = divmod(int(epoch_ms), 1000)
    last = _ISO_SECOND
    if last[0] != seconds:
        last = _ISO_SECOND = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))
    return f"{last[1]}.{ms:03d}Z"


@dataclass
class Outcome:
    """What :meth:`Gateway.submit` answers: a receipt (one-way, 202) or a reply (request-reply, 200)."""

    message_id: str
    correlation_id: str
    route: str
    receipt: dict[str, Any]
    reply: bytes | None = None
    reply_type: str | None = None
    replayed: bool = False
    #: the receipt as JSON text, as the ledger holds it, when it is at hand (the HTTP answer's body)
    receipt_json: str | None = None

    @property
    def status_url(self) -> str:
        return DOCUMENTS_PATH + self.message_id


@dataclass(slots=True)
class _Intake:
    """What :meth:`Gateway._intake` made of a request body."""

    route: Route
    doc_id: str | None
    key: str
    digest: str
    known: str | None  # the message id when the key was accepted lately (nothing else is filled in then)
    party: str | None = None  # the sender party in the key
    legacy: str | None = None  # the key it had before the sender party was part of it, when a recent row has it
    properties: dict[str, Any] | None = None
    text: str | None = None
    document: bytes | None = None
    facts: str | None = None
    text_is_document: bool = False  # text is the document's own (UTF-8) text: document is its encoding
    facts_deferred: bool = False  # facts left to the nightly load (the intake was saturated)
    rules: Any = None  # the business rules running (a future of the findings), or the document for them (bytes)


@dataclass(slots=True)
class _Work:
    """One request body on its way through the intake's stages (:meth:`Gateway._intake`)."""

    partner: Partner
    body: bytes
    charset: str | None
    idempotency_key: str | None
    check_recent: bool
    on_loop: bool = False  # the event loop's batched intake (an invalid document's details go to a thread)
    busy: bool = False  # the intake is saturated (see INTAKE_BUSY)
    root: etree._Element | None = None
    decoded: str | None = None
    route: Route | None = None
    result: _Intake | None = None
    rules: Any = None  # the business rules' future, or the document for them (see _validate_stage)
    validated: Validated | None = None  # a larger body's validation, made while parsing it


class _Invalid(Exception):
    """Raised by the event loop's intake for a document its schema refuses: :meth:`Gateway.submit`
    works out the errors in a thread."""

    def __init__(self, work: _Work) -> None:
        super().__init__("invalid")
        self.work = work


@dataclass
class _Exchange:
    """A request-reply route's requestor and the requests it may still get replies to."""

    route: Route
    requestor: Requestor
    # correlation id -> [the message while waiting, then its message id; deadline for a late reply
    # (monotonic), None while waiting]
    open: dict[str, list[Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Gateway:
    """Accepts documents for one broker, with the routes, schemas and partners of an :class:`Assembly`."""

    def __init__(self, assembly: Assembly, broker: Broker, *, late_reply_window: float | None = None,
                 inline_max_bytes: int = INLINE_MAX_BYTES, duplicate_poll: float = 0.05,
                 recent_keys: int = 100_000, intake_threads: int = INTAKE_THREADS,
                 intake_facts: str = "when_idle") -> None:
        if intake_facts not in INTAKE_FACTS:
            raise ValueError(f"intake_facts must be one of {', '.join(INTAKE_FACTS)}, not {intake_facts!r}")
        store = broker.store
        if getattr(store, "engine", None) is None:
            raise GatewayError("the gateway needs a SQL store (sqlite:///PATH or postgresql+psycopg://...)")
        self.assembly = assembly
        self.settings = assembly.settings
        self.registry = assembly.registry
        self.routes = assembly.routes
        self.partners = assembly.partners
        self.broker = broker
        self.store = store
        self.ledger = Ledger(store.engine)
        self.limits = assembly.settings.limits
        self.late_reply_window = (assembly.settings.late_reply_window if late_reply_window is None
                                  else late_reply_window)
        self.inline_max_bytes = inline_max_bytes
        self._batch: list[tuple[_Work, asyncio.Future[_Intake]]] = []  # waiting for the event loop's intake
        self._stages = (self._parse_stage, self._validate_stage, self._extract_stage, self._facts_stage)
        self.duplicate_poll = duplicate_poll
        self._connection: Any = None
        self._sessions: collections.deque[tuple[Any, Any]] = collections.deque()
        # idempotency key -> (message id, digest) of documents this process accepted lately (a replay then skips
        # the insert that the unique key would refuse: a refused insert fails its whole group commit, which the
        # store then redoes one operation at a time)
        self._recent: collections.OrderedDict[str, tuple[str, str]] = collections.OrderedDict()
        # the keys of recent ledger rows without a digest (see LEGACY_KEY_WINDOW), until _legacy_until (epoch s)
        self._legacy_keys: frozenset[str] | None = None
        self._legacy_until = 0.0
        # message id -> (status, reply, reply type, error) of replies whose ledger write is under way
        self._unrecorded: dict[str, tuple[str, bytes, str | None, str | None]] = {}
        self.recent_keys = recent_keys
        self._exchanges: dict[str, _Exchange] = {}
        # parse, validate, facts: off the event loop (libxml2 runs without the GIL, on another core)
        self._intake_pool = (concurrent.futures.ThreadPoolExecutor(intake_threads, thread_name_prefix="b2bgw-intake")
                             if intake_threads > 0 else None)
        self._intake_threads = intake_threads
        self._in_pool = 0  # documents running or queued on the intake threads
        # the full error reports of invalid documents: worked out in a helper process, within a time budget
        settings = assembly.settings
        self.explainer = (Explainer.shared(self.registry, self.limits, timeout=settings.explain_timeout,
                                           workers=settings.explain_workers)
                          if getattr(settings, "explain_workers", 1) > 0 and hasattr(os, "fork") else None)
        self._schemas_by_root: dict[str, tuple[str, Any]] = {}
        self.intake_facts = intake_facts
        #: documents whose warehouse facts were left to the nightly load (``when_idle`` under saturation)
        self.facts_deferred = 0
        # business rules (gateway.rules): worker processes, when a route applies a rule set
        self.rules = (RulesRunner(assembly.rules, workers=self.settings.rules_workers,
                                  seconds=self.settings.rules_seconds,
                                  memory_mb=self.settings.rules_worker_memory_mb)
                      if any(route.rules for route in self.routes) else None)
        self._started = False
        self._closed = False

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Connect to the broker and open one requestor per request-reply route."""
        if self._started:
            return
        self._load_legacy_keys()
        if self.rules is not None:
            self.rules.start()
        self._connection = self.broker.connect()
        self._connection.start()
        for route in self.routes:
            if route.request_reply:
                session = self._connection.create_session(False)

                def late(reply: Message, _route: Route = route) -> None:
                    self._late_reply(self._exchanges[_route.id], reply)

                requestor = Requestor(session, route.destination, on_late_reply=late)
                self._exchanges[route.id] = _Exchange(route, requestor)
        self._started = True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for exchange in self._exchanges.values():
            exchange.requestor.close()
        if self._connection is not None:
            self._connection.close()
        if self._intake_pool is not None:
            self._intake_pool.shutdown(wait=False)
        if self.rules is not None:
            self.rules.close()

    def _load_legacy_keys(self) -> None:
        """Read the keys of the rows accepted without a digest within :data:`LEGACY_KEY_WINDOW` (none once
        the ledger has kept digests that long: an index range of those rows alone)."""
        rows = self.ledger.undigested_keys(now_ms() - LEGACY_KEY_WINDOW * 1000, LEGACY_KEYS_MAX)
        if not rows:
            self._legacy_keys = None
            return
        self._legacy_keys = frozenset(key for key, _ in rows)
        self._legacy_until = rows[0][1] / 1000 + LEGACY_KEY_WINDOW
        if len(rows) == LEGACY_KEYS_MAX:
            log.warning("%d documents accepted before the ledger kept digests are recent; retries of older ones "
                        "are checked by their own key only", len(rows))
        log.info("checking documents against the keys of %d recent documents accepted before the ledger kept "
                 "digests, until %s", len(rows), iso_ms(int(self._legacy_until * 1000)))

    @property
    def ready(self) -> bool:
        return self._started and not self._closed and not self.broker.closed

    def _session(self) -> tuple[Any, Any]:
        if self._sessions:
            return self._sessions.pop()
        session = self._connection.create_session(True)
        return session, session.create_producer(None)

    # ----------------------------------------------------------------- submitting

    async def submit(
        self,
        partner: Partner,
        body: bytes,
        *,
        charset: str | None = None,
        correlation_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> Outcome:
        """Accept one document (see the module docstring); raises a GatewayError subclass when refused."""
        received_at = now_ms()
        if self._intake_pool is not None and len(body) <= self.inline_max_bytes:
            self._in_pool += 1
            busy = self._in_pool >= self._intake_threads + INTAKE_BUSY  # that many queued behind the threads
            try:
                intake = await asyncio.get_running_loop().run_in_executor(
                    self._intake_pool, self._intake, partner, body, charset, idempotency_key, True, busy)
            finally:
                self._in_pool -= 1
        elif len(body) <= min(self.inline_max_bytes, TREE_VALIDATION_MAX_BYTES):
            try:
                intake = await self._intake_on_loop(_Work(partner, body, charset, idempotency_key,
                                                           check_recent=True, on_loop=True))
            except _Invalid as invalid:
                await asyncio.to_thread(self._explain_invalid, invalid.work)
                raise GatewayError("validation failed without errors") from None  # pragma: no cover
        else:  # a larger document would hold the event loop or an intake thread for long: the default executor
            intake = await asyncio.to_thread(self._intake, partner, body, charset, idempotency_key, True)
        if intake.known is not None:  # accepted by this process lately, the same document: replay, no insert
            before = self._unrecorded.get(intake.known)
            existing = await asyncio.to_thread(self.ledger.get, intake.known)
            if existing is not None:
                return await self._replay(self._with_unrecorded(existing, before))
            intake = await asyncio.to_thread(self._intake, partner, body, charset, idempotency_key, False)
        if intake.legacy is not None:
            answer = await self._legacy_duplicate(partner, intake, body)
            if answer is not None:
                return answer
        route, doc_id, key, digest = intake.route, intake.doc_id, intake.key, intake.digest
        warnings: list[dict[str, Any]] | None = None
        warning_count = 0
        if intake.rules is not None:  # the business rules ran meanwhile: failures refuse the document
            pending = intake.rules
            if isinstance(pending, bytes):  # an intake thread made the text: the event loop drives the workers
                pending = self.rules.submit(route.rules, pending)
            findings = await pending
            if any(f.is_error for f in findings):
                raise await asyncio.to_thread(violation, findings, body, lambda data: parse_document(
                    data, self.limits, declared_charset=charset))
            warning_count = len(findings)
            warnings = warnings_of(findings)
        properties, text, document, facts = intake.properties, intake.text, intake.document, intake.facts
        if intake.facts_deferred:
            self.facts_deferred += 1
        correlation = correlation_id or uuid4_str()

        # the document's bytes are the text's encoding as received: the store need not encode it again
        message = XMLMessage(text, utf8=document if intake.text_is_document else None)
        message.jms_type = route.doc_type
        message.set_string_property("JMSXUserID", partner.id)
        message.set_string_property("B2BRoute", route.id)
        if doc_id is not None:
            message.set_string_property("B2BDocumentID", doc_id)
        route.set_properties(message, properties)
        if route.rules:
            message.set_int_property("B2BRuleWarnings", warning_count)

        try:
            if route.request_reply:
                return await self._request_reply(route, partner, message, correlation, key, doc_id, document,
                                                 received_at, digest, facts, warnings)
            return await self._one_way(route, partner, message, correlation, key, doc_id, document, received_at,
                                       digest, facts, warnings)
        except DuplicateDocument:  # accepted before (another process, or long ago), or a concurrent twin won
            existing = await asyncio.to_thread(self.ledger.find, key)
            if existing is None:  # purged by retention since: its tombstone holds the key
                tombstone = await asyncio.to_thread(self.ledger.tombstone_for_key, key)
                if tombstone is None:  # pragma: no cover - the winner's row is committed before we fail
                    raise StoreUnavailableError() from None
                raise self._archived_duplicate(tombstone, intake, idempotency_key) from None
            return await self._duplicate(existing, intake, idempotency_key, body)
        except BrokerStoreUnavailable as exc:
            log.warning("store unavailable while accepting a document: %s", exc)
            raise StoreUnavailableError() from None

    def _intake(self, partner: Partner, body: bytes, charset: str | None, idempotency_key: str | None,
                check_recent: bool, busy: bool = False) -> _Intake:
        """Everything done with the parsed tree, in one call (an intake thread runs it): parse, route,
        validate, the document id and idempotency key, then (unless the key was accepted lately) the
        properties, message text, ledger document and warehouse facts. The tree never leaves this call."""
        work = _Work(partner, body, charset, idempotency_key, check_recent, busy=busy)
        for stage in self._stages:
            stage(work)
        assert work.result is not None
        return work.result

    def _intake_on_loop(self, work: _Work) -> "asyncio.Future[_Intake]":
        """:meth:`_intake` on the event loop, together with the other documents that arrive before it runs."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_Intake] = loop.create_future()
        self._batch.append((work, future))
        if len(self._batch) == 1:
            loop.call_soon(self._run_batch)
        return future

    def _run_batch(self) -> None:
        """Take the waiting documents (up to :data:`INTAKE_BATCH` and :data:`INTAKE_BATCH_BYTES`) through
        the stages, each stage for all of them before the next; a document that fails a stage gets its
        error and leaves."""
        take, size = 0, 0
        for work, _ in self._batch:
            size += len(work.body)
            if take and (take == INTAKE_BATCH or size > INTAKE_BATCH_BYTES):
                break
            take += 1
        batch, self._batch = self._batch[:take], self._batch[take:]
        if self._batch:
            asyncio.get_running_loop().call_soon(self._run_batch)
        if take >= INTAKE_BUSY:
            for work, _ in batch:
                work.busy = True
        for stage in self._stages:
            going_on = []
            for work, future in batch:
                if future.done():  # cancelled: the client went away
                    continue
                try:
                    stage(work)
                except Exception as exc:  # noqa: BLE001 - the request's own error (GatewayError...)
                    future.set_exception(exc)
                    continue
                going_on.append((work, future))
            batch = going_on
        for work, future in batch:
            future.set_result(work.result)
            work.root = None  # the tree is not needed any more

    def _parse_stage(self, work: _Work) -> None:
        if len(work.body) <= TREE_VALIDATION_MAX_BYTES:
            work.root, work.decoded = parse_document_text(work.body, self.limits, declared_charset=work.charset)
        else:  # validated against the schema of its root element as it is parsed (see TREE_VALIDATION_MAX_BYTES)
            work.validated = parse_and_validate(work.body, self._schema_for_root, self.limits,
                                                declared_charset=work.charset)
            if work.validated.root is not None:
                work.root, work.decoded = work.validated.root, work.validated.text
            else:  # invalid: the validating parse keeps no tree, and the route is chosen on one
                work.root, work.decoded = parse_document_text(work.body, self.limits, declared_charset=work.charset)
        work.route = self.routes.select(work.root, work.partner.id)

    def _schema_for_root(self, root_name: str) -> tuple[str, Any] | None:
        """The schema registered for a root element, as :func:`parse_and_validate` asks for it (XSD 1.0 only)."""
        known = self._schemas_by_root.get(root_name)
        if known is None:
            name = self.registry.for_root(root_name)
            xsd = self.registry.lxml_schema(name) if name is not None else None
            if xsd is None:
                return None
            known = self._schemas_by_root[root_name] = (name, xsd)  # registered roots only: a bounded map
        return known

    def _validate_stage(self, work: _Work) -> None:
        schema = work.route.schema
        if len(work.body) > TREE_VALIDATION_MAX_BYTES and (work.validated is None or work.validated.schema != schema):
            xsd = self.registry.lxml_schema(schema)  # the route names another schema than its root's
            if xsd is not None:
                work.validated = parse_and_validate(work.body, lambda _: (schema, xsd), self.limits,
                                                    declared_charset=work.charset)
        validated = work.validated
        if validated is not None and validated.schema == schema:
            if validated.errors:
                self._explain_invalid(work)
        elif not self.registry.is_valid(work.root, schema):
            if work.on_loop:  # the report takes milliseconds at least: not on the event loop
                raise _Invalid(work)
            self._explain_invalid(work)
        if work.route.rules:  # business rules: worker processes run them while the intake goes on (submit waits)
            data = document_utf8(work.root, work.body, work.decoded is not None)
            work.rules = self.rules.submit(work.route.rules, data) if work.on_loop else data

    def _explain_invalid(self, work: _Work) -> None:
        """Raise the SchemaValidationError of an invalid document: the full report when the helper process
        works it out in time (:class:`gateway.explainer.Explainer`), else libxml2's errors."""
        schema = work.route.schema
        report = None
        if self.explainer is not None and self.registry.lxml_schema(schema) is not None:
            report = self.explainer.explain(work.body, work.charset, schema)
        if report is not None:
            raise report
        validated = work.validated
        if validated is not None and validated.schema == schema and validated.errors:
            raise self.registry.streamed_error(schema, validated.errors, complete=validated.complete,
                                               nsmap=work.root.nsmap if work.root is not None else None)
        if self.registry.lxml_schema(schema) is not None and len(work.body) <= TREE_VALIDATION_MAX_BYTES:
            raise self.registry.libxml2_error(work.root, schema, source=work.body)
        self.registry.validate(work.root, schema, source=work.body)  # XSD 1.1: xmlschema's, as it always was
        raise GatewayError("validation failed without errors")  # pragma: no cover - validate raised

    def _extract_stage(self, work: _Work) -> None:
        route, root, body = work.route, work.root, work.body
        doc_id = route.extract_document_id(root)
        header = work.idempotency_key
        party = values = None
        if header is None:
            values = route.extract_key_values(root)
            if values is None:
                party = route.extract_sender_party(root)
        key = self.idempotency_key(work.partner.id, route, doc_id, header, party, values)
        digest = document_digest(body)
        if work.check_recent:
            known = self._recent.get(key)
            if known is not None:
                if known[1] != digest:
                    raise self._conflict(route, doc_id, party, header, known[0])
                work.result = _Intake(route, doc_id, key, digest, known[0])
                return
        legacy = None
        if self._legacy_keys is not None and doc_id is not None and (party is not None or values is not None):
            legacy = self._legacy_key(work.partner.id, route, doc_id)
        properties = route.extract(root)
        text, document, own = self._forms(body, root, work.decoded, route.apply_transform(root))
        work.result = _Intake(route, doc_id, key, digest, None, party, legacy, properties, text, document,
                              text_is_document=own, rules=work.rules)

    def _facts_stage(self, work: _Work) -> None:
        if work.result.known is not None or self.intake_facts == "never":
            return
        if work.busy and self.intake_facts == "when_idle":
            work.result.facts_deferred = work.route.doc_type in warehouse_facts.LOADED_TYPES
            return
        # what the warehouse keeps of it, from this very tree (None when not loaded or on any failure)
        work.result.facts = warehouse_facts.for_ledger(work.root, work.route.doc_type)

    def _remember(self, key: str, message_id: str, digest: str) -> None:
        recent = self._recent
        recent[key] = (message_id, digest)
        if len(recent) > self.recent_keys:
            recent.popitem(last=False)

    @staticmethod
    def idempotency_key(partner_id: str, route: Route, doc_id: str | None, header: str | None,
                        party: str | None = None, values: list[str] | None = None) -> str:
        """The ledger's idempotency key, per partner: from the header; else from the route's own key XPaths'
        *values*; else document type + id, with the sender *party* when there is one (a key without it is
        the one every document had before parties were part of it). A document that has none of these gets
        a key of its own: it is never a replay."""
        if header is not None:
            key = f"{partner_id}|key|{header}"
        elif values is not None:
            if not any(values):
                return f"{partner_id}|unique|{uuid4_str()}"
            key = f"{partner_id}|{route.root}|xpath|" + "|".join(f"{len(v)}:{v}" for v in values)
        elif doc_id is not None:
            key = (f"{partner_id}|{route.root}|{doc_id}" if party is None
                   else f"{partner_id}|{route.root}|{doc_id}|party={party}")
        else:
            return f"{partner_id}|unique|{uuid4_str()}"
        if len(key) > 500:
            key = f"{partner_id}|sha256|{hashlib.sha256(key.encode('utf-8')).hexdigest()}"
        return key

    def _legacy_key(self, partner_id: str, route: Route, doc_id: str) -> str | None:
        """The default key without the sender party, when a recent row without a digest holds it."""
        keys = self._legacy_keys
        if keys is None:
            return None
        if time.time() > self._legacy_until:
            self._legacy_keys = None
            return None
        legacy = self.idempotency_key(partner_id, route, doc_id, None)
        return legacy if legacy in keys else None

    def _conflict(self, route: Route, doc_id: str | None, party: str | None, header: str | None,
                  first: str) -> IdempotencyConflictError:
        if header is not None:
            basis = "its Idempotency-Key"
        elif route.key_xpaths is not None:
            basis = f"route {route.id}'s key XPaths"
        else:
            basis = f"{route.doc_type} {clip(doc_id or '', 60)!r}" + (f" from {clip(party, 60)}" if party else "")
        url = DOCUMENTS_PATH + first
        return IdempotencyConflictError(
            f"A different document with the same idempotency key ({basis}) was accepted before as {first}; this "
            f"one was not accepted. GET {url} shows the first. A new document needs its own document id (or "
            "Idempotency-Key); a correction of the first is sent as a change or cancellation document.",
            first_message_id=first, first_status_url=url,
        )

    def _archived_duplicate(self, tombstone: Tombstone, intake: _Intake, header: str | None) -> GatewayError:
        """The answer to a document whose key the tombstone of an archived (purged) document holds: never
        accepted again. Another document under that key is the conflict it would have been while the first
        was online; the same one (or one the first cannot be compared with: no digest) is told the first
        was archived. Its key is not remembered: nothing online answers it any more."""
        if tombstone.digest is not None and tombstone.digest != intake.digest:
            return self._conflict(intake.route, intake.doc_id, intake.party, header, tombstone.message_id)
        url = DOCUMENTS_PATH + tombstone.message_id
        archived = iso_ms(tombstone.purged_at)
        how = "archived" if tombstone.archived else "purged"
        return ArchivedReplayError(
            f"This document was accepted on {iso_ms(tombstone.received_at)} as {tombstone.message_id} and {how} on "
            f"{archived} under the ledger's retention policy; it was not accepted again. Do not resend it; ask "
            "the gateway's operator for the archived copy if you need it.",
            message_id=tombstone.message_id, status_url=url, received_at=iso_ms(tombstone.received_at) or "",
            archived_at=archived or "")

    async def _duplicate(self, existing: LedgerRecord, intake: _Intake, header: str | None,
                         body: bytes) -> Outcome:
        """The answer to a document whose key *existing* holds: the first answer when it is the same
        document, else :class:`IdempotencyConflictError`."""
        if existing.digest is not None:
            same = existing.digest == intake.digest
        else:  # accepted before the ledger kept digests: compare the document it stored
            stored = await asyncio.to_thread(self.ledger.get, existing.message_id, document=True)
            same = stored is not None and stored.document in (intake.document, body)
        if not same:
            raise self._conflict(intake.route, intake.doc_id, intake.party, header, existing.message_id)
        self._remember(intake.key, existing.message_id, intake.digest)
        return await self._replay(existing)

    async def _legacy_duplicate(self, partner: Partner, intake: _Intake, body: bytes) -> Outcome | None:
        """The answer to a document whose key before the upgrade (:attr:`_Intake.legacy`) a row without a
        digest holds, if it is that row's document or a variant of it from the same sender; None when that
        row is another party's document (accept this one under its own key)."""
        existing = await asyncio.to_thread(self.ledger.find, intake.legacy, document=True)
        if existing is None or existing.digest is not None or existing.document is None:
            return None
        first_key = await asyncio.to_thread(self._key_of_stored, partner, intake.route, existing.document)
        if first_key != intake.key:
            return None
        if existing.document not in (intake.document, body):
            raise self._conflict(intake.route, intake.doc_id, intake.party, None, existing.message_id)
        self._remember(intake.key, existing.message_id, intake.digest)
        return await self._replay(existing)

    def _key_of_stored(self, partner: Partner, route: Route, document: bytes) -> str | None:
        """The key a stored document has today (None if it no longer parses)."""
        try:
            root, _ = parse_document_text(document, self.limits)
        except GatewayError:
            return None
        values = route.extract_key_values(root)
        party = route.extract_sender_party(root) if values is None else None
        return self.idempotency_key(partner.id, route, route.extract_document_id(root), None, party, values)

    @staticmethod
    def _forms(body: bytes, root: etree._Element, decoded: str | None,
               transformed: str | None) -> tuple[str, bytes, bool]:
        """The message text (*transformed*, when the route has a transform), the ledger's document
        (UTF-8), and whether the text is the document's own, the document then being its encoding. A
        document received in UTF-8 is kept as received (without a byte order mark; *decoded*: its text,
        when the intake has decoded it already), any other is re-serialised."""
        if (root.getroottree().docinfo.encoding or "UTF-8").upper() == "UTF-8":
            document = body[3:] if body.startswith(codecs.BOM_UTF8) else body
            if transformed is not None:
                return transformed, document, False
            return (decoded if decoded is not None else document.decode("utf-8")), document, True
        document = etree.tostring(root.getroottree(), encoding="UTF-8", xml_declaration=True)
        text = transformed if transformed is not None else etree.tostring(root, encoding="unicode")
        return text, document, False

    def _receipt(self, route: Route, message_id: str, correlation: str, doc_id: str | None,
                 received_at: int, warnings: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        receipt = {
            "message_id": message_id,
            "correlation_id": correlation,
            "route": route.id,
            "document_type": route.doc_type,
            "document_id": doc_id,
            "status": "accepted",
            "received_at": iso_ms(received_at),
            "status_url": DOCUMENTS_PATH + message_id,
        }
        if warnings:  # business rule warnings (flag warning / information): accepted, but told
            receipt["warnings"] = warnings
        return receipt

    def _record(self, route: Route, partner: Partner, message_id: str, correlation: str, key: str,
                doc_id: str | None, document: bytes, received_at: int, receipt: dict[str, Any], digest: str,
                facts: str | None = None) -> NewDocument:
        return NewDocument(
            message_id=message_id, partner=partner.id, doc_type=route.doc_type, doc_namespace=route.doc_namespace,
            doc_id=doc_id, idempotency_key=key, correlation_id=correlation, route=route.id,
            destination=str(route.destination), received_at=received_at, document=document,
            receipt=_receipt_json(receipt),
            facts=facts, facts_version=warehouse_facts.VERSION if facts is not None else None, digest=digest,
        )

    async def _one_way(self, route: Route, partner: Partner, message: XMLMessage, correlation: str,
                       key: str, doc_id: str | None, document: bytes, received_at: int, digest: str,
                       facts: str | None = None, warnings: list[dict[str, Any]] | None = None) -> Outcome:
        message.jms_correlation_id = correlation
        session, producer = self._session()
        try:
            await producer.send_async(route.destination, message, delivery_mode=route.delivery_mode,
                                      priority=route.priority, time_to_live=route.time_to_live_ms)
            message_id = message.jms_message_id
            receipt = self._receipt(route, message_id, correlation, doc_id, received_at, warnings)
            record = self._record(route, partner, message_id, correlation, key, doc_id, document, received_at, receipt,
                                  digest, facts)
            ledger = self.ledger
            await session.commit_async(in_transaction=[lambda conn: ledger.insert(conn, record)])
            self._remember(key, message_id, digest)
        except BaseException:
            try:
                session.rollback()
            except Exception:  # pragma: no cover - the session is dropped below
                session = None
            raise
        finally:
            if session is not None:
                self._sessions.append((session, producer))
        return Outcome(message_id, correlation, route.id, receipt, receipt_json=record.receipt)

    async def _request_reply(self, route: Route, partner: Partner, message: XMLMessage, correlation: str,
                             key: str, doc_id: str | None, document: bytes, received_at: int, digest: str,
                             facts: str | None = None, warnings: list[dict[str, Any]] | None = None) -> Outcome:
        exchange = self._exchanges[route.id]
        with exchange.lock:
            self._expire_late(exchange)
            if correlation in exchange.open:  # replies are matched by correlation id: keep it unique
                correlation = f"{correlation}~{secrets.token_hex(4)}"
            exchange.open[correlation] = [message, None]
        message.jms_correlation_id = correlation
        ledger = self.ledger
        holder: dict[str, Any] = {}

        def record(conn: Any) -> None:
            message_id = message.jms_message_id
            receipt = self._receipt(route, message_id, correlation, doc_id, received_at, warnings)
            holder["receipt"] = receipt
            ledger.insert(conn, self._record(route, partner, message_id, correlation, key, doc_id, document,
                                             received_at, receipt, digest, facts))

        try:
            reply = await exchange.requestor.request_async(
                message, route.timeout, in_transaction=[record], delivery_mode=route.delivery_mode,
                priority=route.priority, time_to_live=route.time_to_live_ms,
            )
        except RequestTimeoutError:
            message_id = message.jms_message_id
            self._remember(key, message_id, digest)
            with exchange.lock:
                entry = exchange.open.get(correlation)
                if entry is not None:  # keep the id (not the message and its document) for a late reply
                    entry[0] = message_id
                    entry[1] = time.monotonic() + self.late_reply_window
            raise ReplyTimeoutError(
                f"No reply arrived within {route.timeout:g} s. The document was accepted as {message_id}; "
                f"GET {DOCUMENTS_PATH}{message_id} returns its status and the reply once it comes. Do not resend it.",
                message_id=message_id, correlation_id=correlation, status_url=DOCUMENTS_PATH + message_id,
            ) from None
        except BaseException:
            with exchange.lock:
                exchange.open.pop(correlation, None)
            raise
        with exchange.lock:
            exchange.open.pop(correlation, None)
        message_id = message.jms_message_id
        self._remember(key, message_id, digest)
        reply_bytes, reply_type, error = self._reply_parts(reply)
        self._record_reply(message_id, reply_bytes, reply_type, error, ("accepted", "delivered"))
        if error is not None:
            raise BackendError(
                f"The back end could not process the document: {error}",
                message_id=message_id, correlation_id=correlation, status_url=DOCUMENTS_PATH + message_id,
            )
        return Outcome(message_id, correlation, route.id, holder["receipt"], reply=reply_bytes, reply_type=reply_type)

    @staticmethod
    def _reply_parts(reply: Message) -> tuple[bytes, str | None, str | None]:
        text = getattr(reply, "text", None)
        error = reply.get_string_property(ERROR_PROPERTY) if reply.property_exists(ERROR_PROPERTY) else None
        if text is None:
            text = ""
            error = error or "the reply has no text body"
        return text.encode("utf-8"), (reply.jms_type or None), error

    # ----------------------------------------------------------------- late replies

    def _expire_late(self, exchange: _Exchange) -> None:
        """Forget timed-out requests whose late-reply window has passed, and the oldest of them beyond
        :data:`MAX_LATE` (call with the lock held)."""
        if len(exchange.open) < 64:
            return
        now = time.monotonic()
        stale = [c for c, (_, deadline) in exchange.open.items() if deadline is not None and deadline < now]
        for c in stale:
            del exchange.open[c]
        excess = len(exchange.open) - MAX_LATE
        if excess > 0:  # in insertion order: the oldest first
            for c in [c for c, (_, deadline) in exchange.open.items() if deadline is not None][:excess]:
                del exchange.open[c]

    def _late_reply(self, exchange: _Exchange, reply: Message) -> None:
        """A reply came after its request timed out: record it (runs in the replier's thread)."""
        correlation = reply.jms_correlation_id
        with exchange.lock:
            entry = exchange.open.pop(correlation, None) if correlation else None
        target = None if entry is None else entry[0]
        message_id = target if isinstance(target, str) or target is None else target.jms_message_id
        if message_id is None:
            log.warning("route %s: a reply (correlation id %r) matches no request of this gateway; dropped",
                        exchange.route.id, (correlation or "")[:100])
            return
        reply_bytes, reply_type, error = self._reply_parts(reply)
        self._record_reply(message_id, reply_bytes, reply_type, error, ("accepted", "delivered", "dead_lettered"))
        log.info("recording a late reply to %s (route %s)", message_id, exchange.route.id)

    def _record_reply(self, message_id: str, reply: bytes, reply_type: str | None, error: str | None,
                      from_statuses: tuple[str, ...]) -> None:
        """Record a reply in the ledger without waiting for the commit (any thread).

        The HTTP answer does not wait for this write (it would add a commit to every round trip); until it
        lands, the reply is kept in memory so a replay or a GET of the document already sees it."""
        status = "failed" if error is not None else "replied"
        ledger = self.ledger
        self._unrecorded[message_id] = (status, reply, reply_type, error)

        def done(err: BaseException | None) -> None:
            self._unrecorded.pop(message_id, None)
            if err is not None:
                log.error("could not record the reply to %s: %s", message_id, err)

        try:
            self.store.commit((), (), [lambda conn: ledger.transition(
                conn, message_id, status, from_statuses=from_statuses, reply=reply, reply_type=reply_type,
                error=error)], done)
        except Exception as exc:  # noqa: BLE001 - the store is closing: the reply is only in memory now
            self._unrecorded.pop(message_id, None)
            log.error("could not record the reply to %s: %s", message_id, exc)

    def _with_unrecorded(self, record: LedgerRecord, before: Any = None) -> LedgerRecord:
        """*record* with a reply that is still on its way to the ledger (*before*: what was pending before
        the record was read, in case the write landed between the read and now)."""
        pending = self._unrecorded.get(record.message_id) or before
        if pending is not None and record.reply is None:
            record.status, record.reply, record.reply_type, record.error = pending
            if record.history is not None:
                record.history.append((record.status, now_ms()))
        return record

    # ----------------------------------------------------------------- replays

    async def _replay(self, record: LedgerRecord) -> Outcome:
        """The first answer to a document accepted before (same idempotency key)."""
        record = self._with_unrecorded(record)
        route = self.routes.get(record.route)
        receipt = json.loads(record.receipt) if record.receipt else {  # the receipt _receipt made
            "message_id": record.message_id, "correlation_id": record.correlation_id, "route": record.route,
            "document_type": record.doc_type, "document_id": record.doc_id, "status": "accepted",
            "received_at": iso_ms(record.received_at), "status_url": DOCUMENTS_PATH + record.message_id,
        }
        request_reply = route.request_reply if route is not None else record.reply is not None
        if request_reply and record.reply is None:
            timeout = route.timeout if route is not None else 0.0
            deadline = record.received_at / 1000 + timeout
            while record.reply is None and time.time() < deadline:  # the first request may still be waiting
                await asyncio.sleep(self.duplicate_poll)
                before = self._unrecorded.get(record.message_id)
                fresh = await asyncio.to_thread(self.ledger.get, record.message_id)
                if fresh is None:  # pragma: no cover - ledger rows are never deleted
                    break
                record = self._with_unrecorded(fresh, before)
            if record.reply is None:
                raise ReplyTimeoutError(
                    f"This document was accepted before as {record.message_id} and no reply has come yet; "
                    f"GET {DOCUMENTS_PATH}{record.message_id} returns its status and the reply once it comes.",
                    message_id=record.message_id, correlation_id=record.correlation_id,
                    status_url=DOCUMENTS_PATH + record.message_id,
                )
        if record.reply is not None and record.status == "failed":
            raise BackendError(
                f"The back end could not process the document: {record.error or 'no reason given'}",
                message_id=record.message_id, correlation_id=record.correlation_id,
                status_url=DOCUMENTS_PATH + record.message_id,
            )
        return Outcome(record.message_id, record.correlation_id, record.route, receipt, reply=record.reply,
                       reply_type=record.reply_type, replayed=True)

    # ----------------------------------------------------------------- status

    @staticmethod
    def _gone(tombstone: Tombstone) -> DocumentArchivedError:
        received, archived = iso_ms(tombstone.received_at) or "", iso_ms(tombstone.purged_at) or ""
        where = ("It is kept in the archive: ask the gateway's operator for it (`b2bgw archive get`)."
                 if tombstone.archived else "It was purged without an archive copy, as the policy says.")
        return DocumentArchivedError(
            f"Document {tombstone.message_id} (accepted on {received}) was {'archived' if tombstone.archived else 'purged'}"
            f" on {archived} under the ledger's retention policy and is no longer online. {where}",
            message_id=tombstone.message_id, status_url=DOCUMENTS_PATH + tombstone.message_id,
            received_at=received, archived_at=archived)

    async def document(self, partner: Partner, message_id: str, refresh: Any = None) -> LedgerRecord:
        """The partner's own document with its history; DocumentArchivedError when retention has taken it
        out of the ledger; NotFoundError for any other (or none)."""
        if not message_id or len(message_id) > 128:
            raise NotFoundError()
        before = self._unrecorded.get(message_id)
        record = await asyncio.to_thread(self.ledger.get, message_id, history=True)
        if record is None and message_id not in self._unrecorded:
            tombstone = await asyncio.to_thread(self.ledger.tombstone, message_id)
            if tombstone is not None and tombstone.partner == partner.id:
                raise self._gone(tombstone)
        if record is None or record.partner != partner.id:
            raise NotFoundError(f"No document {message_id[:128]!r} was accepted from your partner account.")
        record = self._with_unrecorded(record, before)
        if refresh is not None and record.status in ("accepted", "dead_lettered"):
            await asyncio.to_thread(refresh, [(record.message_id, record.status)])
            # read again even if this refresh moved nothing: the background reconciler may have moved the
            # document between the read above and the refresh, which then found nothing left to do
            record = await asyncio.to_thread(self.ledger.get, message_id, history=True) or record
        return record

