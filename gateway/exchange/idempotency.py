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
import json
import logging
import time
from typing import TYPE_CHECKING

from gateway.errors import (
    ArchivedReplayError,
    BackendError,
    GatewayError,
    IdempotencyConflictError,
    ReplyTimeoutError,
    clip,
)
from gateway.exchange.ids import iso_ms
from gateway.exchange.keys import idempotency_key
from gateway.exchange.receipts import DOCUMENTS_PATH, Outcome
from gateway.exchange.stages import Intake
from gateway.intake.xmlsafe import parse_document_text
from gateway.ledger.records import Ledger, LedgerRecord, Tombstone, now_ms
from gateway.routing.partners import Partner
from gateway.routing.routes import Route, RouteTable

if TYPE_CHECKING:
    from gateway.exchange.replies import PendingReplies
    from gateway.intake.xmlsafe import IntakeLimits

__all__ = ["LEGACY_KEY_WINDOW", "Idempotency"]

log = logging.getLogger(__name__)

#: For this long (s) after the newest ledger row without a digest (accepted before the ledger kept them, under
#: a key without the sender party), a document is also checked against the key it would have had then: a
#: client's retry of a document accepted just before the upgrade is still a replay.
LEGACY_KEY_WINDOW = 7 * 24 * 3600
#: The most keys of such rows kept in memory for that (the newest).
LEGACY_KEYS_MAX = 1_000_000


class Idempotency:
    """The keys a gateway process accepted lately, and the answers to a document whose key is taken."""

    def __init__(
        self,
        ledger: Ledger,
        routes: RouteTable,
        limits: IntakeLimits,
        replies: PendingReplies,
        *,
        recent_keys: int = 100_000,
        duplicate_poll: float = 0.05,
    ) -> None:
        self.ledger = ledger
        self.routes = routes
        self.limits = limits
        self.replies = replies
        self.recent_keys = recent_keys
        self.duplicate_poll = duplicate_poll
        # idempotency key -> (message id, digest) of documents this process accepted lately (a replay then skips
        # the insert that the unique key would refuse: a refused insert fails its whole group commit, which the
        # store then redoes one operation at a time)
        self._recent: collections.OrderedDict[str, tuple[str, str]] = collections.OrderedDict()
        # the keys of recent ledger rows without a digest (see LEGACY_KEY_WINDOW), until _legacy_until (epoch s)
        self._legacy_keys: frozenset[str] | None = None
        self._legacy_until = 0.0

    def load_legacy_keys(self) -> None:
        """Read the keys of the rows accepted without a digest within :data:`LEGACY_KEY_WINDOW` (none once
        the ledger has kept digests that long: an index range of those rows alone)."""
        rows = self.ledger.undigested_keys(now_ms() - LEGACY_KEY_WINDOW * 1000, LEGACY_KEYS_MAX)
        if not rows:
            self._legacy_keys = None
            return
        self._legacy_keys = frozenset(key for key, _ in rows)
        self._legacy_until = rows[0][1] / 1000 + LEGACY_KEY_WINDOW
        if len(rows) == LEGACY_KEYS_MAX:
            log.warning(
                "%d documents accepted before the ledger kept digests are recent; retries of older ones "
                "are checked by their own key only",
                len(rows),
            )
        log.info(
            "checking documents against the keys of %d recent documents accepted before the ledger kept "
            "digests, until %s",
            len(rows),
            iso_ms(int(self._legacy_until * 1000)),
        )

    def remember(self, key: str, message_id: str, digest: str) -> None:
        recent = self._recent
        recent[key] = (message_id, digest)
        if len(recent) > self.recent_keys:
            recent.popitem(last=False)

    def keyed(self, partner_id: str, result: Intake, header: str | None) -> Intake:
        """*result* checked against the keys accepted lately: the first's Intake (``known``) for the same
        document again, IdempotencyConflictError for another; else *result*, with the key it had before
        sender parties were part of keys when a recent row may hold that one."""
        route, doc_id, party = result.route, result.doc_id, result.party
        known = self._recent.get(result.key)
        if known is not None:
            if known[1] != result.digest:
                raise self.conflict(route, doc_id, party, header, known[0])
            return Intake(route, doc_id, result.key, result.digest, known[0])
        keyed_by_values = header is None and route.key_xpaths is not None
        if self._legacy_keys is not None and doc_id is not None and (party is not None or keyed_by_values):
            result.legacy = self.legacy_key(partner_id, route, doc_id)
        return result

    def legacy_key(self, partner_id: str, route: Route, doc_id: str) -> str | None:
        """The default key without the sender party, when a recent row without a digest holds it."""
        keys = self._legacy_keys
        if keys is None:
            return None
        if time.time() > self._legacy_until:
            self._legacy_keys = None
            return None
        legacy = idempotency_key(partner_id, route, doc_id, None)
        return legacy if legacy in keys else None

    def conflict(
        self, route: Route, doc_id: str | None, party: str | None, header: str | None, first: str
    ) -> IdempotencyConflictError:
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
            first_message_id=first,
            first_status_url=url,
        )

    def archived_duplicate(self, tombstone: Tombstone, intake: Intake, header: str | None) -> GatewayError:
        """The answer to a document whose key the tombstone of an archived (purged) document holds: never
        accepted again. Another document under that key is the conflict it would have been while the first
        was online; the same one (or one the first cannot be compared with: no digest) is told the first
        was archived. Its key is not remembered: nothing online answers it any more."""
        if tombstone.digest is not None and tombstone.digest != intake.digest:
            return self.conflict(intake.route, intake.doc_id, intake.party, header, tombstone.message_id)
        url = DOCUMENTS_PATH + tombstone.message_id
        archived = iso_ms(tombstone.purged_at)
        how = "archived" if tombstone.archived else "purged"
        return ArchivedReplayError(
            f"This document was accepted on {iso_ms(tombstone.received_at)} as {tombstone.message_id} and {how} on "
            f"{archived} under the ledger's retention policy; it was not accepted again. Do not resend it; ask "
            "the gateway's operator for the archived copy if you need it.",
            message_id=tombstone.message_id,
            status_url=url,
            received_at=iso_ms(tombstone.received_at) or "",
            archived_at=archived or "",
        )

    async def duplicate(self, existing: LedgerRecord, intake: Intake, header: str | None, body: bytes) -> Outcome:
        """The answer to a document whose key *existing* holds: the first answer when it is the same
        document, else :class:`IdempotencyConflictError`."""
        if existing.digest is not None:
            same = existing.digest == intake.digest
        else:  # accepted before the ledger kept digests: compare the document it stored
            stored = await asyncio.to_thread(self.ledger.get, existing.message_id, document=True)
            same = stored is not None and stored.document in (intake.document, body)
        if not same:
            raise self.conflict(intake.route, intake.doc_id, intake.party, header, existing.message_id)
        self.remember(intake.key, existing.message_id, intake.digest)
        return await self.replay(existing)

    async def legacy_duplicate(self, partner: Partner, intake: Intake, body: bytes) -> Outcome | None:
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
            raise self.conflict(intake.route, intake.doc_id, intake.party, None, existing.message_id)
        self.remember(intake.key, existing.message_id, intake.digest)
        return await self.replay(existing)

    def _key_of_stored(self, partner: Partner, route: Route, document: bytes) -> str | None:
        """The key a stored document has today (None if it no longer parses)."""
        try:
            root, _ = parse_document_text(document, self.limits)
        except GatewayError:
            return None
        values = route.extract_key_values(root)
        party = route.extract_sender_party(root) if values is None else None
        return idempotency_key(partner.id, route, route.extract_document_id(root), None, party, values)

    async def replay(self, record: LedgerRecord) -> Outcome:
        """The first answer to a document accepted before (same idempotency key)."""
        record = self.replies.merged(record)
        route = self.routes.get(record.route)
        receipt = (
            json.loads(record.receipt)
            if record.receipt
            else {  # the receipt _receipt made
                "message_id": record.message_id,
                "correlation_id": record.correlation_id,
                "route": record.route,
                "document_type": record.doc_type,
                "document_id": record.doc_id,
                "status": "accepted",
                "received_at": iso_ms(record.received_at),
                "status_url": DOCUMENTS_PATH + record.message_id,
            }
        )
        request_reply = route.request_reply if route is not None else record.reply is not None
        if request_reply and record.reply is None:
            timeout = route.timeout if route is not None else 0.0
            deadline = record.received_at / 1000 + timeout
            while record.reply is None and time.time() < deadline:  # the first request may still be waiting
                await asyncio.sleep(self.duplicate_poll)
                before = self.replies.get(record.message_id)
                fresh = await asyncio.to_thread(self.ledger.get, record.message_id)
                if fresh is None:  # pragma: no cover - ledger rows are never deleted
                    break
                record = self.replies.merged(fresh, before)
            if record.reply is None:
                raise ReplyTimeoutError(
                    f"This document was accepted before as {record.message_id} and no reply has come yet; "
                    f"GET {DOCUMENTS_PATH}{record.message_id} returns its status and the reply once it comes.",
                    message_id=record.message_id,
                    correlation_id=record.correlation_id,
                    status_url=DOCUMENTS_PATH + record.message_id,
                )
        if record.reply is not None and record.status == "failed":
            raise BackendError(
                f"The back end could not process the document: {record.error or 'no reason given'}",
                message_id=record.message_id,
                correlation_id=record.correlation_id,
                status_url=DOCUMENTS_PATH + record.message_id,
            )
        return Outcome(
            record.message_id,
            record.correlation_id,
            record.route,
            receipt,
            reply=record.reply,
            reply_type=record.reply_type,
            replayed=True,
        )
