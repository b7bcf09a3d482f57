"""What operators do to dead deliveries: replay (back to the endpoint's queue, a fresh count of attempts and
age) or discard (gone from the dead-letter queue, kept in the ledger as ``discarded``); each is audited."""

from __future__ import annotations

from collections.abc import Sequence

from broker_core import Broker, Queue
from gateway.admin.audit import Audit
from gateway.delivery.config import EndpointConfig
from gateway.delivery.records import DeliveryLedger

__all__ = ["discard", "replay"]


def replay(
    broker: Broker,
    endpoint: EndpointConfig,
    message_ids: Sequence[str] | None,
    *,
    operator: str,
    role: str = "operator",
    client: str | None = None,
) -> list[str]:
    """Move dead deliveries of *endpoint* (those named, else all) back to its queue; returns their ids."""
    dead = [m.jms_message_id for m in broker.browse(Queue(endpoint.dead_queue), limit=1000)]
    ids = [i for i in dead if i in set(message_ids)] if message_ids else dead
    if not ids:
        _audit(broker, "delivery-replay", endpoint, [], operator, role, client)
        return []
    # the ledger first: the engine may take a moved message at once, and counts attempts from the ledger
    broker.write(DeliveryLedger.set_status(ids, "pending", requeue=True))
    moved = broker.move_messages(Queue(endpoint.dead_queue), Queue(endpoint.queue), message_ids=ids)
    missed = sorted(set(ids) - set(moved))
    if missed:
        broker.write(DeliveryLedger.set_status(missed, "dead"))
    _audit(broker, "delivery-replay", endpoint, moved, operator, role, client)
    return moved


def discard(
    broker: Broker,
    endpoint: EndpointConfig,
    message_ids: Sequence[str] | None,
    *,
    operator: str,
    role: str = "operator",
    client: str | None = None,
) -> list[str]:
    """Delete dead deliveries of *endpoint* (those named, else all); returns their ids."""
    ids = list(message_ids) if message_ids else None
    removed = broker.remove_messages(Queue(endpoint.dead_queue), message_ids=ids)
    if removed:
        broker.write(DeliveryLedger.set_status(removed, "discarded"))
    _audit(broker, "delivery-discard", endpoint, removed, operator, role, client)
    return removed


def _audit(
    broker: Broker, action: str, endpoint: EndpointConfig, ids: list[str], operator: str, role: str, client: str | None
) -> None:
    if broker.engine is None:
        return
    Audit(broker.engine, broker).record(
        operator=operator,
        role=role,
        action=action,
        target=f"{endpoint.partner}/{endpoint.name}",
        message_ids=ids,
        count=len(ids),
        client=client,
    )
