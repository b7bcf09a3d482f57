"""Where deliveries come from: a route's ``deliver:``, a handler's ``context.deliver(...)``, the exchange's
late replies and status notifications. Each stages the delivery's message on a transacted session that is
about to commit anyway, with its ledger row in the same commit: the delivery exists if and only if what
caused it was committed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lxml import etree

from broker_core import DeliveryMode, Queue
from gateway.delivery.config import EndpointConfig
from gateway.delivery.errors import DeliveryTransformError, UnknownEndpointError
from gateway.delivery.outbox import delivery_message
from gateway.delivery.records import DeliveryLedger
from gateway.errors import clip
from gateway.marked import Where, check_keys, expect_mapping, expect_str

__all__ = ["RouteDelivery", "endpoint_of", "parse_route_delivery", "route_delivery", "stage_delivery", "transformed"]


@dataclass(frozen=True)
class RouteDelivery:
    """A route's ``deliver:``: what it accepts also goes to this endpoint (through the XSLT when given)."""

    endpoint: EndpointConfig
    transform_path: Path | None = None
    transform: Any = field(default=None, repr=False)


def endpoint_of(partners: Any, partner: str, endpoint: str | None = None, *, documents: bool = False) -> EndpointConfig:
    """The endpoint *endpoint* (or the only one) of *partner* in a PartnerRegistry; UnknownEndpointError.

    With *documents* (a route's or a handler's delivery), the gateway's implicit endpoints are not among them:
    what they deliver is the gateway's own, addressed with each delivery."""
    found = partners.get(partner) if partners is not None else None
    if found is None:
        raise UnknownEndpointError(f"no partner {partner!r} is configured for deliveries")
    endpoints = {name: e for name, e in found.delivery.endpoints.items() if not (documents and e.implicit)}
    if endpoint is None:
        choices = {name: e for name, e in endpoints.items() if not e.implicit}
        if len(choices) == 1:
            return next(iter(choices.values()))
        raise UnknownEndpointError(
            f"partner {partner!r} has {len(choices)} endpoints; name one "
            f"({', '.join(sorted(choices)) or 'none configured'})"
        )
    if endpoint not in endpoints:
        raise UnknownEndpointError(
            f"partner {partner!r} has no endpoint {endpoint!r} ({', '.join(sorted(endpoints)) or 'none configured'})"
        )
    return endpoints[endpoint]


def parse_route_delivery(
    value: Any, where: Where, what: str, partners: Any, base_dir: Path, compile_xslt: Callable[[Path, Where], Any]
) -> RouteDelivery:
    """Check a route's ``deliver: {partner, endpoint, transform}`` (ConfigError with file and line)."""
    spec = expect_mapping(value, where, f"{what} deliver")
    check_keys(spec, {"partner", "endpoint", "transform"}, f"{what} deliver")
    partner = expect_str(spec.get("partner"), spec.at("partner"), f"{what} deliver.partner")
    endpoint_name = (
        expect_str(spec["endpoint"], spec.at("endpoint"), f"{what} deliver.endpoint") if "endpoint" in spec else None
    )
    try:
        endpoint = endpoint_of(partners, partner, endpoint_name, documents=True)
    except UnknownEndpointError as exc:
        raise spec.where.error(
            f"{what} deliver: {exc.detail}; add it under the partner's endpoints in partners.yaml"
        ) from None
    path = transform = None
    if spec.get("transform") is not None:
        path = (base_dir / expect_str(spec["transform"], spec.at("transform"), f"{what} deliver.transform")).resolve()
        transform = compile_xslt(path, spec.at("transform"))
    return RouteDelivery(endpoint, path, transform)


def transformed(delivery: RouteDelivery, document: bytes) -> bytes:
    """The document as the route delivers it: through its XSLT, or as accepted."""
    if delivery.transform is None:
        return document
    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)
    result = delivery.transform(etree.fromstring(document, parser))
    out = bytes(result)
    if not out.strip():
        raise ValueError(f"the delivery transform {delivery.transform_path} produced nothing")
    return out


def stage_delivery(
    producer: Any,
    endpoint: EndpointConfig,
    body: bytes,
    *,
    source: str,
    content_type: str = "application/xml",
    doc_type: str | None = None,
) -> Callable[[Any], None]:
    """Stage the delivery's message on *producer*'s transacted session; returns the ledger insert to run
    inside that session's commit (``in_transaction``)."""
    message = delivery_message(endpoint, body, content_type, clip(source, 300))
    producer.send(Queue(endpoint.queue), message, delivery_mode=DeliveryMode.PERSISTENT)
    insert = DeliveryLedger.insert(
        message.jms_message_id, endpoint.partner, endpoint.name, endpoint.kind, source, doc_type, content_type, body
    )
    insert.message_id = message.jms_message_id  # type: ignore[attr-defined]
    return insert


def route_delivery(producer: Any, route: Any, message_id: str, document: bytes) -> Callable[[Any], None]:
    """Stage the delivery a route's ``deliver:`` asks for, for the document accepted as *message_id*."""
    delivery: RouteDelivery = route.deliver
    try:
        body = transformed(delivery, document)
    except (etree.Error, ValueError) as exc:
        raise DeliveryTransformError(
            f"route {route.id}: the delivery transform failed: {clip(str(exc), 200)}; "
            "nothing was accepted, contact the operator"
        ) from None
    return stage_delivery(
        producer,
        delivery.endpoint,
        body,
        source=f"document:{message_id} route:{route.id}",
        doc_type=route.doc_type if delivery.transform is None else None,
    )
