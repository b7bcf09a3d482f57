"""The one error format of the HTTP API: RFC 9457 problem details as JSON.

Every error response, whatever the client accepts (an XML client too), is
``application/problem+json``: ``type`` is a URN built from ``code`` (the stable machine code a partner's
software switches on; both are given), ``title`` is the same for every problem of a type, ``detail`` says
what happened and what to do, and ``status`` and ``instance`` are as RFC 9457 has them. The extension
members come from the error (:meth:`gateway.errors.GatewayError.to_dict`): the document's ``errors``
(``omitted_errors`` counts those left out), an intake limit's ``limit`` and ``limit_value``, ``retry_after``
(429 and 503 ``gateway-busy``, also the ``Retry-After`` header), ``header``, and for a document accepted
before (502, 504, 409, 410) its ``message_id``, ``status_url`` and dates. docs/partner-guide.md shows them to partners.

Bodies are bounded: the errors are clipped where they are made (:mod:`gateway.errors`) and
:func:`problem_body` drops trailing ``errors`` entries until the body is under :data:`MAX_BODY_BYTES`.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

from gateway.errors import (
    AuthenticationError,
    DocumentTooLargeError,
    GatewayError,
    MethodNotAllowedError,
)
from gateway.telemetry.logs import set_problem

__all__ = ["MAX_BODY_BYTES", "PROBLEM_MEDIA_TYPE", "problem_body", "problem_response", "TITLES"]

PROBLEM_MEDIA_TYPE = "application/problem+json"
#: The largest problem body sent (bytes).
MAX_BODY_BYTES = 64 * 1024

TITLES = {
    "internal-error": "Internal error",
    "document-too-large": "Document too large",
    "unsupported-media-type": "Unsupported media type",
    "invalid-document": "Invalid document",
    "not-well-formed": "Not well-formed XML",
    "forbidden-xml": "Forbidden XML construct",
    "limit-exceeded": "Document over a limit",
    "too-many-attributes": "Too many attributes",
    "too-many-namespaces": "Too many namespace declarations",
    "too-many-document-namespaces": "Too many namespace declarations",
    "name-too-long": "Name too long",
    "text-too-long": "Text too long",
    "too-many-requests": "Too many requests",
    "rate-limited": "Rate limited",
    "too-many-concurrent-requests": "Too many concurrent requests",
    "schema-invalid": "Schema invalid",
    "business-rule-violation": "Business rule violation",
    "rules-timeout": "Business rules timeout",
    "rules-error": "Business rules error",
    "invalid-header": "Invalid header",
    "unauthenticated": "Unauthenticated",
    "key-expired": "API key expired",  # gateway.trust.errors.KeyExpiredError
    "forbidden-route": "Route not allowed",
    "not-found": "Not found",
    "method-not-allowed": "Method not allowed",
    "idempotency-conflict": "Idempotency conflict",
    "archived-replay": "Document archived",
    "document-archived": "Document archived",
    "no-route": "No route",
    "backend-error": "Back-end error",
    "store-unavailable": "Store unavailable",
    "gateway-busy": "Gateway busy",
    "reply-timeout": "Reply timeout",
    "config-error": "Configuration error",
    "unknown-schema": "Configuration error",
}


def problem_body(error: GatewayError, instance: str | None = None) -> dict[str, Any]:
    """The RFC 9457 body of *error* (bounded: see :data:`MAX_BODY_BYTES`)."""
    fields = error.to_dict()
    code = fields.pop("code")
    body: dict[str, Any] = {
        "type": f"urn:b2bgw:problem:{code}",
        "title": TITLES.get(code, "Error"),
        "status": error.status,
        "detail": fields.pop("detail"),
    }
    fields.pop("status", None)
    if instance:
        body["instance"] = instance[:300]
    body["code"] = code
    body.update(fields)
    errors = body.get("errors")
    if errors:
        encoded = json.dumps(body, ensure_ascii=False)
        dropped = 0
        while len(encoded.encode("utf-8")) > MAX_BODY_BYTES and errors:
            errors.pop()
            dropped += 1
            encoded = json.dumps(body, ensure_ascii=False)
        if dropped:
            body["omitted_errors"] = body.get("omitted_errors", 0) + dropped
    return body


def problem_response(
    error: GatewayError, instance: str | None = None, headers: dict[str, str] | None = None
) -> Response:
    """The HTTP response for *error*."""
    set_problem(error.code)  # the log line and the refusal metric of this request name it
    body = json.dumps(problem_body(error, instance), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    out = {"Cache-Control": "no-store"}
    if isinstance(error, AuthenticationError):
        out["WWW-Authenticate"] = 'Bearer realm="b2bgw"'
    if isinstance(error, MethodNotAllowedError) and error.allowed:
        out["Allow"] = ", ".join(error.allowed)
    if isinstance(error, DocumentTooLargeError):
        out["Connection"] = "close"  # the rest of the body is never read
    retry_after = getattr(error, "retry_after", None)  # 429s and 503 gateway-busy
    if retry_after is not None:
        out["Retry-After"] = str(retry_after)
    message_id = getattr(error, "message_id", None)
    if message_id:
        out["X-Message-ID"] = message_id
    correlation_id = getattr(error, "correlation_id", None)
    if correlation_id:
        out["X-Correlation-ID"] = correlation_id
    if headers:
        out.update(headers)
    return Response(body, status_code=error.status, headers=out, media_type=PROBLEM_MEDIA_TYPE)
