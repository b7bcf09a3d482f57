"""A sample handler: answer each UBL 2.1 Order with an OrderResponse accepting it.

Importing this module registers :func:`respond` in :data:`gateway.handlers.registry`: it consumes every
``orders.inbound`` message (the sample routes send only Orders there), one at a time per session, and replies
with a UBL 2.1 OrderResponse, validated against ``UBL-OrderResponse-2.1.xsd`` before it is sent, so that an
order that cannot be answered validly (or a message that is not an Order) is rolled back and in the end
dead-lettered instead of answered with garbage. :data:`respond_async` is the same responder written
``async def``, not registered (``Worker(broker, [respond_async])`` runs it).

:func:`build_order_response` builds the response from an order's root element: ``OR-<order ID>``, a fresh
UUID, the issue date and time (UTC), ``cbc:OrderResponseCode`` ``AP`` (accepted, UN/CEFACT 4343), the order
referenced, the seller then the buyer party copied from it, and one ``cac:OrderLine/cac:LineItem`` per order
line with ``cbc:LineStatusCode`` ``5`` (accepted without amendment, UN/CEFACT 1229), the quantity, price and
item as ordered. (UBL 2.1's OrderResponse has no ``LineResponse``: that belongs to ApplicationResponse.)
"""

from __future__ import annotations

import copy
import datetime as _dt
import logging
import threading
import uuid

from lxml import etree

from broker_core import Message, MessageFormatError, TextMessage, XMLMessage
from gateway.handlers import AsyncHandlerContext, HandlerContext, handler
from gateway.intake.schemas import SchemaRegistry

__all__ = [
    "ORDERS_QUEUE",
    "ORDER_NS",
    "ORDER_RESPONSE_NS",
    "build_order_response",
    "respond",
    "respond_async",
]

ORDER_NS = "urn:oasis:names:specification:ubl:schema:xsd:Order-2"
ORDER_RESPONSE_NS = "urn:oasis:names:specification:ubl:schema:xsd:OrderResponse-2"
CAC = "urn:oasis:names:specification:ubl:schema:xsd:CommonAggregateComponents-2"
CBC = "urn:oasis:names:specification:ubl:schema:xsd:CommonBasicComponents-2"
NSMAP = {None: ORDER_RESPONSE_NS, "cac": CAC, "cbc": CBC}

ORDERS_QUEUE = "orders.inbound"
#: UN/CEFACT 4343 "Accepted" (the whole order).
RESPONSE_CODE_ACCEPTED = "AP"
#: UN/CEFACT 1229 "Accepted without amendment" (a line).
LINE_STATUS_ACCEPTED = "5"
#: Validate each response against UBL-OrderResponse-2.1.xsd before sending it.
VALIDATE_RESPONSES = True

_ORDER = f"{{{ORDER_NS}}}Order"


def _cbc(name: str) -> str:
    return f"{{{CBC}}}{name}"


def _cac(name: str) -> str:
    return f"{{{CAC}}}{name}"


def _child(parent: etree._Element, tag: str) -> etree._Element | None:
    return parent.find(tag)


def _append_copy(parent: etree._Element, source: etree._Element | None) -> etree._Element | None:
    if source is None:
        return None
    element = copy.deepcopy(source)
    element.tail = None
    parent.append(element)
    return element


def _sub(parent: etree._Element, tag: str, text: str | None = None, **attrib: str) -> etree._Element:
    element = etree.SubElement(parent, tag, attrib)
    if text is not None:
        element.text = text
    return element


def build_order_response(
    order_root: etree._Element, *, issued: _dt.datetime | None = None, response_id: str | None = None
) -> etree._Element:
    """The root element of an OrderResponse that accepts ``order_root`` (a UBL
    2.1 ``Order``) as it stands; see the module documentation for its content.

    ``issued`` (default: now) gives IssueDate and IssueTime, in UTC when it is
    timezone-aware; ``response_id`` defaults to ``"OR-" + order ID`` (without
    leading and trailing XML whitespace). Raises
    ``ValueError`` for a root that is not a UBL Order, or an order without an
    ID, a buyer or a seller, or with a line without ``LineItem/cbc:ID``.
    All text is copied through lxml, so it is escaped when serialized.
    """
    if isinstance(order_root, etree._ElementTree):
        order_root = order_root.getroot()
    if not isinstance(order_root, etree._Element) or order_root.tag != _ORDER:
        tag = getattr(order_root, "tag", type(order_root).__name__)
        raise ValueError(f"expected a UBL 2.1 Order ({_ORDER}), got {tag!r}")
    order_id = _child(order_root, _cbc("ID"))
    if order_id is None:
        raise ValueError("the order has no cbc:ID")
    buyer = _child(order_root, _cac("BuyerCustomerParty"))
    seller = _child(order_root, _cac("SellerSupplierParty"))
    if buyer is None or seller is None:
        raise ValueError(
            "the order has no " + ("cac:BuyerCustomerParty" if buyer is None else "cac:SellerSupplierParty")
        )

    if issued is None:
        issued = _dt.datetime.now(_dt.UTC)
    elif issued.tzinfo is not None:
        issued = issued.astimezone(_dt.UTC)
    zone = "Z" if issued.tzinfo is not None else ""

    root = etree.Element(f"{{{ORDER_RESPONSE_NS}}}OrderResponse", nsmap=NSMAP)
    _sub(root, _cbc("UBLVersionID"), "2.1")
    _sub(root, _cbc("ID"), response_id if response_id is not None else "OR-" + (order_id.text or "").strip(" \t\r\n"))
    _sub(root, _cbc("UUID"), str(uuid.uuid4()))
    _sub(root, _cbc("IssueDate"), issued.strftime("%Y-%m-%d"))
    _sub(root, _cbc("IssueTime"), issued.strftime("%H:%M:%S") + zone)
    _sub(root, _cbc("OrderResponseCode"), RESPONSE_CODE_ACCEPTED, listID="UNCL4343")
    _append_copy(root, _child(order_root, _cbc("DocumentCurrencyCode")))

    reference = _sub(root, _cac("OrderReference"))
    _append_copy(reference, order_id)
    for name in ("UUID", "IssueDate", "IssueTime"):  # in the order OrderReferenceType wants them
        _append_copy(reference, _child(order_root, _cbc(name)))

    # OrderResponse wants the seller first; the Order has the buyer first
    _append_copy(root, seller)
    _append_copy(root, buyer)

    for n, order_line in enumerate(order_root.iterfind(_cac("OrderLine")), start=1):
        item = _child(order_line, _cac("LineItem"))
        line_id = None if item is None else _child(item, _cbc("ID"))
        if item is None or line_id is None:
            raise ValueError(f"order line {n} has no cac:LineItem/cbc:ID")
        line = _sub(root, _cac("OrderLine"))
        line_item = _sub(line, _cac("LineItem"))
        _append_copy(line_item, line_id)
        _sub(line_item, _cbc("LineStatusCode"), LINE_STATUS_ACCEPTED, listID="UNCL1229")
        _append_copy(line_item, _child(item, _cbc("Quantity")))
        _append_copy(line_item, _child(item, _cac("Price")))
        if _append_copy(line_item, _child(item, _cac("Item"))) is None:
            _sub(line_item, _cac("Item"))  # mandatory in LineItem
        line_reference = _sub(line, _cac("OrderLineReference"))
        _sub(line_reference, _cbc("LineID"), line_id.text)

    etree.cleanup_namespaces(root, top_nsmap=NSMAP)
    return root


# --------------------------------------------------------------------------- the handler

_registry: SchemaRegistry | None = None
_registry_lock = threading.Lock()


def _schemas() -> SchemaRegistry:
    """The OrderResponse schema, compiled on first use (libxml2 only)."""
    global _registry
    if _registry is None:
        with _registry_lock:
            if _registry is None:
                schemas = SchemaRegistry.ubl21(["OrderResponse"])
                schemas.compile(details=False)
                _registry = schemas
    return _registry


def _document(message: Message) -> etree._Element:
    if isinstance(message, XMLMessage):
        return message.document()
    if isinstance(message, TextMessage) and message.text is not None:
        return XMLMessage(message.text).document()  # the same hardened parser
    raise MessageFormatError(f"expected an XML message, got a {type(message).__name__}")


def _answer(message: Message, logger: logging.Logger) -> etree._Element:
    if message.jms_type not in (None, "Order"):  # the queue is read without a selector (see the module doc)
        raise MessageFormatError(f"orders.inbound carries UBL Orders; this message's JMSType is {message.jms_type!r}")
    order = _document(message)
    response = build_order_response(order)
    if VALIDATE_RESPONSES:
        _schemas().validate(response, "ubl-2.1/OrderResponse")
    if logger.isEnabledFor(logging.DEBUG):  # one line per order: DEBUG (hundreds a second under load)
        logger.debug(
            "order %s answered with order response %s",
            response.findtext(f"{{{CAC}}}OrderReference/{{{CBC}}}ID"),
            response.findtext(_cbc("ID")),
        )
    return response


@handler(ORDERS_QUEUE, name="order_responder")
def respond(message: Message, context: HandlerContext) -> etree._Element:
    """Answer a UBL Order with an OrderResponse that accepts it."""
    return _answer(message, context.logger)


async def _respond_async(message: Message, context: AsyncHandlerContext) -> etree._Element:
    """Answer a UBL Order with an OrderResponse that accepts it (``async def``).

    The work is a fraction of a millisecond of CPU, done on the loop: handing
    it to a thread (``asyncio.to_thread``) would cost a thread hand-over each
    way, more than it can gain. A handler with long CPU work, or a blocking
    call, does hand it over, so that the loop's other tasks are not stalled."""
    return _answer(message, context.logger)


#: :func:`respond` written ``async def``; not registered (run it with ``Worker(broker, [respond_async])``).
respond_async = handler(ORDERS_QUEUE, name="order_responder_async", registry=None)(_respond_async)
