"""The delivery's errors, inside the gateway's one hierarchy (:mod:`gateway.errors`)."""

from __future__ import annotations

from gateway.errors import GatewayError, NotFoundError

__all__ = ["BlockedAddressError", "DeliveryError", "DeliveryTransformError", "UnknownEndpointError"]


class DeliveryError(GatewayError):
    """Raised when a document cannot be queued for delivery (the engine is not running, the store refused
    the write): nothing was queued."""

    status = 503
    code = "delivery-unavailable"
    default_detail = "The document could not be queued for delivery; nothing was queued, try again later."


class UnknownEndpointError(NotFoundError):
    """Raised when a delivery names a partner, or an endpoint of that partner, that ``partners.yaml`` does
    not configure."""

    code = "unknown-endpoint"
    default_detail = "No such delivery endpoint: configure it under the partner's endpoints in partners.yaml."


class BlockedAddressError(DeliveryError):
    """Raised for an attempt whose host resolves to an address the endpoint's allow/deny list forbids
    (private ranges are denied unless the endpoint allows them): the attempt is not made."""

    code = "blocked-address"
    default_detail = "The endpoint's address is forbidden by the delivery address policy."


class DeliveryTransformError(GatewayError):
    """Raised when a route's ``deliver.transform`` fails on a document it accepted: neither the document nor
    its delivery is committed, and the partner is told to contact the operator."""

    status = 500
    code = "delivery-transform-failed"
    default_detail = "The document could not be prepared for delivery; nothing was accepted, contact the operator."
