"""Queueing a delivery: its message on the endpoint's persistent queue and its ledger row, in one commit.

Any process with the store may queue (the command line, a handler, the exchange); whichever serving
process runs the engine delivers it. The message's id is the delivery's id: the ``webhook-id`` its
receiver de-duplicates by, the same on every attempt and after a restart.
"""

from __future__ import annotations

from broker_core import Broker, BytesMessage, DeliveryMode, Queue
from gateway.delivery.config import EndpointConfig
from gateway.delivery.records import DeliveryLedger

__all__ = ["PROPERTY_CONTENT_TYPE", "PROPERTY_TARGET", "delivery_message", "queue_delivery", "queue_delivery_async"]

PROPERTY_CONTENT_TYPE = "B2BContentType"
#: the delivery's own destination, for kinds whose address comes with each delivery (``as2-mdn``)
PROPERTY_TARGET = "B2BTarget"
PROPERTY_SOURCE = "B2BSource"
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024


def delivery_message(
    endpoint: EndpointConfig, body: bytes, content_type: str, source: str, target: str | None = None
) -> BytesMessage:
    if len(body) > MAX_DOCUMENT_BYTES:
        raise ValueError(f"a delivered document may have at most {MAX_DOCUMENT_BYTES} bytes; this has {len(body)}")
    message = BytesMessage(bytes(body))
    message.set_string_property(PROPERTY_CONTENT_TYPE, content_type)
    message.set_string_property("B2BPartner", endpoint.partner)
    message.set_string_property("B2BEndpoint", endpoint.name)
    message.set_string_property(PROPERTY_SOURCE, source[:300])
    if target is not None:
        message.set_string_property(PROPERTY_TARGET, target)
    return message


def queue_delivery(
    broker: Broker,
    endpoint: EndpointConfig,
    body: bytes,
    *,
    content_type: str = "application/xml",
    source: str,
    doc_type: str | None = None,
    target: str | None = None,
) -> str:
    """Queue *body* for *endpoint* durably; returns the delivery's id (blocking: not on an event loop)."""
    message = delivery_message(endpoint, body, content_type, source, target)
    with broker.connect() as connection:
        session = connection.create_session(transacted=True)
        producer = session.create_producer(Queue(endpoint.queue))
        producer.send(message, delivery_mode=DeliveryMode.PERSISTENT)
        session.commit(
            in_transaction=[
                DeliveryLedger.insert(
                    message.jms_message_id,
                    endpoint.partner,
                    endpoint.name,
                    endpoint.kind,
                    source,
                    doc_type,
                    content_type,
                    body,
                )
            ]
        )
    return message.jms_message_id


async def queue_delivery_async(
    broker: Broker,
    endpoint: EndpointConfig,
    body: bytes,
    *,
    content_type: str = "application/xml",
    source: str,
    doc_type: str | None = None,
    target: str | None = None,
) -> str:
    """:func:`queue_delivery` for asyncio: waits for the durable commit without blocking the loop."""
    message = delivery_message(endpoint, body, content_type, source, target)
    connection = broker.connect()
    try:
        session = connection.create_session(transacted=True)
        producer = session.create_producer(Queue(endpoint.queue))
        producer.send(message, delivery_mode=DeliveryMode.PERSISTENT)
        await session.commit_async(
            in_transaction=[
                DeliveryLedger.insert(
                    message.jms_message_id,
                    endpoint.partner,
                    endpoint.name,
                    endpoint.kind,
                    source,
                    doc_type,
                    content_type,
                    body,
                )
            ]
        )
    finally:
        connection.close()
    return message.jms_message_id
