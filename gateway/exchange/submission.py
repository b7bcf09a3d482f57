"""The gateway's work for one document, independent of HTTP.

:meth:`Gateway.submit` takes an authenticated partner's request body and returns an :class:`Outcome` (a
receipt, or a reply) or raises a typed :class:`~gateway.errors.GatewayError`:

1. the staged intake (:mod:`gateway.exchange.stages`): parse, route, validate, extract, transform, warehouse facts;
2. idempotency (:mod:`gateway.exchange.idempotency`): a document posted again under a taken key gets the first answer,
   another document under it a conflict;
3. business rules, when the route applies a rule set (:mod:`gateway.rules.rulesets`): failures refuse the document;
4. one-way: the message is sent in a transacted session and committed with the ledger insert
   (``in_transaction``), so the receipt is returned only once both are durable. Request-reply
   (:mod:`gateway.exchange.request_reply`): the route's requestor sends it with the ledger insert and waits for the reply.

:meth:`Gateway.document` answers a partner's status request from the ledger.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import os
import threading
from typing import Any

from broker_core import (
    Broker,
    XMLMessage,
)
from broker_core import (
    StoreUnavailableError as BrokerStoreUnavailable,
)
from gateway.config.loader import INTAKE_FACTS
from gateway.delivery.hooks import route_delivery
from gateway.delivery.notify import push_late_reply
from gateway.errors import DocumentArchivedError, GatewayError, NotFoundError, StoreUnavailableError
from gateway.exchange.assemble import Assembly
from gateway.exchange.idempotency import LEGACY_KEY_WINDOW, Idempotency
from gateway.exchange.ids import iso_ms, uuid7_str
from gateway.exchange.intake_workers import IntakeWorkers
from gateway.exchange.receipts import DOCUMENTS_PATH, Accepted, Outcome
from gateway.exchange.replies import PendingReplies
from gateway.exchange.request_reply import RequestReply
from gateway.exchange.stages import (
    INLINE_MAX_BYTES,
    INTAKE_BUSY,
    INTAKE_THREADS,
    LARGE_NICE,
    LARGE_THREADS,
    TREE_VALIDATION_MAX_BYTES,
    Intake,
    IntakeInvalidError,
    IntakeStages,
    Work,
)
from gateway.intake.documents import document_digest
from gateway.intake.explainer import Explainer
from gateway.intake.xmlsafe import parse_document
from gateway.ledger.records import DuplicateDocumentError, Ledger, LedgerRecord, Tombstone, now_ms
from gateway.routing.partners import Partner
from gateway.rules.rulesets import RulesRunner, violation, warnings_of

# Gateway, and the names its callers have always imported from here (some live in the modules it is made of)
__all__ = ["Gateway", "Outcome", "INLINE_MAX_BYTES", "DOCUMENTS_PATH", "LEGACY_KEY_WINDOW", "document_digest", "iso_ms"]

log = logging.getLogger(__name__)


class Gateway:
    """Accepts documents for one broker, with the routes, schemas and partners of an :class:`Assembly`.

    Made of parts with their own state: the intake's stages (:attr:`intake`), the idempotency checks and
    replays (:attr:`idempotency`), the request-reply exchanges (:attr:`request_reply`) and the replies on
    their way to the ledger (:attr:`replies`); this class runs a document through them."""

    def __init__(
        self,
        assembly: Assembly,
        broker: Broker,
        *,
        late_reply_window: float | None = None,
        inline_max_bytes: int = INLINE_MAX_BYTES,
        duplicate_poll: float = 0.05,
        recent_keys: int = 100_000,
        intake_threads: int = INTAKE_THREADS,
        intake_facts: str = "when_idle",
        large_workers: int = LARGE_THREADS,
    ) -> None:
        if intake_facts not in INTAKE_FACTS:
            raise ValueError(f"intake_facts must be one of {', '.join(INTAKE_FACTS)}, not {intake_facts!r}")
        if broker.engine is None:
            raise GatewayError("the gateway needs a SQL store (sqlite:///PATH or postgresql+psycopg://...)")
        self.assembly = assembly
        self.settings = settings = assembly.settings
        self.registry = assembly.registry
        self.routes = assembly.routes
        self.partners = assembly.partners
        self.broker = broker
        self.ledger = Ledger(broker.engine)
        self.limits = settings.limits
        self.inline_max_bytes = inline_max_bytes
        self._connection: Any = None
        self._sessions: collections.deque[tuple[Any, Any]] = collections.deque()
        # parse, validate, facts: off the event loop (libxml2 runs without the GIL, on another core)
        self._intake_pool = (
            concurrent.futures.ThreadPoolExecutor(intake_threads, thread_name_prefix="b2bgw-intake")
            if intake_threads > 0
            else None
        )
        self._intake_threads = intake_threads
        self._in_pool = 0  # documents running or queued on the intake threads
        # larger documents: a few threads of their own, at a lower CPU priority (see LARGE_NICE)
        self._large_pool = concurrent.futures.ThreadPoolExecutor(
            LARGE_THREADS, thread_name_prefix="b2bgw-large", initializer=_lower_priority, initargs=(LARGE_NICE,)
        )
        # one thread per intake worker: a document that finds them all busy waits for one, not for a thread of its own
        self._offload_pool = concurrent.futures.ThreadPoolExecutor(
            max(1, large_workers), thread_name_prefix="b2bgw-offload"
        )
        #: documents whose warehouse facts were left to the nightly load (``when_idle`` under saturation)
        self.facts_deferred = 0
        # business rules (gateway.rules.rulesets): worker processes, when a route applies a rule set
        self.rules = (
            RulesRunner(
                assembly.rules,
                workers=settings.rules_workers,
                seconds=settings.rules_seconds,
                memory_mb=settings.rules_worker_memory_mb,
            )
            if any(route.rules for route in self.routes)
            else None
        )
        self.replies = PendingReplies(self.ledger, broker)
        self.idempotency = Idempotency(
            self.ledger, self.routes, self.limits, self.replies, recent_keys=recent_keys, duplicate_poll=duplicate_poll
        )
        self.request_reply = RequestReply(
            self.ledger,
            self.replies,
            self.idempotency,
            late_reply_window=(settings.late_reply_window if late_reply_window is None else late_reply_window),
            on_late_reply=lambda *reply: push_late_reply(self, *reply),
        )
        # the full error reports of invalid documents: worked out in a helper process, within a time budget;
        # larger documents' intake: worker processes, so that their work never holds this process's interpreter
        # (threads wait for them at normal priority: a niced thread preempted while it holds the interpreter
        # lock, as it does between two writes to a pipe, would hold up the event loop until it got a CPU again)
        explainer = (
            Explainer.shared(
                self.registry, self.limits, timeout=settings.explain_timeout, workers=settings.explain_workers
            )
            if getattr(settings, "explain_workers", 1) > 0 and hasattr(os, "fork")
            else None
        )
        self.intake = IntakeStages(
            self.registry,
            self.routes,
            self.limits,
            rules=self.rules,
            explainer=explainer,
            intake_workers=IntakeWorkers.shared(assembly, self.limits, workers=large_workers),
            intake_facts=intake_facts,
            idempotency=self.idempotency,
        )
        self._started = False
        self._stopped = False

    @property
    def intake_facts(self) -> str:
        """``server.intake_facts``: when the warehouse facts are made at intake."""
        return self.intake.intake_facts

    @intake_facts.setter
    def intake_facts(self, value: str) -> None:
        self.intake.intake_facts = value

    @property
    def intake_workers(self) -> IntakeWorkers | None:
        return self.intake.intake_workers

    @property
    def explainer(self) -> Explainer | None:
        return self.intake.explainer

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Connect to the broker and open one requestor per request-reply route."""
        if self._started:
            return
        self.idempotency.load_legacy_keys()
        if self.rules is not None:
            self.rules.start()
        self._connection = self.broker.connect()
        self._connection.start()
        self.request_reply.start(self._connection, self.routes)
        self._started = True

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.request_reply.stop()
        if self._connection is not None:
            self._connection.close()
        if self._intake_pool is not None:
            self._intake_pool.shutdown(wait=False)
        self._large_pool.shutdown(wait=False)
        self._offload_pool.shutdown(wait=False)
        if self.intake.intake_workers is not None:
            self.intake.intake_workers.release()
        if self.rules is not None:
            self.rules.stop()

    @property
    def ready(self) -> bool:
        return self._started and not self._stopped and not self.broker.closed

    def _session(self) -> tuple[Any, Any]:
        if self._sessions:
            return self._sessions.pop()
        session = self._connection.create_session(True)
        return session, session.create_producer(None)

    # ----------------------------------------------------------------- submitting

    async def _threaded_intake(
        self, partner: Partner, body: bytes, charset: str | None, idempotency_key: str | None, check_recent: bool
    ) -> Intake:
        """:meth:`_intake` off the event loop: a large document's (over ``inline_max_bytes``) by an intake
        worker process, or while none is ready on the niced large-document threads; any other in the default
        executor."""
        loop = asyncio.get_running_loop()
        if len(body) <= self.inline_max_bytes:
            return await loop.run_in_executor(
                None, self.intake.run, partner.id, body, charset, idempotency_key, check_recent
            )
        if self.intake.intake_workers is not None:
            intake = await loop.run_in_executor(
                self._offload_pool, self.intake.run_by_worker, partner.id, body, charset, idempotency_key, check_recent
            )
            if intake is not None:
                return intake
        return await loop.run_in_executor(
            self._large_pool, self.intake.run, partner.id, body, charset, idempotency_key, check_recent
        )

    async def submit(
        self,
        partner: Partner,
        body: bytes,
        *,
        charset: str | None = None,
        correlation_id: str | None = None,
        idempotency_key: str | None = None,
        auth: str | None = None,
    ) -> Outcome:
        """Accept one document (see the module docstring); raises a GatewayError subclass when refused.
        *auth* is how the partner authenticated (the ledger row keeps it)."""
        received_at = now_ms()
        if self._intake_pool is not None and len(body) <= self.inline_max_bytes:
            self._in_pool += 1
            busy = self._in_pool >= self._intake_threads + INTAKE_BUSY  # that many queued behind the threads
            try:
                intake = await asyncio.get_running_loop().run_in_executor(
                    self._intake_pool, self.intake.run, partner.id, body, charset, idempotency_key, True, busy
                )
            finally:
                self._in_pool -= 1
        elif len(body) <= min(self.inline_max_bytes, TREE_VALIDATION_MAX_BYTES):
            try:
                intake = await self.intake.run_on_loop(
                    Work(
                        partner.id,
                        body,
                        charset,
                        idempotency_key,
                        check_recent=True,
                        on_loop=True,
                        facts=self.intake.intake_facts,
                    )
                )
            except IntakeInvalidError as invalid:
                await asyncio.to_thread(self.intake.explain_invalid, invalid.work)
                raise GatewayError("validation failed without errors") from None  # pragma: no cover
        else:  # a larger document would hold the event loop or an intake thread for long
            intake = await self._threaded_intake(partner, body, charset, idempotency_key, True)
        if intake.known is not None:  # accepted by this process lately, the same document: replay, no insert
            before = self.replies.get(intake.known)
            existing = await asyncio.to_thread(self.ledger.get, intake.known)
            if existing is not None:
                return await self.idempotency.replay(self.replies.merged(existing, before))
            intake = await self._threaded_intake(partner, body, charset, idempotency_key, False)
        if intake.legacy is not None:
            answer = await self.idempotency.legacy_duplicate(partner, intake, body)
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
                raise await asyncio.to_thread(
                    violation, findings, body, lambda data: parse_document(data, self.limits, declared_charset=charset)
                )
            warning_count = len(findings)
            warnings = warnings_of(findings)
        properties, text, document, facts = intake.properties, intake.text, intake.document, intake.facts
        if intake.facts_deferred:
            self.facts_deferred += 1
        correlation = correlation_id or uuid7_str()

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

        accepted = Accepted(
            route, partner, message, correlation, key, doc_id, document, received_at, digest, facts, warnings, auth
        )
        try:
            if route.request_reply:
                return await self.request_reply.send(accepted)
            return await self._one_way(accepted)
        except DuplicateDocumentError:  # accepted before (another process, or long ago), or a concurrent twin won
            existing = await asyncio.to_thread(self.ledger.find, key)
            if existing is None:  # purged by retention since: its tombstone holds the key
                tombstone = await asyncio.to_thread(self.ledger.tombstone_for_key, key)
                if tombstone is None:  # pragma: no cover - the winner's row is committed before we fail
                    raise StoreUnavailableError() from None
                raise self.idempotency.archived_duplicate(tombstone, intake, idempotency_key) from None
            return await self.idempotency.duplicate(existing, intake, idempotency_key, body)
        except BrokerStoreUnavailable as exc:
            log.warning("store unavailable while accepting a document: %s", exc)
            raise StoreUnavailableError() from None

    async def _one_way(self, accepted: Accepted) -> Outcome:
        route, message, correlation = accepted.route, accepted.message, accepted.correlation
        message.jms_correlation_id = correlation
        session, producer = self._session()
        try:
            await producer.send_async(
                route.destination,
                message,
                delivery_mode=route.delivery_mode,
                priority=route.priority,
                time_to_live=route.time_to_live_ms,
            )
            message_id = message.jms_message_id
            receipt = accepted.receipt(message_id)
            record = accepted.row(message_id, receipt)
            ledger = self.ledger
            extra = [] if route.deliver is None else [route_delivery(producer, route, message_id, accepted.document)]
            await session.commit_async(in_transaction=[lambda conn: ledger.insert(conn, record), *extra])
            self.idempotency.remember(accepted.key, message_id, accepted.digest)
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

    # ----------------------------------------------------------------- status

    @staticmethod
    def _gone(tombstone: Tombstone) -> DocumentArchivedError:
        received, archived = iso_ms(tombstone.received_at) or "", iso_ms(tombstone.purged_at) or ""
        where = (
            "It is kept in the archive: ask the gateway's operator for it (`b2bgw archive get`)."
            if tombstone.archived
            else "It was purged without an archive copy, as the policy says."
        )
        return DocumentArchivedError(
            f"Document {tombstone.message_id} (accepted on {received}) was {'archived' if tombstone.archived else 'purged'}"
            f" on {archived} under the ledger's retention policy and is no longer online. {where}",
            message_id=tombstone.message_id,
            status_url=DOCUMENTS_PATH + tombstone.message_id,
            received_at=received,
            archived_at=archived,
        )

    async def document(self, partner: Partner, message_id: str, refresh: Any = None) -> LedgerRecord:
        """The partner's own document with its history; DocumentArchivedError when retention has taken it
        out of the ledger; NotFoundError for any other (or none)."""
        if not message_id or len(message_id) > 128:
            raise NotFoundError()
        before = self.replies.get(message_id)
        record = await asyncio.to_thread(self.ledger.get, message_id, history=True)
        if record is None and message_id not in self.replies:
            tombstone = await asyncio.to_thread(self.ledger.tombstone, message_id)
            if tombstone is not None and tombstone.partner == partner.id:
                raise self._gone(tombstone)
        if record is None or record.partner != partner.id:
            raise NotFoundError(f"No document {message_id[:128]!r} was accepted from your partner account.")
        record = self.replies.merged(record, before)
        if refresh is not None and record.status in ("accepted", "dead_lettered"):
            await asyncio.to_thread(refresh, [(record.message_id, record.status)])
            # read again even if this refresh moved nothing: the background reconciler may have moved the
            # document between the read above and the refresh, which then found nothing left to do
            record = await asyncio.to_thread(self.ledger.get, message_id, history=True) or record
        return record


def _lower_priority(nice: int) -> None:
    """Add *nice* to the calling thread's nice value (Linux keeps one per thread; elsewhere a no-op)."""
    if hasattr(os, "setpriority") and hasattr(threading, "get_native_id"):
        try:
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
        except OSError:  # not allowed: the thread keeps its priority
            pass
