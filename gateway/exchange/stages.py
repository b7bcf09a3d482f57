"""The staged intake: everything the gateway does with a document's parsed tree.

Parse (hardened, :mod:`gateway.intake.xmlsafe`), choose the route (422 / 403), validate against the route's
schema, extract the document id, idempotency key and properties, transform (XSLT) if the route says so, and
make the warehouse facts; the tree is freed after the last stage. The stages run on the event loop by default
(bodies up to :data:`INLINE_MAX_BYTES`), where the documents that arrived together (up to :data:`INTAKE_BATCH`
of them, :data:`INTAKE_BATCH_BYTES` in all) go through each stage together before the next, so that the
parser's, the schema's and the extractor's code and data stay in the CPU's caches across a burst; or on
``server.intake_threads`` intake threads, where libxml2 works without holding the GIL while the event loop
serves HTTP and the broker. Threads pay off only when other work keeps the cores busy (every hand-over wakes a
core), hence none by default. Bodies over :data:`INLINE_MAX_BYTES` are taken in by worker processes
(:mod:`gateway.exchange.intake_workers`; :meth:`IntakeStages._intake_by_worker`), so that one large document holds up
neither the small ones nor the event loop; threads wait for them, and the niced large-document threads take a
document in while no worker is ready.

Validation and its error report are bounded whatever a document holds: bodies up to
:data:`TREE_VALIDATION_MAX_BYTES` are validated on their tree, larger ones while they are parsed (a constant
cost per error, their number capped) and never on the event loop. The full report of an invalid document is
worked out in a helper process within ``server.explain_timeout`` (:class:`gateway.intake.explainer.Explainer`);
past that, libxml2's errors answer.

The warehouse facts are the one stage the intake can leave out: the nightly load makes the same ones from the
stored XML. ``server.intake_facts`` says when they are made at intake: ``always``; ``when_idle`` (the default)
unless :data:`INTAKE_BUSY` documents or more wait for the intake together, or the document is over
:data:`FACTS_MAX_BYTES`; or ``never``.

A large document's work must not hold the interpreter lock for long at a time: the event loop, the store's
writer and the other partners' documents wait for it meanwhile. libxml2 parses and validates without it,
but an XPath evaluation holds it from start to end, and the facts' XPaths scan thousands of lines in one
call (tens of milliseconds for a 9 MB invoice): so a large document's facts are left to the nightly load.
"""

from __future__ import annotations

import asyncio
import codecs
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lxml import etree

from gateway.errors import GatewayError, SchemaValidationError
from gateway.exchange.keys import idempotency_key
from gateway.helpers.errors import error_from_data
from gateway.intake.documents import document_digest, received_document
from gateway.intake.xmlsafe import Validated, parse_and_validate, parse_document_text
from gateway.routing.routes import Route
from gateway.rules.schematron import document_utf8
from ledger_contract import facts as warehouse_facts

if TYPE_CHECKING:
    from gateway.intake.explainer import Explainer
    from gateway.intake.schemas import SchemaRegistry
    from gateway.intake.xmlsafe import IntakeLimits
    from gateway.routing.routes import RouteTable
    from gateway.rules.rulesets import RulesRunner

__all__ = [
    "INLINE_MAX_BYTES",
    "LARGE_THREADS",
    "LARGE_NICE",
    "TREE_VALIDATION_MAX_BYTES",
    "INTAKE_THREADS",
    "INTAKE_BATCH",
    "INTAKE_BATCH_BYTES",
    "INTAKE_BUSY",
    "FACTS_MAX_BYTES",
    "Intake",
    "IntakeStages",
]

#: Bodies up to this size are parsed and validated by the intake threads (or the event loop); larger ones by
#: the intake worker processes.
INLINE_MAX_BYTES = 256 * 1024
#: Larger bodies taken in at once: the worker processes, the threads that wait for them, and the threads that
#: take them in while no worker is ready...
LARGE_THREADS = 2
#: ... the last ones' nice value raised by this much (Linux: per thread; the workers raise theirs as much).
#: One large document costs a core for a quarter of a second; at normal priority two of them take the machine
#: from every small document behind them. Niced, they get the CPU the small ones leave.
LARGE_NICE = 10
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
#: Documents over this size have their warehouse facts made by the nightly load under ``intake_facts: when_idle``.
FACTS_MAX_BYTES = 1024 * 1024
#: This many documents waiting for the intake together make it saturated: ``intake_facts: when_idle`` then leaves
#: their warehouse facts to the nightly load.
INTAKE_BUSY = 4


@dataclass(slots=True)
class Intake:
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
class Work:
    """One request body on its way through the intake's stages (:meth:`Gateway._intake`)."""

    partner_id: str
    body: bytes
    charset: str | None
    idempotency_key: str | None
    check_recent: bool
    on_loop: bool = False  # the event loop's batched intake (an invalid document's details go to a thread)
    busy: bool = False  # the intake is saturated (see INTAKE_BUSY)
    facts: str = "when_idle"  # ``server.intake_facts`` for this document
    root: etree._Element | None = None
    decoded: str | None = None
    route: Route | None = None
    result: Intake | None = None
    rules: Any = None  # the business rules' future, or the document for them (see _validate_stage)
    validated: Validated | None = None  # a larger body's validation, made while parsing it
    started: float = field(default_factory=time.monotonic)  # the error report's time budget counts from here


class IntakeInvalidError(Exception):
    """Raised by the event loop's intake for a document its schema refuses: :meth:`Gateway.submit`
    works out the errors in a thread."""

    def __init__(self, work: Work) -> None:
        super().__init__("invalid")
        self.work = work


class IntakeStages:
    """A document's way from its body to an :class:`Intake`: parse, route, validate, key, properties, facts.

    The serving process runs them on its event loop, its intake threads or (large bodies) in an intake
    worker process, which builds the same stages from the configuration (without *idempotency*: the worker
    does not know the keys accepted lately, the serving process checks them)."""

    def __init__(
        self,
        registry: SchemaRegistry,
        routes: RouteTable,
        limits: IntakeLimits,
        *,
        rules: RulesRunner | None = None,
        explainer: Explainer | None = None,
        intake_workers: Any = None,
        intake_facts: str = "when_idle",
        idempotency: Any = None,
    ) -> None:
        # intake_workers: an IntakeWorkers (gateway.exchange.intake_workers); idempotency: an Idempotency
        # (gateway.exchange.idempotency); both import this module, so they are not named in its annotations
        self.registry = registry
        self.routes = routes
        self.limits = limits
        self.rules = rules
        self.explainer = explainer
        self.intake_workers = intake_workers
        self.intake_facts = intake_facts
        self.idempotency = idempotency
        self._stages = (self._parse_stage, self._validate_stage, self._extract_stage, self._facts_stage)
        self._batch: list[tuple[Work, asyncio.Future[Intake]]] = []  # waiting for the event loop's intake
        self._schemas_by_root: dict[str, tuple[str, Any]] = {}

    def run(
        self,
        partner_id: str,
        body: bytes,
        charset: str | None,
        idempotency_key: str | None,
        check_recent: bool,
        busy: bool = False,
        facts: str | None = None,
    ) -> Intake:
        """Everything done with the parsed tree, in one call (an intake thread runs it): parse, route,
        validate, the document id and idempotency key, then (unless the key was accepted lately) the
        properties, message text, ledger document and warehouse facts. The tree never leaves this call."""
        work = Work(
            partner_id,
            body,
            charset,
            idempotency_key,
            check_recent,
            busy=busy,
            facts=self.intake_facts if facts is None else facts,
        )
        for stage in self._stages:
            stage(work)
        assert work.result is not None
        return work.result

    def run_on_loop(self, work: Work) -> asyncio.Future[Intake]:
        """:meth:`run` on the event loop, together with the other documents that arrive before it runs."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Intake] = loop.create_future()
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
        try:
            for stage in self._stages:
                going_on = []
                for work, future in batch:
                    if future.done():  # cancelled: the client went away
                        continue
                    try:
                        stage(work)
                    except Exception as exc:  # the request's own error (GatewayError...)
                        future.set_exception(exc)
                        continue
                    going_on.append((work, future))
                batch = going_on
            for work, future in batch:
                future.set_result(work.result)
                work.root = None  # the tree is not needed any more
        finally:
            # an error's traceback keeps this frame: without its futures (each holding its error) and documents,
            # or each refused document would wait in a reference cycle for the garbage collector
            batch = going_on = work = future = _ = None  # type: ignore[assignment]

    def run_by_worker(
        self,
        partner_id: str,
        body: bytes,
        charset: str | None,
        idempotency_key: str | None,
        check_recent: bool,
        busy: bool = False,
    ) -> Intake | None:
        """:meth:`run` by an intake worker process (:mod:`gateway.exchange.intake_workers`); None while none is
        ready. A thread runs it: it waits for the worker without the interpreter lock."""
        started = time.monotonic()
        answer = self.intake_workers.take_in(
            partner_id, body, charset, idempotency_key, busy=busy, facts=self.intake_facts
        )
        if answer is None:
            return None
        head, payload = answer
        if "ok" not in head:
            error = error_from_data(head.get("error"))
            if (
                isinstance(error, SchemaValidationError)
                and self.explainer is not None
                and error.schema
                and self.registry.lxml_schema(error.schema) is not None
            ):  # the full report, if in time
                error = self.explainer.explain(body, charset, error.schema, started=started) or error
            try:
                raise error
            finally:
                error = None  # else this frame (and the body) would wait in a cycle with the error's traceback
        ok = head["ok"]
        route = self.routes.get(ok["route"])
        if route is None:  # pragma: no cover - the worker's routes are the serving process's (fingerprint)
            raise GatewayError()
        parts, offset = {}, 0
        for name in ("text", "document", "rules"):
            size = ok["sizes"].get(name)
            if size is not None:
                parts[name], offset = payload[offset : offset + size], offset + size
        document = parts.get("document") or received_document(body)
        text = (document if ok["own"] else parts["text"]).decode("utf-8")
        properties = {
            name: value for name, value in ok["properties"].items() if isinstance(value, (str, int, float, bool))
        }
        result = Intake(
            route,
            ok["doc_id"],
            ok["key"],
            ok["digest"],
            None,
            ok["party"],
            None,
            properties,
            text,
            document,
            ok["facts"],
            text_is_document=bool(ok["own"]),
            facts_deferred=bool(ok["facts_deferred"]),
            rules=parts.get("rules"),
        )
        return self._keyed(partner_id, result, idempotency_key) if check_recent else result

    def _parse_stage(self, work: Work) -> None:
        if len(work.body) <= TREE_VALIDATION_MAX_BYTES:
            work.root, work.decoded = parse_document_text(work.body, self.limits, declared_charset=work.charset)
        else:  # validated against the schema of its root element as it is parsed (see TREE_VALIDATION_MAX_BYTES)
            work.validated = parse_and_validate(
                work.body, self._schema_for_root, self.limits, declared_charset=work.charset
            )
            if work.validated.root is not None:
                work.root, work.decoded = work.validated.root, work.validated.text
            else:  # invalid: the validating parse keeps no tree, and the route is chosen on one
                work.root, work.decoded = parse_document_text(work.body, self.limits, declared_charset=work.charset)
        work.route = self.routes.select(work.root, work.partner_id)

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

    def _validate_stage(self, work: Work) -> None:
        schema = work.route.schema
        if len(work.body) > TREE_VALIDATION_MAX_BYTES and (work.validated is None or work.validated.schema != schema):
            xsd = self.registry.lxml_schema(schema)  # the route names another schema than its root's
            if xsd is not None:
                work.validated = parse_and_validate(
                    work.body, lambda _: (schema, xsd), self.limits, declared_charset=work.charset
                )
        validated = work.validated
        if validated is not None and validated.schema == schema:
            if validated.errors:
                self.explain_invalid(work)
        elif not self.registry.is_valid(work.root, schema):
            if work.on_loop:  # the report takes milliseconds at least: not on the event loop
                raise IntakeInvalidError(work)
            self.explain_invalid(work)
        if work.route.rules:  # business rules: worker processes run them while the intake goes on (submit waits)
            data = document_utf8(work.root, work.body, work.decoded is not None)
            work.rules = self.rules.submit(work.route.rules, data) if work.on_loop else data

    def explain_invalid(self, work: Work) -> None:
        """Raise the SchemaValidationError of an invalid document: the full report when the helper process
        works it out in time (:class:`gateway.intake.explainer.Explainer`), else libxml2's errors."""
        schema = work.route.schema
        report = None
        if self.explainer is not None and self.registry.lxml_schema(schema) is not None:
            report = self.explainer.explain(work.body, work.charset, schema, started=work.started)
        if report is not None:
            try:
                raise report
            finally:
                report = None  # no cycle: see _intake_by_worker
        validated = work.validated
        if validated is not None and validated.schema == schema and validated.errors:
            raise self.registry.streamed_error(
                schema,
                validated.errors,
                complete=validated.complete,
                nsmap=work.root.nsmap if work.root is not None else None,
            )
        if self.registry.lxml_schema(schema) is not None and len(work.body) <= TREE_VALIDATION_MAX_BYTES:
            raise self.registry.libxml2_error(work.root, schema, source=work.body)
        self.registry.validate(work.root, schema, source=work.body)  # XSD 1.1: xmlschema's, as it always was
        raise GatewayError("validation failed without errors")  # pragma: no cover - validate raised

    def _extract_stage(self, work: Work) -> None:
        route, root, body = work.route, work.root, work.body
        doc_id = route.extract_document_id(root)
        header = work.idempotency_key
        party = values = None
        if header is None:
            values = route.extract_key_values(root)
            if values is None:
                party = route.extract_sender_party(root)
        key = idempotency_key(work.partner_id, route, doc_id, header, party, values)
        result = Intake(route, doc_id, key, document_digest(body), None, party)
        if work.check_recent:
            result = self._keyed(work.partner_id, result, header)
            if result.known is not None:
                work.result = result
                return
        result.properties = route.extract(root)
        result.text, result.document, result.text_is_document = self._forms(
            body, root, work.decoded, route.apply_transform(root)
        )
        result.rules = work.rules
        work.result = result

    def _keyed(self, partner_id: str, result: Intake, header: str | None) -> Intake:
        """*result* checked against the keys this process accepted lately (see :meth:`Idempotency.keyed`)."""
        return result if self.idempotency is None else self.idempotency.keyed(partner_id, result, header)

    def _facts_stage(self, work: Work) -> None:
        if work.result.known is not None or work.facts == "never":
            return
        if work.facts == "when_idle" and (work.busy or len(work.body) > FACTS_MAX_BYTES):
            work.result.facts_deferred = work.route.doc_type in warehouse_facts.LOADED_TYPES
            return
        # what the warehouse keeps of it, from this very tree (None when not loaded or on any failure)
        work.result.facts = warehouse_facts.for_ledger(work.root, work.route.doc_type)

    @staticmethod
    def _forms(
        body: bytes, root: etree._Element, decoded: str | None, transformed: str | None
    ) -> tuple[str, bytes, bool]:
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
