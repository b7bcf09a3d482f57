"""Routes: which documents go where, compiled once from the ``routes:`` section (docs/integration-guide.md
shows a route's keys).

Matching (:meth:`RouteTable.select`): the routes whose root element is the document's and whose ``when``
holds, in file order; the first of them the partner may use wins. Some matching but none allowing the
partner is :class:`~gateway.errors.ForbiddenRouteError` (403); none matching at all is
:class:`~gateway.errors.NoRouteError` (422).

Idempotency (:mod:`gateway.exchange.idempotency`): without an ``Idempotency-Key`` header a document's key is its
partner, root element and document id, with its sender party (:data:`SENDER_PARTIES`: the buyer of an Order,
the supplier of an Invoice...) when it names one, so that two parties' documents relayed through one partner
account never share a key because they share a number. A route's ``idempotency_key`` XPaths replace that
default with their values.

Every XPath compiles once, at load; an XSLT is compiled with every file and network access denied.
:func:`~gateway.routing.route_compiler.compile_routes` collects every problem (:class:`~gateway.errors.ConfigError` with file and line)
rather than stopping at the first, so that ``b2bgw routes check`` lists them all, and refuses a route that an
earlier one shadows (same root element, a partner in common, and no ``when`` of its own).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lxml import etree

from broker_core import DeliveryMode, Destination, XMLMessage
from gateway.config.loader import (
    Where,
)
from gateway.errors import ForbiddenRouteError, GatewayError, NoRouteError, clip

__all__ = ["PropertySpec", "Route", "RouteTable", "SENDER_PARTIES", "TransformError", "display_root"]

log = logging.getLogger(__name__)

_DEFAULT_TIMEOUT = 10.0
_INT_RANGE = (-(2**31), 2**31 - 1)
_LONG_RANGE = (-(2**63), 2**63 - 1)


_UBL_DOC = "urn:oasis:names:specification:ubl:schema:xsd:"


def _by_type(parties: dict[str, tuple[str, ...]]) -> dict[str, str]:
    return {f"{{{_UBL_DOC}{name}-2}}{name}": party for party, names in parties.items() for name in names}


#: The party that issues each UBL 2.1 document type (a path to its ``cac:Party``-typed element, relative to
#: the root), by root element: part of the default idempotency key, as its ``cbc:EndpointID`` (with its
#: ``schemeID``), else its first ``cac:PartyIdentification/cbc:ID``. Only the types whose issuer the
#: standard fixes are listed; the others (FulfilmentCancellation, sent by either side; the transport
#: documents; non-UBL documents) key on partner, type and document id alone.
SENDER_PARTIES: dict[str, str] = _by_type(
    {
        "cac:BuyerCustomerParty/cac:Party": ("Order", "OrderChange", "OrderCancellation", "RequestForQuotation"),
        "cac:SellerSupplierParty/cac:Party": ("OrderResponse", "OrderResponseSimple", "Quotation"),
        "cac:AccountingSupplierParty/cac:Party": (
            "Invoice",
            "CreditNote",
            "DebitNote",
            "FreightInvoice",
            "Reminder",
            "Statement",
        ),
        "cac:AccountingCustomerParty/cac:Party": ("SelfBilledInvoice", "SelfBilledCreditNote", "RemittanceAdvice"),
        "cac:DespatchSupplierParty/cac:Party": ("DespatchAdvice",),
        "cac:DeliveryCustomerParty/cac:Party": ("ReceiptAdvice",),
        "cac:ProviderParty": (
            "Catalogue",
            "CatalogueDeletion",
            "CatalogueItemSpecificationUpdate",
            "CataloguePricingUpdate",
        ),
        "cac:ContractingParty/cac:Party": (
            "CallForTenders",
            "ContractAwardNotice",
            "ContractNotice",
            "PriorInformationNotice",
        ),
        "cac:TendererParty": ("Tender",),
        "cac:InventoryReportingParty": ("InventoryReport",),
        "cac:GuarantorParty": ("GuaranteeCertificate",),
        "cac:SenderParty": (
            "ApplicationResponse",
            "AttachedDocument",
            "AwardedNotification",
            "DocumentStatus",
            "DocumentStatusRequest",
            "ExceptionCriteria",
            "ExceptionNotification",
            "Forecast",
            "ForecastRevision",
            "GoodsItemItinerary",
            "ItemInformationRequest",
            "ProductActivity",
            "RetailEvent",
            "TenderReceipt",
            "TendererQualificationResponse",
            "TradeItemLocationProfile",
            "TransportExecutionPlan",
            "TransportExecutionPlanRequest",
            "TransportProgressStatus",
            "TransportProgressStatusRequest",
            "TransportServiceDescription",
            "TransportServiceDescriptionRequest",
            "TransportationStatus",
            "TransportationStatusRequest",
            "UnawardedNotification",
            "UtilityStatement",
        ),
    }
)

#: The longest sender party identifier a key keeps as it is (a longer one is clipped and hashed with the key).
_MAX_PARTY_CHARS = 200


class TransformError(GatewayError):
    """The route's XSLT failed on a document (500: a stylesheet problem, not the partner's)."""

    default_detail = "The route's transform failed on this document; contact the operator."


def display_root(tag: str) -> str:
    """``Order (urn:...:Order-2)`` from a Clark name."""
    q = etree.QName(tag)
    return f"{q.localname} ({q.namespace})" if q.namespace else q.localname


@dataclass(frozen=True)
class PropertySpec:
    """One message property extracted from the document."""

    name: str
    xpath: str
    type: str
    compiled: etree.XPath = field(repr=False, compare=False)

    def value(self, root: etree._Element) -> Any:
        """The typed value, or None when the document has none (or it does not convert)."""
        text = self.compiled(root).strip()
        if not text:
            return None
        kind = self.type
        if kind == "string":
            return text
        try:
            if kind == "double":
                number = float(text)
                return number if number == number and number not in (float("inf"), float("-inf")) else None
            if kind in ("long", "int"):
                number = int(text)
                low, high = _INT_RANGE if kind == "int" else _LONG_RANGE
                return number if low <= number <= high else None
            if kind == "boolean":
                if text in ("true", "1"):
                    return True
                if text in ("false", "0"):
                    return False
                return None
        except ValueError:
            return None
        return None  # pragma: no cover - types are checked at load


@dataclass
class Route:
    """A compiled route (see the module docstring for the fields)."""

    id: str
    partners: frozenset[str] | None  # None: every partner
    root: str
    schema: str
    destination: Destination
    delivery_mode: int = DeliveryMode.PERSISTENT
    priority: int = 4
    time_to_live_ms: int = 0
    request_reply: bool = False
    timeout: float = _DEFAULT_TIMEOUT
    when_text: str | None = None
    when: etree.XPath | None = field(default=None, repr=False)
    document_id: etree.XPath | None = field(default=None, repr=False)
    properties: list[PropertySpec] = field(default_factory=list)
    transform_path: Path | None = None
    transform: etree.XSLT | None = field(default=None, repr=False)
    namespaces: dict[str, str] = field(default_factory=dict)
    #: the business rule sets (``rules.sets`` names) applied after schema validation, in order
    rules: tuple[str, ...] = ()
    where: Where = field(default_factory=lambda: Where(None, None))
    #: the route's own idempotency key XPaths (None: the default key, see the module docstring)
    key_xpath_texts: tuple[str, ...] | None = None
    key_xpaths: tuple[etree.XPath, ...] | None = field(default=None, repr=False)
    #: where the default key's sender party is (SENDER_PARTIES), when the route keeps the default key
    sender_party_path: str | None = None
    sender_party: etree.XPath | None = field(default=None, repr=False)
    #: ``deliver:``: what the route accepts also goes to a partner's endpoint (gateway.delivery.hooks)
    deliver: Any = None

    @functools.cached_property
    def doc_type(self) -> str:
        return etree.QName(self.root).localname

    @functools.cached_property
    def doc_namespace(self) -> str:
        return etree.QName(self.root).namespace or ""

    @property
    def exchange(self) -> str:
        return "request-reply" if self.request_reply else "one-way"

    def allows(self, partner_id: str) -> bool:
        return self.partners is None or partner_id in self.partners

    def matches(self, root: etree._Element) -> bool:
        """Whether the document (its root element) is one this route takes, partner aside."""
        if root.tag != self.root:
            return False
        return self.when is None or bool(self.when(root))

    def extract(self, root: etree._Element) -> dict[str, Any]:
        """The message properties of the document (those it has values for)."""
        out: dict[str, Any] = {}
        for spec in self.properties:
            value = spec.value(root)
            if value is not None:
                out[spec.name] = value
        return out

    def extract_document_id(self, root: etree._Element) -> str | None:
        if self.document_id is None:
            return None
        text = self.document_id(root).strip()
        return clip(text, 200) if text else None

    def extract_sender_party(self, root: etree._Element) -> str | None:
        """The document's sender party, ``schemeID:identifier`` (or the identifier alone without a
        scheme), for the default idempotency key; None when the route has none or the document names none."""
        if self.sender_party is None:
            return None
        found = self.sender_party(root)
        if not found:
            return None
        element = found[0]
        text = " ".join((element.text or "").split())
        scheme = element.get("schemeID")
        party = f"{' '.join(scheme.split())}:{text}" if scheme else text
        return party if len(party) <= _MAX_PARTY_CHARS else clip(party, _MAX_PARTY_CHARS)

    def extract_key_values(self, root: etree._Element) -> list[str] | None:
        """The string values of the route's own idempotency key XPaths; None when it keeps the default key."""
        if self.key_xpaths is None:
            return None
        return [xpath(root).strip() for xpath in self.key_xpaths]

    def apply_transform(self, root: etree._Element) -> str | None:
        """The message text the XSLT makes of the document, or None without a transform."""
        if self.transform is None:
            return None
        try:
            result = self.transform(root)
        except etree.XSLTApplyError as exc:
            log.error("route %s: the transform %s failed: %s", self.id, self.transform_path, clip(str(exc), 300))
            raise TransformError() from None
        text = str(result)
        if not text.strip():
            log.error("route %s: the transform %s produced nothing", self.id, self.transform_path)
            raise TransformError()
        return text

    def set_properties(self, message: XMLMessage, values: dict[str, Any]) -> None:
        for spec in self.properties:
            value = values.get(spec.name)
            if value is None:
                continue
            if spec.type == "string":
                message.set_string_property(spec.name, value)
            elif spec.type == "double":
                message.set_double_property(spec.name, value)
            elif spec.type == "long":
                message.set_long_property(spec.name, value)
            elif spec.type == "int":
                message.set_int_property(spec.name, value)
            else:
                message.set_boolean_property(spec.name, value)


class RouteTable:
    """The routes, indexed by root element, in file order."""

    def __init__(self, routes: list[Route]) -> None:
        self.routes = list(routes)
        self.by_id = {r.id: r for r in self.routes}
        self._by_root: dict[str, list[Route]] = {}
        for route in self.routes:
            self._by_root.setdefault(route.root, []).append(route)

    def __iter__(self):
        return iter(self.routes)

    def __len__(self) -> int:
        return len(self.routes)

    def get(self, route_id: str) -> Route | None:
        return self.by_id.get(route_id)

    def select(self, root: etree._Element, partner_id: str) -> Route:
        """The route for this document and partner; NoRouteError (422) or ForbiddenRouteError (403)."""
        candidates = self._by_root.get(root.tag)
        matched = False
        if candidates:
            for route in candidates:
                if route.when is not None and not route.when(root):
                    continue
                if route.allows(partner_id):
                    return route
                matched = True
        if matched:
            raise ForbiddenRouteError(
                f"Partner {partner_id!r} may not send {display_root(root.tag)} documents through this gateway; "
                "ask the operator to enable the route for your account."
            )
        tag = root.tag if isinstance(root.tag, str) else "?"
        reason = "no route takes this root element" if not candidates else "no route's conditions match this document"
        raise NoRouteError(
            f"No route matches the document with root element {display_root(tag)} sent by partner "
            f"{partner_id!r}: {reason}."
        )
