"""The OpenAPI 3.1 description of the HTTP API (served at ``/openapi.json``)."""

from __future__ import annotations

from typing import Any

__all__ = ["openapi_document"]

_PROBLEM = {"$ref": "#/components/schemas/Problem"}


def _problem(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/problem+json": {"schema": _PROBLEM}}}


#: The codes of the intake limits (400) and of the partner request limits (429); see docs/limits.md.
LIMIT_CODES = ["too-many-attributes", "too-many-namespaces", "too-many-document-namespaces", "name-too-long",
               "text-too-long", "rate-limited", "too-many-concurrent-requests"]


def _too_many_requests() -> dict[str, Any]:
    response = _problem("The partner is over its concurrent requests or its rate (`code` says which); nothing of "
                        "the request was read or done: retry after `Retry-After` seconds.")
    response["headers"] = {"Retry-After": {"schema": {"type": "integer", "minimum": 1},
                                           "description": "Seconds to wait before retrying."}}
    return response


def openapi_document(version: str = "0.1.0") -> dict[str, Any]:
    """The OpenAPI document (a fresh dict)."""
    auth_errors = {
        "401": _problem("Missing or unknown API key (`WWW-Authenticate: Bearer`)."),
        "429": _too_many_requests(),
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
                "(`application/problem+json`) whose `code` member is the stable machine code."
            ),
        },
        "components": {
            "securitySchemes": {
                "partnerKey": {"type": "http", "scheme": "bearer", "description": "The partner's API key: `<key id>.<secret>`."},
            },
            "schemas": {
                "Problem": {
                    "type": "object",
                    "required": ["type", "title", "status", "detail", "code"],
                    "properties": {
                        "type": {"type": "string", "format": "uri", "example": "urn:b2bgw:problem:schema-invalid"},
                        "title": {"type": "string"},
                        "status": {"type": "integer"},
                        "detail": {"type": "string"},
                        "instance": {"type": "string"},
                        "code": {
                            "type": "string",
                            "enum": [
                                "not-well-formed", "forbidden-xml", "schema-invalid", "invalid-header",
                                "unauthenticated", "forbidden-route", "not-found", "method-not-allowed",
                                "document-too-large", "unsupported-media-type", "no-route", "internal-error",
                                "backend-error", "store-unavailable", "reply-timeout",
                                *LIMIT_CODES,
                            ],
                        },
                        "errors": {"type": "array", "items": {"$ref": "#/components/schemas/DocumentError"}},
                        "omitted_errors": {"type": "integer"},
                        "header": {"type": "string"},
                        "limit": {"type": "string", "description": "The intake limit passed (its limits: key)."},
                        "limit_value": {"type": "integer", "description": "That limit's configured value."},
                        "retry_after": {"type": "integer", "description": "429: seconds to wait (Retry-After)."},
                        "message_id": {"type": "string"},
                        "correlation_id": {"type": "string"},
                        "status_url": {"type": "string"},
                    },
                },
                "DocumentError": {
                    "type": "object",
                    "properties": {
                        "line": {"type": ["integer", "null"]},
                        "column": {"type": ["integer", "null"]},
                        "path": {"type": ["string", "null"], "example": "/Order/cac:OrderLine[2]/cbc:Quantity"},
                        "message": {"type": "string"},
                    },
                },
                "Receipt": {
                    "type": "object",
                    "required": ["message_id", "correlation_id", "route", "status", "status_url"],
                    "properties": {
                        "message_id": {"type": "string", "example": "ID:3f2a9c1b7d4e5f60-42"},
                        "correlation_id": {"type": "string"},
                        "route": {"type": "string", "example": "ubl-invoice"},
                        "document_type": {"type": "string", "example": "Invoice"},
                        "document_id": {"type": ["string", "null"]},
                        "status": {"type": "string", "enum": ["accepted"]},
                        "received_at": {"type": "string", "format": "date-time"},
                        "status_url": {"type": "string", "example": "/v1/documents/ID:3f2a9c1b7d4e5f60-42"},
                    },
                },
                "DocumentStatus": {
                    "type": "object",
                    "properties": {
                        "message_id": {"type": "string"},
                        "correlation_id": {"type": "string"},
                        "route": {"type": "string"},
                        "document_type": {"type": "string"},
                        "document_id": {"type": ["string", "null"]},
                        "status": {"type": "string",
                                   "enum": ["accepted", "delivered", "replied", "failed", "dead_lettered"]},
                        "received_at": {"type": "string", "format": "date-time"},
                        "updated_at": {"type": "string", "format": "date-time"},
                        "history": {"type": "array", "items": {
                            "type": "object",
                            "properties": {"status": {"type": "string"}, "at": {"type": "string", "format": "date-time"}},
                        }},
                        "reply": {"type": ["string", "null"], "description": "The reply document (XML text), once there."},
                        "reply_type": {"type": ["string", "null"]},
                        "reply_url": {"type": ["string", "null"]},
                        "error": {"type": ["string", "null"]},
                    },
                },
            },
        },
        "security": [{"partnerKey": []}],
        "paths": {
            "/v1/documents": {
                "post": {
                    "summary": "Submit an XML business document",
                    "parameters": [
                        {"name": "Idempotency-Key", "in": "header", "required": False,
                         "schema": {"type": "string", "maxLength": 200},
                         "description": "Replays with the same key return the first answer; default key: partner + "
                                        "document type + document id (cbc:ID)."},
                        {"name": "X-Correlation-ID", "in": "header", "required": False,
                         "schema": {"type": "string", "maxLength": 128, "pattern": "^[!-~]+$"},
                         "description": "Your correlation id (printable ASCII); generated when absent."},
                    ],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/xml": {"schema": {"type": "string"}},
                            "text/xml": {"schema": {"type": "string"}},
                        },
                    },
                    "responses": {
                        "200": {"description": "Request-reply route: the reply document (e.g. a UBL OrderResponse).",
                                "headers": {"X-Message-ID": {"schema": {"type": "string"}},
                                            "X-Correlation-ID": {"schema": {"type": "string"}}},
                                "content": {"application/xml": {"schema": {"type": "string"}}}},
                        "202": {"description": "One-way route: accepted and durably stored.",
                                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Receipt"}}}},
                        "400": _problem("Not well-formed, forbidden XML construct, over an intake limit (too-many-"
                                        "attributes, too-many-namespaces, too-many-document-namespaces, name-too-long, "
                                        "text-too-long: `limit` and `limit_value` say which), schema-invalid (every "
                                        "error with line, column, path, message) or a malformed header."),
                        **auth_errors,
                        "403": _problem("The partner may not use the route the document matched."),
                        "413": _problem("The body is over the size limit."),
                        "415": _problem("Content-Type is not XML."),
                        "422": _problem("No route matches (names the root element and partner)."),
                        "502": _problem("Request-reply: the back end answered with an error; the document was accepted."),
                        "503": _problem("The store is unavailable; nothing was accepted."),
                        "504": _problem("Request-reply: no reply in time; the document was accepted (see status_url)."),
                    },
                },
            },
            "/v1/documents/{message_id}": {
                "get": {
                    "summary": "Status of one of your documents, with the reply once there",
                    "parameters": [{"name": "message_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {
                        "200": {"description": "The document's status.",
                                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/DocumentStatus"}}}},
                        **auth_errors,
                        "404": _problem("No such document for your partner account."),
                    },
                },
            },
            "/v1/documents/{message_id}/reply": {
                "get": {
                    "summary": "The reply document itself",
                    "parameters": [{"name": "message_id", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {
                        "200": {"description": "The reply.", "content": {"application/xml": {"schema": {"type": "string"}}}},
                        **auth_errors,
                        "404": _problem("No such document for your partner account, or no reply yet."),
                    },
                },
            },
            "/healthz": {"get": {"summary": "Liveness", "security": [],
                                 "responses": {"200": {"description": "The process is up."}}}},
            "/readyz": {"get": {"summary": "Readiness: the store is reachable", "security": [],
                                "responses": {"200": {"description": "Ready."},
                                              "503": _problem("Not ready: the store is unreachable or starting.")}}},
            "/openapi.json": {"get": {"summary": "This document", "security": [],
                                      "responses": {"200": {"description": "OpenAPI 3.1"}}}},
        },
    }
