"""What the admin API and the console do, on the running gateway's broker and ledger.

Reads (destinations, pages of messages, the ledger) are answered from bounded
queries; the destinations' counters come from the sampler's last reading
(:mod:`.snapshot`). Every action (replay, delete, move, purge) is checked for
the operator's role, done through the broker's public API and recorded in the
audit trail with how many messages it touched; a failed or refused one too.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lxml import etree

from broker_core import (
    Broker,
    BrowsedMessage,
    InvalidArgumentError,
    InvalidDestinationError,
    InvalidSelectorError,
    Queue,
    parse_destination,
)
from gateway.admin import queries
from gateway.admin.access import Access, Principal
from gateway.admin.audit import Audit
from gateway.admin.errors import InvalidRequestError
from gateway.admin.snapshot import StatsSampler
from gateway.as2.store import As2Record, As2Store
from gateway.config.operations import AdminSettings
from gateway.errors import NotFoundError, StoreUnavailableError
from gateway.ledger.records import Ledger
from ledger_contract.tables import STATUSES

__all__ = ["AdminService", "pretty_xml"]

log = logging.getLogger(__name__)

#: Bodies up to this size are shown whole (pretty-printed when XML); longer ones are cut there.
SHOW_BYTES = 1 << 20
MAX_ACTION_LIMIT = 100_000


def pretty_xml(data: bytes | str | None) -> tuple[str | None, bool]:
    """``(text, truncated)``: XML indented for reading (as it is when it does not parse), cut at
    :data:`SHOW_BYTES`. Parsed without entities, DTDs or network access."""
    if data is None:
        return None, False
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    if len(raw) > SHOW_BYTES:
        return raw[:SHOW_BYTES].decode("utf-8", errors="replace"), True
    try:
        parser = etree.XMLParser(
            resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False, remove_blank_text=True
        )
        root = etree.fromstring(raw, parser)
        return etree.tostring(root, pretty_print=True, encoding="unicode"), False
    except (etree.XMLSyntaxError, ValueError):
        return raw.decode("utf-8", errors="replace"), False


def _body_view(message: BrowsedMessage) -> dict[str, Any]:
    body = message.body
    if message.kind in ("text", "xml") and isinstance(body, str):
        looks_xml = message.kind == "xml" or body.lstrip().startswith("<")
        text, cut = pretty_xml(body) if looks_xml else (body[:SHOW_BYTES], len(body) > SHOW_BYTES)
        return {"format": "xml" if looks_xml else "text", "text": text, "truncated": cut}
    if isinstance(body, (bytes, bytearray)):
        return {
            "format": "base64",
            "text": base64.b64encode(bytes(body[:SHOW_BYTES])).decode("ascii"),
            "truncated": len(body) > SHOW_BYTES,
        }
    if body is None:
        return {"format": "none", "text": None, "truncated": False}
    return {
        "format": "json",
        "text": json.dumps(body, default=str, ensure_ascii=False, indent=2)[:SHOW_BYTES],
        "truncated": False,
    }


def message_json(message: BrowsedMessage, *, body: bool = False) -> dict[str, Any]:
    out = {
        "message_id": message.message_id,
        "destination": message.destination,
        "box": message.box,
        "priority": message.priority,
        "timestamp": message.timestamp,
        "expiration": message.expiration,
        "persistent": message.delivery_mode == 2,
        "correlation_id": message.correlation_id,
        "reply_to": message.reply_to,
        "type": message.type,
        "properties": message.properties,
        "kind": message.kind,
        "size": message.size,
        "state": message.state,
        "delivery_count": message.delivery_count,
        "cursor": message.cursor,
    }
    if body:
        out["body"] = _body_view(message)
    return out


@dataclass
class ActionResult:
    action: str
    destination: str
    count: int
    message_ids: list[str]
    ledger_documents: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class AdminService:
    """The admin side's operations on a running gateway (see the module docstring)."""

    def __init__(self, assembly: Any, runtime: Callable[[], Any], admin: AdminSettings) -> None:
        self.assembly = assembly
        self.settings = assembly.settings
        self.admin = admin
        self._runtime = runtime
        self._parts: tuple[Broker, Access, Audit, StatsSampler, queries.Counts] | None = None
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- parts, made once the store is open

    def _started(self) -> Any:
        rt = self._runtime()
        if rt is None or rt.broker is None or rt.broker.closed:
            raise StoreUnavailableError("The gateway is starting or stopping; retry in a moment.")
        return rt

    def parts(self) -> tuple[Broker, Access, Audit, StatsSampler, queries.Counts]:
        rt = self._started()
        parts = self._parts
        if parts is not None and parts[0] is rt.broker:
            return parts
        with self._lock:  # made once, whichever request comes first
            return self._make_parts(rt)

    def _make_parts(self, rt: Any) -> tuple[Broker, Access, Audit, StatsSampler, queries.Counts]:
        parts = self._parts
        if parts is None or parts[0] is not rt.broker:
            broker = rt.broker
            engine = broker.engine
            sampler = StatsSampler(broker, self.admin.stats_interval, engine)
            sampler.start()
            if parts is not None:
                parts[3].stop()
            parts = self._parts = (
                broker,
                Access(self.admin, engine, broker),
                Audit(engine, broker),
                sampler,
                queries.Counts(engine),
            )
        return parts

    def close(self) -> None:
        if self._parts is not None:
            self._parts[3].stop()
            self._parts = None

    @property
    def broker(self) -> Broker:
        return self.parts()[0]

    @property
    def access(self) -> Access:
        return self.parts()[1]

    @property
    def audit(self) -> Audit:
        return self.parts()[2]

    @property
    def sampler(self) -> StatsSampler:
        return self.parts()[3]

    @property
    def engine(self) -> Any:
        return self.broker.engine

    # ----------------------------------------------------------------- destinations

    def _dlq_prefix(self) -> str:
        return f"queue://{self.broker.policy.dead_letter_prefix}"

    def destinations(self) -> dict[str, Any]:
        """Every queue, dead-letter queue and subscription with its counters and rates."""
        snapshot = self.sampler.current()
        history = self.sampler.history()
        rates: dict[str, tuple[float, float]] = {}
        if len(history) >= 2:
            (t0, before), (t1, after) = history[-2], history[-1]
            span = max(t1 - t0, 1e-3)
            for name, (_, enq, deq) in after.items():
                old = before.get(name, (0, enq, deq))
                rates[name] = (max(0, enq - old[1]) / span, max(0, deq - old[2]) / span)
        prefix = self._dlq_prefix()
        stats = dict(snapshot.by_name)
        names = set(stats)
        for route in self.assembly.routes:
            names.add(str(route.destination))
        out = []
        now = snapshot.taken_at
        for name in sorted(names):
            s = stats.get(name)
            kind = (
                "subscription"
                if s is not None and s.topic
                else "dead-letter"
                if name.startswith(prefix)
                else "temporary"
                if name.startswith("temp-")
                else "queue"
                if name.startswith("queue://")
                else "subscription"
                if name.startswith(("durable://", "subscriber://"))
                else "other"
            )
            if kind == "temporary":
                continue
            dlq = None
            if kind == "queue":
                dlq = prefix + name[len("queue://") :]
            item = {
                "name": name,
                "kind": kind,
                "topic": s.topic if s else None,
                "depth": s.depth if s else 0,
                "in_flight": s.in_flight if s else 0,
                "consumers": s.consumers if s else 0,
                "enqueued": s.enqueued if s else 0,
                "acknowledged": s.dequeued if s else 0,
                "dead_lettered": s.dead_lettered if s else 0,
                "expired": s.expired if s else 0,
                "redelivered": s.redelivered if s else 0,
                "oldest_age_s": round(now - s.oldest / 1000, 3) if s and s.oldest else None,
                "enqueue_rate": round(rates.get(name, (0, 0))[0], 3),
                "ack_rate": round(rates.get(name, (0, 0))[1], 3),
                "dead_letter_queue": dlq,
                "dead_letter_depth": stats[dlq].depth if dlq and dlq in stats else 0,
                "dead_letter_for": ("queue://" + name[len(prefix) :]) if kind == "dead-letter" else None,
            }
            out.append(item)
        return {"taken_at": snapshot.taken_at, "took_s": round(snapshot.took, 4), "destinations": out}

    def destination(self, name: str) -> dict[str, Any]:
        box = self.box(name)
        for item in self.destinations()["destinations"]:
            if item["name"] == box:
                return item
        raise NotFoundError(f"No destination {box!r} is known; see GET /admin/api/v1/destinations.")

    def box(self, name: str | None) -> str:
        """The store's key of a destination given as ``queue://NAME``, a bare queue name, or a
        subscription's key (``durable://CLIENT/NAME``)."""
        if not name or len(name) > 600:
            raise InvalidRequestError("Name a destination: queue://NAME (or a subscription's durable://... key).")
        if name.startswith(("durable://", "subscriber://")):
            return name
        try:
            dest = parse_destination(name) if "://" in name else Queue(name)
        except InvalidDestinationError as exc:
            raise InvalidRequestError(str(exc)) from None
        if dest.is_topic:
            raise InvalidRequestError(f"{name} is a topic: messages wait in its subscriptions; name one of those.")
        return str(dest)

    def history(self, name: str) -> list[dict[str, Any]]:
        """The sampler's recent readings of one destination (the console's chart)."""
        out = []
        previous = None
        for at, values in self.sampler.history():
            depth, enq, deq = values.get(name, (0, 0, 0))
            rate = None
            if previous is not None and at > previous[0]:
                rate = max(0, enq - previous[1]) / (at - previous[0])
            out.append({"at": at, "depth": depth, "enqueue_rate": rate})
            previous = (at, enq)
        return out

    def browse(self, name: str, selector: str | None, cursor: str | None, limit: int) -> dict[str, Any]:
        box = self.box(name)
        try:
            page = self.broker.browse_page(box, selector or None, cursor=cursor or None, limit=limit)
        except (InvalidSelectorError, InvalidArgumentError) as exc:
            raise InvalidRequestError(str(exc)) from None
        return {
            "destination": box,
            "selector": selector or None,
            "messages": [message_json(m) for m in page.messages],
            "next_cursor": page.cursor,
        }

    def message(self, name: str, message_id: str) -> dict[str, Any]:
        box = self.box(name)
        if not message_id or len(message_id) > 128:
            raise InvalidRequestError("Name the message by its id (at most 128 characters).")
        found = self.broker.find_message(box, message_id)
        if found is None:
            raise NotFoundError(f"Message {message_id!r} is not in {box} (consumed, moved, or never there).")
        return message_json(found, body=True)

    # ----------------------------------------------------------------- actions

    def _checked(self, spec: dict[str, Any]) -> tuple[list[str] | None, str | None, int | None]:
        ids = spec.get("message_ids")
        selector = spec.get("selector")
        limit = spec.get("limit")
        if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
            raise InvalidRequestError("message_ids must be a list of message ids (strings).")
        if ids is not None and not 1 <= len(ids) <= 1000:
            raise InvalidRequestError("message_ids names 1 to 1000 messages.")
        if selector is not None and (not isinstance(selector, str) or not selector.strip() or len(selector) > 4000):
            raise InvalidRequestError("selector must be a JMS message selector of at most 4000 characters.")
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_ACTION_LIMIT
        ):
            raise InvalidRequestError(f"limit must be a whole number from 1 to {MAX_ACTION_LIMIT}.")
        if ids is None and selector is None:
            raise InvalidRequestError("Name the messages: message_ids, a selector, or both (with a limit).")
        return ids, selector.strip() if selector else None, limit

    def act(self, principal: Principal, action: str, spec: dict[str, Any], client: str) -> ActionResult:
        """Run *action* (replay, delete, move, purge) as *principal*; recorded in the audit trail."""
        target_name = spec.get("destination")
        box = self.box(target_name if isinstance(target_name, str) else None)
        audit = {
            "operator": principal.name,
            "role": principal.role,
            "action": action,
            "target": box,
            "client": client,
            "selector": spec.get("selector") if isinstance(spec.get("selector"), str) else None,
            "message_ids": spec.get("message_ids") if isinstance(spec.get("message_ids"), list) else None,
        }
        try:
            principal.require_operator()
        except Exception as exc:
            self.audit.record(**audit, outcome="refused", detail=str(exc))
            raise
        try:
            result = self._act(action, box, spec)
        except (InvalidRequestError, NotFoundError) as exc:
            self.audit.record(**audit, outcome="refused", detail=str(exc))
            raise
        except (InvalidSelectorError, InvalidArgumentError, InvalidDestinationError) as exc:
            self.audit.record(**audit, outcome="refused", detail=str(exc))
            raise InvalidRequestError(str(exc)) from None
        except Exception as exc:
            self.audit.record(**audit, outcome="failed", detail=str(exc)[:500])
            raise
        if action == "move":
            audit["target"] = f"{box} -> {result.destination}"
        self.audit.record(
            **audit,
            count=result.count,
            outcome="done",
            detail=f"{result.ledger_documents} ledger documents back to accepted" if result.ledger_documents else None,
        )
        self.sampler.refresh()
        return result

    def _act(self, action: str, box: str, spec: dict[str, Any]) -> ActionResult:
        broker = self.broker
        if action == "purge":
            confirm = spec.get("confirm")
            if confirm not in (box, box[len("queue://") :] if box.startswith("queue://") else box):
                raise InvalidRequestError(
                    f'Purging deletes every waiting message of {box}: confirm with "confirm": "{box}".'
                )
            count = broker.purge(box)
            return ActionResult("purge", box, count, [])
        ids, selector, limit = self._checked(spec)
        if action == "replay":
            if not box.startswith(self._dlq_prefix()):
                raise InvalidRequestError(
                    f"{box} is not a dead-letter queue; replay moves messages from a "
                    f"dead-letter queue ({self._dlq_prefix()}NAME) back to where they failed."
                )
            moved = broker.replay_dead_letter_ids(box, limit, message_ids=ids, selector=selector)
            documents = self._ledger_after_replay(moved)
            return ActionResult("replay", box, len(moved), moved, documents)
        if action == "delete":
            removed = broker.remove_messages(box, message_ids=ids, selector=selector, limit=limit)
            return ActionResult("delete", box, len(removed), removed)
        if action == "move":
            target = spec.get("target")
            target_box = self.box(target if isinstance(target, str) else None)
            if not target_box.startswith("queue://") or target_box == box:
                raise InvalidRequestError("target must be another queue (queue://NAME).")
            moved = broker.move_messages(
                box, target_box[len("queue://") :], message_ids=ids, selector=selector, limit=limit
            )
            documents = self._ledger_after_replay(moved) if box.startswith(self._dlq_prefix()) else 0
            return ActionResult("move", target_box, len(moved), moved, documents)
        raise NotFoundError(f"No action {action!r}: replay, delete, move or purge.")

    def _ledger_after_replay(self, message_ids: list[str]) -> int:
        """Documents whose messages left a dead-letter queue go back to ``accepted`` (the reconciler
        then follows them as it does any accepted document)."""
        if not message_ids:
            return 0
        from gateway.ledger.reconciler import Reconciler

        rt = self._started()
        reconciler = rt.reconciler or Reconciler(self.broker, Ledger(self.engine))
        return reconciler.after_replay(message_ids)

    # ----------------------------------------------------------------- ledger, partners, routes, ETL

    def search(self, params: dict[str, Any]) -> dict[str, Any]:
        q = queries.LedgerQuery()
        for key in ("partner", "doc_type", "status", "doc_id", "correlation_id", "message_id", "route"):
            value = params.get(key)
            if value:
                if len(value) > 500:
                    raise InvalidRequestError(f"{key} is at most 500 characters.")
                setattr(q, key, value.strip())
        if q.status and q.status not in STATUSES:
            raise InvalidRequestError(f"status is one of {', '.join(STATUSES)}.")
        for key in ("since", "until"):
            value = params.get(key)
            if value:
                setattr(q, key, parse_time(value, key))
        try:
            q.cursor = queries.decode_cursor(params.get("cursor"))
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        q.limit = parse_limit(params.get("limit"), 50, 200)
        page = queries.search(self.engine, q)
        return {"documents": page.documents, "next_cursor": page.cursor, "scanned": page.scanned}

    def document(self, message_id: str) -> dict[str, Any]:
        if not message_id or len(message_id) > 128:
            raise NotFoundError()
        doc = queries.document(self.engine, message_id)
        if doc is None:
            raise NotFoundError(f"The ledger has no document {message_id[:128]!r}.")
        from spark_etl.config import resolve

        try:
            warehouse = resolve(self.settings.etl).get("warehouse")
        except Exception:  # checked at load; nothing to show without it
            warehouse = None
        doc["lineage"] = queries.lineage(self.engine, doc, warehouse)
        doc["timeline"] = timeline(doc)
        doc["as2"] = [as2_view(record) for record in self.as2_records(doc["message_id"])]
        return doc

    def as2_records(self, message_id: str) -> list[As2Record]:
        """The document's AS2 messages, oldest first: what a partner's dispute about a receipt comes down to."""
        records = As2Store(self.engine, self.broker).for_document(message_id)
        return sorted(records, key=lambda r: (r.created_at, r.direction, r.as2_message_id))

    def as2_mdn(self, message_id: str, direction: str, as2_message_id: str) -> As2Record:
        """One AS2 record of the document with its MDN (NotFoundError when it has none)."""
        for record in self.as2_records(message_id):
            if record.direction == direction and record.as2_message_id == as2_message_id and record.mdn is not None:
                return record
        raise NotFoundError(f"Document {message_id[:128]!r} has no AS2 MDN for that Message-ID and direction.")

    def partners(self) -> dict[str, Any]:
        counts = self.parts()[4].get()
        registry = self.assembly.partners
        out = []
        for pid, partner in sorted(registry.partners.items()):
            keys = sorted(k.id for k in registry.keys.values() if k.partner == pid)
            out.append(
                {
                    "id": pid,
                    "name": partner.name,
                    "enabled": partner.enabled,
                    "keys": keys,
                    "last_hour": counts.counts.get("hour", {}).get("partner", {}).get(pid, {}),
                    "last_day": counts.counts.get("day", {}).get("partner", {}).get(pid, {}),
                }
            )
        return {"counted_at": time.time() - (time.monotonic() - counts.taken_at), "partners": out}

    def routes(self) -> dict[str, Any]:
        counts = self.parts()[4].get()
        out = []
        for route in self.assembly.routes:
            out.append(
                {
                    "id": route.id,
                    "document_type": route.doc_type,
                    "destination": str(route.destination),
                    "exchange": "request-reply" if route.request_reply else "one-way",
                    "partners": sorted(route.partners) if route.partners is not None else None,
                    "last_hour": counts.counts.get("hour", {}).get("route", {}).get(route.id, {}),
                    "last_day": counts.counts.get("day", {}).get("route", {}).get(route.id, {}),
                }
            )
        return {"counted_at": time.time() - (time.monotonic() - counts.taken_at), "routes": out}

    def etl_runs(self, limit: int = 20) -> dict[str, Any]:
        return {"runs": queries.etl_runs(self.engine, limit)}


def as2_view(record: As2Record) -> dict[str, Any]:
    """An AS2 record as the console and the admin API show it: the MDN's size, not its bytes."""
    mic, _, algorithm = (record.mic or "").partition(",")
    return {
        "direction": record.direction,
        "partner": record.partner,
        "as2_message_id": record.as2_message_id,
        "mic": mic.strip() or None,
        "mic_algorithm": algorithm.strip() or None,
        "disposition": record.disposition,
        "mdn_bytes": len(record.mdn) if record.mdn is not None else None,
        "mdn_delivery": record.mdn_delivery,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
    }


def timeline(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A document's life in order: received, each status it went through, the warehouse load."""
    steps = [{"step": "received", "at": doc["received_at"], "detail": f"from {doc['partner']} by route {doc['route']}"}]
    for event in doc["history"]:
        steps.append({"step": event["status"], "at": event["at"], "detail": None})
    lineage = doc.get("lineage") or {}
    state = lineage.get("state")
    if state == "loaded":
        run = lineage["run"]
        rows = sum(len(v) for v in lineage.get("rows", {}).values())
        steps.append(
            {
                "step": "warehouse",
                "at": run["finished_at"],
                "detail": f"loaded by run {run['run_id']} ({run['mode']})" + (f", {rows} rows" if rows else ""),
            }
        )
    elif state == "quarantined":
        steps.append(
            {
                "step": "warehouse",
                "at": lineage["quarantine"].get("quarantined_at"),
                "detail": f"quarantined: {lineage['quarantine'].get('reason')}",
            }
        )
    elif state in ("waiting-for-load", "no-load-yet"):
        steps.append({"step": "warehouse", "at": None, "detail": "not loaded yet"})
    return steps


def parse_limit(value: Any, default: int, maximum: int) -> int:
    if value in (None, ""):
        return default
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise InvalidRequestError(f"limit must be a whole number from 1 to {maximum}.") from None
    if not 1 <= n <= maximum:
        raise InvalidRequestError(f"limit must be a whole number from 1 to {maximum}.")
    return n


def parse_time(value: str, what: str) -> int:
    """Epoch ms from epoch ms digits or an ISO 8601 time (UTC when it names no zone)."""
    import datetime as dt

    value = value.strip()
    if value.isdigit() and len(value) <= 15:
        return int(value)
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequestError(
            f"{what} must be an ISO 8601 time (2025-06-01T12:00:00Z) or epoch milliseconds."
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return int(parsed.timestamp() * 1000)
