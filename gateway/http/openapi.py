"""The OpenAPI 3.1 description of the HTTP API (served at ``/openapi.json``).

It states what the server enforces, and is checked against the running app
by a schema-driven fuzzer (``tests/gateway/http/test_openapi.py``): the header
patterns are the ones :mod:`gateway.http.app` matches (:data:`IDEMPOTENCY_KEY_PATTERN`,
:data:`CORRELATION_ID_PATTERN`, defined here and compiled there), the body
limit is the configured one, and every error response lists the problem
``code`` values it can carry. Those come from :mod:`gateway.errors` itself:
each :class:`~gateway.errors.GatewayError` subclass appears under its
``status`` with its ``code`` in the operations that can answer that status
(a new error class appears here without an edit; a new status is added to
:data:`_POST_STATUSES` / :data:`_READ_STATUSES`). A 500 is never documented:
the server answers one only for a bug.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway import errors

__all__ = ["CORRELATION_ID_PATTERN", "IDEMPOTENCY_KEY_PATTERN", "openapi_document", "problem_codes"]

#: ``Idempotency-Key``: 1 to 200 printable ASCII characters, spaces inside but not at either end (HTTP strips
#: those around a field value, and so does the gateway).
IDEMPOTENCY_KEY_PATTERN = r"^[!-~](?:[ -~]{0,198}[!-~])?$"
#: ``X-Correlation-ID``: 1 to 128 printable ASCII characters, no spaces.
CORRELATION_ID_PATTERN = r"^[!-~]{1,128}$"

#: The statuses ``POST /v1/documents`` can answer with a problem (the 429 once an error class has it).
_POST_STATUSES = (400, 401, 403, 409, 413, 415, 422, 429, 502, 503, 504)
#: ... and the reads of a partner's documents.
_READ_STATUSES = (401, 404, 410, 429, 503)

_XML_TYPES = ("application/xml", "text/xml", "application/ubl+xml")

_DESCRIPTIONS = {
    400: "The document is not well-formed XML, uses a construct the gateway refuses (a DOCTYPE, an entity, too "
    "deep or too many elements), is over an intake limit (`too-many-attributes`, `too-many-namespaces`, "
    "`too-many-document-namespaces`, `name-too-long`, `text-too-long`: `limit` and `limit_value` name it), "
    "is not valid against its schema (`errors` lists each problem with line, "
    "column, element path and message), or breaks a business rule of its route (`business-rule-violation`: "
    "`errors` lists each failed rule with its id, flag, location and text); or a request header is malformed "
    "(`header` names it).",
    401: "No API key, or one the gateway does not know (`WWW-Authenticate: Bearer`).",
    403: "The partner may not use the route the document matched.",
    404: "No such document for your partner account (another partner's documents are not found either).",
    409: "Another document was accepted before under the same idempotency key (the `Idempotency-Key`, or by "
    "default the document type, sender party and document id) and differs from this one: this one was not "
    "accepted. `message_id` and `status_url` name the first document. `archived-replay`: the document "
    "accepted under that key has been archived by the retention policy since (`archived_at`); this one was "
    "not accepted again.",
    410: "The document was yours, and the retention policy has archived it (or purged it) since: it is no longer "
    "online. `archived_at` says when; the operator can retrieve it from the archive.",
    413: "The body is larger than the gateway accepts.",
    415: "The Content-Type is not an XML media type, or names a charset the gateway does not decode.",
    422: "The document is valid, but no route takes it (the detail names its root element and the partner), or "
    "its route's business rules could not be run on it within their budget (`rules-timeout`, `rules-error`).",
    429: "The partner is over its concurrent requests or its rate (`code` says which), or the client's address "
    "sent too many requests whose API key failed lately (`authentication-throttled`: no key is checked "
    "until the wait is over); nothing of the request was read or done: retry after `Retry-After` seconds.",
    502: "Request-reply: the back end answered with an error. The document was accepted (`message_id`, "
    "`status_url`): do not resend it.",
    503: "The gateway's store is unavailable, or the gateway is starting or stopping (`store-unavailable`), or "
    "too loaded to finish the document's work in time (`gateway-busy`, with `Retry-After`), or too many API "
    "keys wait for their first check (`authentication-busy`, with `Retry-After`): nothing was accepted, "
    "retry.",
    504: "Request-reply: no reply in time. The document was accepted (`message_id`, `status_url`): its status "
    "and the reply once it comes are at `status_url`; do not resend it.",
}

_EXAMPLE_INVOICE = """<?xml version="1.0" encoding="UTF-8"?>
<Invoice xmlns="urn:oasis:names:specification:ubl:schema:xsd:Invoice-2"
  xmlns:cac="urn:oasis:names:specification:ubl:schema:xsd:CommonAggregateComponents-2"
  xmlns:cbc="urn:oasis:names:specification:ubl:schema:xsd:CommonBasicComponents-2">
  <cbc:ID>123</cbc:ID>
  <cbc:IssueDate>2011-09-22</cbc:IssueDate>
  <cac:AccountingSupplierParty><cac:Party>
    <cbc:EndpointID schemeID="GLN">7300010000001</cbc:EndpointID>
    <cac:PartyName><cbc:Name>Custom Cotter Pins</cbc:Name></cac:PartyName>
  </cac:Party></cac:AccountingSupplierParty>
  <cac:AccountingCustomerParty><cac:Party>
    <cac:PartyName><cbc:Name>North American Veeblefetzer</cbc:Name></cac:PartyName>
  </cac:Party></cac:AccountingCustomerParty>
  <cac:LegalMonetaryTotal><cbc:PayableAmount currencyID="CAD">100.00</cbc:PayableAmount></cac:LegalMonetaryTotal>
  <cac:InvoiceLine>
    <cbc:ID>1</cbc:ID>
    <cbc:LineExtensionAmount currencyID="CAD">100.00</cbc:LineExtensionAmount>
    <cac:Item><cbc:Description>Cotter pin, MIL-SPEC</cbc:Description></cac:Item>
  </cac:InvoiceLine>
</Invoice>
"""

_EXAMPLE_ORDER = """<?xml version="1.0" encoding="UTF-8"?>
<Order xmlns="urn:oasis:names:specification:ubl:schema:xsd:Order-2"
  xmlns:cac="urn:oasis:names:specification:ubl:schema:xsd:CommonAggregateComponents-2"
  xmlns:cbc="urn:oasis:names:specification:ubl:schema:xsd:CommonBasicComponents-2">
  <cbc:UBLVersionID>2.1</cbc:UBLVersionID>
  <cbc:ID>PO-1001</cbc:ID>
  <cbc:IssueDate>2024-03-14</cbc:IssueDate>
  <cbc:DocumentCurrencyCode>EUR</cbc:DocumentCurrencyCode>
  <cac:BuyerCustomerParty><cac:Party>
    <cbc:EndpointID schemeID="GLN">7300072311115</cbc:EndpointID>
    <cac:PartyName><cbc:Name>Johnssons byggvaror</cbc:Name></cac:PartyName>
  </cac:Party></cac:BuyerCustomerParty>
  <cac:SellerSupplierParty><cac:Party>
    <cbc:EndpointID schemeID="GLN">7302347231111</cbc:EndpointID>
    <cac:PartyName><cbc:Name>Moderna Produkter AB</cbc:Name></cac:PartyName>
  </cac:Party></cac:SellerSupplierParty>
  <cac:OrderLine><cac:LineItem>
    <cbc:ID>1</cbc:ID>
    <cbc:Quantity unitCode="C62">10</cbc:Quantity>
    <cac:Price><cbc:PriceAmount currencyID="EUR">12.50</cbc:PriceAmount></cac:Price>
    <cac:Item><cbc:Name>Pencil</cbc:Name></cac:Item>
  </cac:LineItem></cac:OrderLine>
</Order>
"""

_PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
_STRING = {"type": "string"}


def _error_classes() -> list[type[errors.GatewayError]]:
    found: list[type[errors.GatewayError]] = []
    pending: list[type[errors.GatewayError]] = [errors.GatewayError]
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return found


def problem_codes(status: int) -> list[str]:
    """The problem ``code`` values the gateway's partner-facing errors carry with *status*, sorted."""
    return sorted({cls.code for cls in _error_classes() if cls.status == status and cls.partner_facing})


def _problem_response(
    status: int, *, headers: dict[str, Any] | None = None, required: Iterable[str] = (), description: str | None = None
) -> dict[str, Any] | None:
    codes = problem_codes(status)
    if not codes:
        return None
    schema: dict[str, Any] = {
        "allOf": [
            _PROBLEM_REF,
            {
                "properties": {"status": {"const": status}, "code": {"enum": codes}},
                **({"required": sorted(required)} if required else {}),
            },
        ]
    }
    response: dict[str, Any] = {
        "description": description or _DESCRIPTIONS[status],
        "content": {"application/problem+json": {"schema": schema}},
    }
    if headers:
        response["headers"] = headers
    return response


def _header(description: str, *, required: bool = True, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": description, "required": required, "schema": schema or _STRING}


_ACCEPTED_HEADERS = {
    "X-Message-ID": _header("The message id the document was accepted as."),
    "X-Correlation-ID": _header("The correlation id: yours, or the one the gateway made."),
}
_RAW_DOCUMENT_HEADERS = {
    "Content-Disposition": _header('`attachment; filename="<message id>-reply.xml"`: save it, never render it.'),
    "X-Content-Type-Options": _header("`nosniff`."),
    "Content-Security-Policy": _header("`default-src 'none'; sandbox`: nothing in it may load or run."),
}
_WWW_AUTHENTICATE = {"WWW-Authenticate": _header('`Bearer realm="b2bgw"`.')}
_RETRY_AFTER = {"Retry-After": _header("Seconds to wait before retrying.", schema={"type": "integer", "minimum": 1})}


def _error_responses(statuses: Iterable[int], *, read: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for status in statuses:
        kwargs: dict[str, Any] = {}
        if status == 401:
            kwargs["headers"] = _WWW_AUTHENTICATE
        elif status == 429:
            kwargs["headers"] = _RETRY_AFTER
            kwargs["required"] = ("retry_after",)
        elif status == 503:
            kwargs["headers"] = {
                "Retry-After": {
                    **_RETRY_AFTER["Retry-After"],
                    "required": False,
                    "description": "`gateway-busy` and `authentication-busy`: seconds to wait before retrying.",
                }
            }
        elif status == 409:
            kwargs["required"] = ("message_id", "status_url")
        elif status in (502, 504):
            kwargs["required"] = ("message_id", "correlation_id", "status_url")
            kwargs["headers"] = _ACCEPTED_HEADERS
        elif status == 410:
            kwargs["required"] = ("message_id", "status_url", "received_at", "archived_at")
        elif status == 404 and read:
            kwargs["description"] = (
                "No such document for your partner account (another partner's documents are "
                "not found either), or no reply yet."
            )
        response = _problem_response(status, **kwargs)
        if response is not None:
            out[str(status)] = response
    return out


def _components() -> dict[str, Any]:
    return {
        "securitySchemes": {
            "partnerKey": {
                "type": "http",
                "scheme": "bearer",
                "description": "The partner's API key: `<key id>.<secret>`.",
            },
        },
        "parameters": {
            "IdempotencyKey": {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "schema": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": IDEMPOTENCY_KEY_PATTERN},
                "description": "Your key for this document, scoped to your partner account: a document posted "
                "again with the same key and the same body gets the first answer again "
                "(`Idempotent-Replayed: true`), another body 409. Without it the key is the "
                "document type, its sender party (the buyer of an order, the supplier of an "
                "invoice...) and its document id. See docs/idempotency.md.",
                "examples": {"plain": {"value": "inv-2024-0042"}, "spaced": {"value": "batch 7 / order 42"}},
            },
            "CorrelationId": {
                "name": "X-Correlation-ID",
                "in": "header",
                "required": False,
                "schema": {"type": "string", "minLength": 1, "maxLength": 128, "pattern": CORRELATION_ID_PATTERN},
                "description": "Your correlation id (printable ASCII, no spaces); the gateway makes one when absent.",
                "example": "po-4711",
            },
            "MessageId": {
                "name": "message_id",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "minLength": 1},
                "description": "The message id a document was accepted as (its receipt's `message_id`).",
            },
        },
        "schemas": {
            "Problem": {
                "description": "An RFC 9457 problem; `code` is the stable machine code to switch on.",
                "type": "object",
                "required": ["type", "title", "status", "detail", "code"],
                "properties": {
                    "type": {"type": "string", "format": "uri", "example": "urn:b2bgw:problem:schema-invalid"},
                    "title": _STRING,
                    "status": {"type": "integer"},
                    "detail": {"type": "string", "maxLength": errors.MAX_DETAIL_CHARS},
                    "instance": _STRING,
                    "code": {"type": "string", "enum": sorted({c.code for c in _error_classes() if c.partner_facing})},
                    "errors": {"type": "array", "items": {"$ref": "#/components/schemas/DocumentError"}},
                    "omitted_errors": {"type": "integer", "minimum": 1},
                    "header": _STRING,
                    "limit": {"type": "string", "description": "400, an intake limit passed: its `limits:` key."},
                    "limit_value": {"type": "integer", "description": "That limit's configured value."},
                    "retry_after": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "429, 503 `gateway-busy` and 503 `authentication-busy`: seconds "
                        "to wait before retrying (also `Retry-After`).",
                    },
                    "message_id": _STRING,
                    "correlation_id": _STRING,
                    "status_url": _STRING,
                    "received_at": {"type": "string", "format": "date-time"},
                    "archived_at": {"type": "string", "format": "date-time"},
                },
            },
            "DocumentError": {
                "type": "object",
                "required": ["line", "column", "path", "message"],
                "properties": {
                    "line": {"type": ["integer", "null"]},
                    "column": {"type": ["integer", "null"]},
                    "path": {"type": ["string", "null"], "example": "/Order/cac:OrderLine[2]/cbc:Quantity"},
                    "message": _STRING,
                    "id": {"type": ["string", "null"], "description": "business-rule-violation: the rule's id"},
                    "flag": {"type": ["string", "null"], "description": "business-rule-violation: its flag"},
                    "location": {"type": "string", "description": "business-rule-violation: XPath of the node"},
                    "text": {"type": "string", "description": "business-rule-violation: the rule's text"},
                },
            },
            "RuleWarning": {
                "type": "object",
                "description": "A business rule finding that does not refuse the document (flag warning, information).",
                "properties": {
                    "id": {"type": ["string", "null"]},
                    "flag": {"type": ["string", "null"]},
                    "location": _STRING,
                    "text": _STRING,
                    "diagnostics": {"type": "array", "items": _STRING},
                },
            },
            "Receipt": {
                "type": "object",
                "required": [
                    "message_id",
                    "correlation_id",
                    "route",
                    "document_type",
                    "document_id",
                    "status",
                    "received_at",
                    "status_url",
                ],
                "properties": {
                    "message_id": {"type": "string", "example": "ID:3f2a9c1b7d4e5f60-42"},
                    "correlation_id": _STRING,
                    "route": {"type": "string", "example": "ubl-invoice"},
                    "document_type": {"type": "string", "example": "Invoice"},
                    "document_id": {"type": ["string", "null"]},
                    "status": {"type": "string", "enum": ["accepted"]},
                    "received_at": {"type": "string", "format": "date-time"},
                    "status_url": {"type": "string", "example": "/v1/documents/ID:3f2a9c1b7d4e5f60-42"},
                    "warnings": {
                        "type": "array",
                        "items": {"$ref": "#/components/schemas/RuleWarning"},
                        "description": "Business rule warnings (flags warning, information), when any.",
                    },
                },
            },
            "DocumentStatus": {
                "type": "object",
                "required": [
                    "message_id",
                    "correlation_id",
                    "route",
                    "document_type",
                    "document_id",
                    "status",
                    "received_at",
                    "updated_at",
                    "history",
                    "reply",
                    "reply_type",
                    "reply_url",
                    "error",
                ],
                "properties": {
                    "message_id": _STRING,
                    "correlation_id": _STRING,
                    "route": _STRING,
                    "document_type": _STRING,
                    "document_id": {"type": ["string", "null"]},
                    "status": {
                        "type": "string",
                        "enum": ["accepted", "delivered", "replied", "failed", "dead_lettered"],
                    },
                    "received_at": {"type": "string", "format": "date-time"},
                    "updated_at": {"type": "string", "format": "date-time"},
                    "history": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["status", "at"],
                            "properties": {"status": _STRING, "at": {"type": "string", "format": "date-time"}},
                        },
                    },
                    "reply": {"type": ["string", "null"], "description": "The reply document (XML text), once there."},
                    "reply_type": {"type": ["string", "null"]},
                    "reply_url": {"type": ["string", "null"]},
                    "error": {"type": ["string", "null"]},
                    "warnings": {"type": "array", "items": {"$ref": "#/components/schemas/RuleWarning"}},
                },
            },
            "Health": {"type": "object", "required": ["status"], "properties": {"status": _STRING}},
        },
    }


def _post_documents(max_body_bytes: int | None) -> dict[str, Any]:
    limit = f" at most {max_body_bytes} bytes" if max_body_bytes else ""
    replayed = _header(
        "`true` when this is the first answer to the same document, posted again.",
        required=False,
        schema={"type": "string", "enum": ["true"]},
    )
    return {
        "operationId": "postDocument",
        "summary": "Submit an XML business document",
        "description": (
            f"The body is one XML document,{limit}, in UTF-8 unless its XML declaration, byte order mark or the "
            "Content-Type's `charset` says otherwise. Any `application/*+xml` media type is accepted too. The "
            "document is parsed safely (no DOCTYPE, no entities), validated against the schema of its type, "
            "routed, and stored durably before the answer."
        ),
        "parameters": [
            {"$ref": "#/components/parameters/IdempotencyKey"},
            {"$ref": "#/components/parameters/CorrelationId"},
        ],
        "requestBody": {
            "required": True,
            "content": {
                media_type: {
                    "schema": {"type": "string", "minLength": 1},
                    "examples": {
                        "invoice": {"summary": "A UBL 2.1 invoice (a one-way route)", "value": _EXAMPLE_INVOICE},
                        "order": {"summary": "A UBL 2.1 order (a request-reply route)", "value": _EXAMPLE_ORDER},
                    },
                }
                for media_type in _XML_TYPES
            },
        },
        "responses": {
            "200": {
                "description": "Request-reply route: the reply document (e.g. a UBL OrderResponse).",
                "headers": {
                    **_ACCEPTED_HEADERS,
                    "X-Route-ID": _header("The route that took the document."),
                    "Content-Location": _header("The document's status: `/v1/documents/{message_id}`."),
                    "Idempotent-Replayed": replayed,
                },
                "content": {"application/xml": {"schema": _STRING}},
                "links": {
                    "status": {
                        "operationId": "getDocument",
                        "parameters": {"message_id": "$response.header.X-Message-ID"},
                    }
                },
            },
            "202": {
                "description": "One-way route: accepted and durably stored.",
                "headers": {
                    **_ACCEPTED_HEADERS,
                    "X-Route-ID": _header("The route that took the document."),
                    "Location": _header("The document's status: `/v1/documents/{message_id}`."),
                    "Idempotent-Replayed": replayed,
                },
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Receipt"}}},
                "links": {
                    "status": {"operationId": "getDocument", "parameters": {"message_id": "$response.body#/message_id"}}
                },
            },
            **_error_responses(_POST_STATUSES),
        },
    }


def openapi_document(
    version: str = "0.1.0", *, max_body_bytes: int | None = None, noop_endpoint: bool = False
) -> dict[str, Any]:
    """The OpenAPI document (a fresh dict); *max_body_bytes*: the configured body limit, stated in it."""
    reads = _error_responses(_READ_STATUSES, read=True)
    message_id = [{"$ref": "#/components/parameters/MessageId"}]
    not_ready = _problem_response(
        503, description="Not ready: the store does not answer, or the gateway is starting or stopping."
    )
    health = {"application/json": {"schema": {"$ref": "#/components/schemas/Health"}}}
    paths: dict[str, Any] = {
        "/v1/documents": {"post": _post_documents(max_body_bytes)},
        "/v1/documents/{message_id}": {
            "get": {
                "operationId": "getDocument",
                "summary": "Status of one of your documents, with its history and the reply once there",
                "parameters": message_id,
                "responses": {
                    "200": {
                        "description": "The document's status.",
                        "headers": {"X-Correlation-ID": _header("The document's correlation id.")},
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DocumentStatus"}}},
                    },
                    **reads,
                },
            },
        },
        "/v1/documents/{message_id}/reply": {
            "get": {
                "operationId": "getReply",
                "summary": "The reply document itself",
                "parameters": message_id,
                "responses": {
                    "200": {
                        "description": "The reply, as a download that no browser runs (docs/security.md).",
                        "headers": {**_ACCEPTED_HEADERS, **_RAW_DOCUMENT_HEADERS},
                        "content": {"application/xml": {"schema": _STRING}},
                    },
                    **reads,
                },
            },
        },
        "/healthz": {
            "get": {
                "operationId": "healthz",
                "summary": "Liveness",
                "security": [],
                "responses": {"200": {"description": "The process is up.", "content": health}},
            }
        },
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "summary": "Readiness: the store is reachable",
                "security": [],
                "responses": {
                    "200": {"description": "Ready.", "content": health},
                    **({"503": not_ready} if not_ready else {}),
                },
            }
        },
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "summary": "This document",
                "security": [],
                "responses": {
                    "200": {
                        "description": "OpenAPI 3.1",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        },
    }
    if noop_endpoint:
        paths["/v1/noop"] = {
            "post": {
                "operationId": "noop",
                "summary": "Read the body and answer 202 (the HTTP stack alone, for benchmarks)",
                "security": [],
                "requestBody": {"required": False, "content": {"application/xml": {"schema": _STRING}}},
                "responses": {
                    "202": {
                        "description": "The body's size.",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["status", "bytes"],
                                    "properties": {
                                        "status": {"const": "noop"},
                                        "bytes": {"type": "integer", "minimum": 0},
                                    },
                                }
                            }
                        },
                    },
                    **_error_responses((400, 413)),
                },
            }
        }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "b2bgw: B2B XML integration gateway",
            "version": version,
            "description": (
                "Partners post XML business documents (OASIS UBL 2.1 and configured families). The gateway "
                "authenticates the partner, parses the document safely, validates it against its schema, routes it "
                "and stores it durably before answering. Every error is an RFC 9457 problem "
                "(`application/problem+json`) whose `code` member is the stable machine code; each response below "
                "lists the codes it can carry."
            ),
        },
        "components": _components(),
        "security": [{"partnerKey": []}],
        "paths": paths,
    }
