"""Sample handlers that take the one-way documents of the sample routes.

The sample routes (``routes/ubl-2.1.yaml``) send Invoices to
``invoices.inbound``, DespatchAdvices to ``despatch.inbound`` and
OrderChanges and OrderCancellations to ``orders.changes``. A document is
*delivered* once a consumer has taken it (the gateway's reconciler then
moves its status to ``delivered``), and only delivered documents go to the
warehouse in the nightly load. Importing this module registers one handler
per queue in :data:`gateway.handlers.registry`; each records what it took
(:data:`RECEIVED`, and a log line) and acknowledges it by committing. A back
end puts its own work where the sample records.

They are ``async def`` handlers (the worker runs them on its event loop),
with ``prefetch`` 16: the work per document is small, so claiming several at
once saves store transactions. A message that is not the UBL document its
queue carries can never be processed: it is rejected
(:class:`~gateway.handlers.Reject`), dead-lettered at once with the reason,
instead of being redelivered ``max_deliveries`` times.
"""

from __future__ import annotations

import collections
import dataclasses
import time

from lxml import etree

from broker_core import JMSError, Message, TextMessage, XMLMessage
from gateway.handlers import AsyncHandlerContext, Reject, handler

__all__ = [
    "DESPATCH_QUEUE",
    "INVOICES_QUEUE",
    "ORDER_CHANGES_QUEUE",
    "RECEIVED",
    "Receipt",
    "receive_despatch_advice",
    "receive_invoice",
    "receive_order_change",
]

INVOICES_QUEUE = "invoices.inbound"
DESPATCH_QUEUE = "despatch.inbound"
ORDER_CHANGES_QUEUE = "orders.changes"

_UBL = "urn:oasis:names:specification:ubl:schema:xsd:"
CAC = _UBL + "CommonAggregateComponents-2"
CBC = _UBL + "CommonBasicComponents-2"
_ORDER_ID = f"{{{CAC}}}OrderReference/{{{CBC}}}ID"

#: How many receipts :data:`RECEIVED` keeps.
KEEP = 1000


@dataclasses.dataclass(frozen=True)
class Receipt:
    """One document taken: its type, ``cbc:ID``, the order it refers to (if
    any), its message id, the sending partner (``JMSXUserID``) and when."""

    doc_type: str
    doc_id: str | None
    order_id: str | None
    message_id: str | None
    partner: str | None
    received_at: float


#: The last :data:`KEEP` documents taken, oldest first (for a look from a shell or a test).
RECEIVED: collections.deque[Receipt] = collections.deque(maxlen=KEEP)


def _root(message: Message) -> etree._Element:
    try:
        if isinstance(message, XMLMessage):
            return message.document()
        if isinstance(message, TextMessage) and message.text is not None:
            return XMLMessage(message.text).document()  # the same hardened parser
    except JMSError as exc:
        raise Reject(f"the body is not well-formed XML: {exc}") from None
    raise Reject(f"expected an XML document, got a {type(message).__name__}")


def _receive(message: Message, context: AsyncHandlerContext, queue: str, *doc_types: str) -> Receipt:
    root = _root(message)
    name = etree.QName(root)
    if name.localname not in doc_types or name.namespace != f"{_UBL}{name.localname}-2":
        raise Reject(
            f"{queue} carries UBL {' and '.join(doc_types)} documents, not {{{name.namespace}}}{name.localname}"
        )
    partner = message.get_string_property("JMSXUserID") if message.property_exists("JMSXUserID") else None
    receipt = Receipt(
        name.localname,
        root.findtext(f"{{{CBC}}}ID"),
        root.findtext(_ORDER_ID),
        message.jms_message_id,
        partner,
        time.time(),
    )
    RECEIVED.append(receipt)
    context.logger.info(
        "%s %s (order %s) from %s received as %s",
        receipt.doc_type,
        receipt.doc_id,
        receipt.order_id,
        receipt.partner,
        receipt.message_id,
    )
    return receipt


@handler(INVOICES_QUEUE, name="invoice_receiver", prefetch=16)
async def receive_invoice(message: Message, context: AsyncHandlerContext) -> None:
    """Take a UBL Invoice."""
    _receive(message, context, INVOICES_QUEUE, "Invoice")


@handler(DESPATCH_QUEUE, name="despatch_advice_receiver", prefetch=16)
async def receive_despatch_advice(message: Message, context: AsyncHandlerContext) -> None:
    """Take a UBL DespatchAdvice."""
    _receive(message, context, DESPATCH_QUEUE, "DespatchAdvice")


@handler(ORDER_CHANGES_QUEUE, name="order_change_receiver", prefetch=16)
async def receive_order_change(message: Message, context: AsyncHandlerContext) -> None:
    """Take a UBL OrderChange or OrderCancellation."""
    _receive(message, context, ORDER_CHANGES_QUEUE, "OrderChange", "OrderCancellation")
