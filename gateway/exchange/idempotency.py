"""Idempotency: a document posted again gets the first answer, never a second acceptance.

A document's key is, per partner, its ``Idempotency-Key``; else the values of the route's own key XPaths; else
its document type and id, with its sender party when its type has one (:data:`gateway.routing.routes.SENDER_PARTIES`:
two buyers' orders relayed through one account may share a number). The same document (the same
:func:`document_digest` of the body as received) under a taken key gets the first answer again and nothing is
enqueued; another document under it is refused with :class:`~gateway.errors.IdempotencyConflictError` (409).
The ledger's unique key decides; the keys this process accepted lately are remembered with their digests, so
that the usual replay skips the doomed insert (a refused insert fails its whole group commit, which the store
then redoes one operation at a time) without a database read per request.

Rows written before the ledger kept digests are compared by their stored document, and for
:data:`LEGACY_KEY_WINDOW` after the newest of them a document is also checked against the key it had before
sender parties were part of keys. A document purged by retention keeps its key through its tombstone: it is
answered with :class:`~gateway.errors.ArchivedReplayError` or the conflict, never accepted as new.
See docs/idempotency.md.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import time
from typing import TYPE_CHECKING

from gateway.errors import ArchivedReplayError, BackendError, GatewayError, IdempotencyConflictError, ReplyTimeoutError, clip
from gateway.exchange.ids import iso_ms, uuid4_str
from gateway.ledger.records import Ledger, LedgerRecord, Tombstone, now_ms
from gateway.routing.partners import Partner
from gateway.exchange.receipts import DOCUMENTS_PATH, Outcome
from gateway.routing.routes import Route, RouteTable
from gateway.intake.xmlsafe import parse_document_text

if TYPE_CHECKING:
    from gateway.exchange.stages import Intake
    from gateway.intake.xmlsafe import IntakeLimits

__all__ = ["LEGACY_KEY_WINDOW", "Idempotency"]

log = logging.getLogger("gateway.exchange.submission")  # the gateway's log, whichever part of it writes

#: For this long (s) after the newest ledger row without a digest (accepted before the ledger kept them, under
#: a key without the sender party), a document is also checked against the key it would have had then: a
#: client's retry of a document accepted just before the upgrade is still a replay.
LEGACY_KEY_WINDOW = 7 * 24 * 3600
#: The most keys of such rows kept in memory for that (the newest).
LEGACY_KEYS_MAX = 1_000_000


class Idempotency:
    """The idempotency checks and replays of a :class:`gateway.exchange.submission.Gateway` (it holds the state they use)."""

    ledger: Ledger
    routes: RouteTable
    limits: IntakeLimits
    recent_keys: int
    duplicate_poll: float
    _recent: collections.OrderedDict[str, tuple[str, str]]
    _legacy_keys: frozenset[str] | None
    _legacy_until: float

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

    def _archived_duplicate(self, tombstone: Tombstone, intake: Intake, header: str | None) -> GatewayError:
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

    async def _duplicate(self, existing: LedgerRecord, intake: Intake, header: str | None,
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

    async def _legacy_duplicate(self, partner: Partner, intake: Intake, body: bytes) -> Outcome | None:
        """The answer to a document whose key before the upgrade (:attr:`Intake.legacy`) a row without a
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
