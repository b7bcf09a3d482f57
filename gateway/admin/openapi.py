"""The admin API's part of the OpenAPI document: :func:`merge_admin` adds its paths, schemas and security
schemes to the served document (``/openapi.json``)."""

from __future__ import annotations

from typing import Any

from gateway.admin.api import PREFIX
from gateway.admin.deliveries_api import delivery_paths
from gateway.admin.partners_api import partner_paths

__all__ = ["admin_paths", "merge_admin"]

_PROBLEM = {"$ref": "#/components/schemas/Problem"}
#: The problem codes only the admin side answers with.
ADMIN_CODES = ("forbidden", "csrf-failed", "too-many-login-attempts", "invalid-request", "partner-conflict")
_SECURITY = [{"operatorSession": []}, {"operatorBasic": []}]


def _problem(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/problem+json": {"schema": _PROBLEM}}}


def _ok(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _query(name: str, description: str, *, required: bool = False, kind: str = "string") -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "description": description, "schema": {"type": kind}}


_READ_ERRORS = {
    "401": _problem("No operator session and no valid operator credentials."),
    "503": _problem("The store is not reachable."),
}
_ACT_ERRORS = {
    **_READ_ERRORS,
    "400": _problem("Bad parameters (the detail says which)."),
    "403": _problem("A viewer asked for a change (forbidden), or the CSRF check failed (csrf-failed)."),
    "404": _problem("No such action or message."),
}


def _get(
    summary: str,
    schema: dict[str, Any],
    params: list[dict[str, Any]] | None = None,
    errors: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "tags": ["admin"],
            "security": _SECURITY,
            "parameters": params or [],
            "responses": {"200": _ok(schema), **(errors or _READ_ERRORS)},
        }
    }


def _obj(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props}


_S = {"type": "string"}
_SN = {"type": ["string", "null"]}
_I = {"type": "integer"}
_IN = {"type": ["integer", "null"]}
_N = {"type": "number"}


def admin_schemas() -> dict[str, Any]:
    return {
        "AdminDestination": _obj(
            name=_S,
            kind={"type": "string", "enum": ["queue", "dead-letter", "subscription", "other"]},
            topic=_SN,
            depth=_I,
            in_flight=_I,
            consumers=_I,
            enqueued=_I,
            acknowledged=_I,
            dead_lettered=_I,
            expired=_I,
            redelivered=_I,
            oldest_age_s={"type": ["number", "null"]},
            enqueue_rate=_N,
            ack_rate=_N,
            dead_letter_queue=_SN,
            dead_letter_depth=_I,
            dead_letter_for=_SN,
        ),
        "AdminMessage": _obj(
            message_id=_S,
            destination=_S,
            box=_S,
            priority=_I,
            timestamp=_I,
            expiration=_I,
            persistent={"type": "boolean"},
            correlation_id=_SN,
            reply_to=_SN,
            type=_SN,
            properties={"type": "object"},
            kind=_S,
            size=_I,
            state={"type": "string", "enum": ["pending", "in_flight"]},
            delivery_count=_I,
            cursor=_S,
            body=_obj(
                format={"type": "string", "enum": ["xml", "text", "base64", "json", "none"]},
                text=_SN,
                truncated={"type": "boolean"},
            ),
        ),
        "AdminAction": {
            "type": "object",
            "required": ["destination"],
            "properties": {
                "destination": {"type": "string", "description": "queue://NAME (a dead-letter queue to replay)"},
                "message_ids": {"type": "array", "items": _S, "minItems": 1, "maxItems": 1000},
                "selector": {"type": "string", "maxLength": 4000, "description": "a JMS message selector"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 100000},
                "target": {"type": "string", "description": "move: the queue to move to"},
                "confirm": {"type": "string", "description": "purge: the destination's name again"},
            },
        },
        "AdminActionResult": _obj(
            action=_S, destination=_S, count=_I, message_ids={"type": "array", "items": _S}, ledger_documents=_I
        ),
        "AdminDocument": _obj(
            message_id=_S,
            partner=_S,
            doc_type=_S,
            doc_id=_SN,
            correlation_id=_S,
            route=_S,
            destination=_S,
            status=_S,
            received_at=_I,
            updated_at=_I,
            reply_type=_SN,
            error=_SN,
        ),
        "AuditEntry": _obj(
            id=_I,
            at=_I,
            operator=_S,
            role=_S,
            action=_S,
            target=_SN,
            selector=_SN,
            message_ids={"type": ["array", "null"], "items": _S},
            count=_IN,
            outcome=_S,
            detail=_SN,
            client=_SN,
        ),
    }


def admin_paths() -> dict[str, Any]:
    ref = lambda name: {"$ref": f"#/components/schemas/{name}"}
    p = PREFIX
    session = _obj(
        operator=_S,
        role={"type": "string", "enum": ["viewer", "operator"]},
        via=_S,
        csrf_token=_SN,
        can_act={"type": "boolean"},
    )
    return {
        f"{p}/session": {
            **_get("The operator behind this request, and the session's CSRF token", session),
            "post": {
                "summary": "Log in: a console session cookie (HttpOnly, SameSite=Strict)",
                "tags": ["admin"],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["name", "secret"],
                                "properties": {"name": _S, "secret": _S},
                            }
                        }
                    },
                },
                "responses": {
                    "200": _ok(_obj(operator=_S, role=_S, csrf_token=_S, expires_at=_I)),
                    "400": _problem("Not a JSON object with name and secret."),
                    "401": _problem("Unknown operator or wrong secret."),
                    "429": _problem("Too many failed logins (Retry-After)."),
                },
            },
            "delete": {
                "summary": "Log out",
                "tags": ["admin"],
                "security": _SECURITY,
                "responses": {"204": {"description": "Logged out."}, **_ACT_ERRORS},
            },
        },
        f"{p}/destinations": _get(
            "Queues, dead-letter queues and subscriptions with their counters",
            _obj(taken_at=_N, took_s=_N, destinations={"type": "array", "items": ref("AdminDestination")}),
        ),
        f"{p}/destination": _get(
            "One destination, with its recent readings",
            ref("AdminDestination"),
            [_query("name", "queue://NAME or a subscription's key", required=True)],
        ),
        f"{p}/messages": _get(
            "A page of the messages waiting in a destination (keyset: pass next_cursor for the next)",
            _obj(
                destination=_S, selector=_SN, next_cursor=_SN, messages={"type": "array", "items": ref("AdminMessage")}
            ),
            [
                _query("destination", "queue://NAME", required=True),
                _query("selector", "a JMS message selector"),
                _query("cursor", "the previous page's next_cursor"),
                _query("limit", "1-500 (50)", kind="integer"),
            ],
            {**_READ_ERRORS, "400": _problem("A bad selector, cursor or limit.")},
        ),
        f"{p}/message": _get(
            "One message with its body (XML pretty-printed)",
            ref("AdminMessage"),
            [_query("destination", "queue://NAME", required=True), _query("id", "the message id", required=True)],
            {**_READ_ERRORS, "404": _problem("Not in that destination.")},
        ),
        f"{p}/actions/{{action}}": {
            "post": {
                "summary": "Replay (dead letters), delete or move messages by ids and/or selector with a limit; purge",
                "tags": ["admin"],
                "security": _SECURITY,
                "parameters": [
                    {
                        "name": "action",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "enum": ["replay", "delete", "move", "purge"]},
                    },
                    {
                        "name": "X-CSRF-Token",
                        "in": "header",
                        "required": False,
                        "schema": _S,
                        "description": "required with a session cookie",
                    },
                ],
                "requestBody": {"required": True, "content": {"application/json": {"schema": ref("AdminAction")}}},
                "responses": {"200": _ok(ref("AdminActionResult")), **_ACT_ERRORS},
            }
        },
        f"{p}/documents": _get(
            "Search the ledger, newest first (keyset pages)",
            _obj(documents={"type": "array", "items": ref("AdminDocument")}, next_cursor=_SN, scanned=_I),
            [
                _query(n, d)
                for n, d in (
                    ("partner", "partner id"),
                    ("doc_type", "e.g. Order"),
                    ("status", "accepted, delivered, replied, failed, dead_lettered"),
                    ("doc_id", "the document's own ID"),
                    ("correlation_id", "correlation id"),
                    ("message_id", "message id"),
                    ("route", "route id"),
                    ("since", "ISO 8601 or epoch ms"),
                    ("until", "ISO 8601 or epoch ms"),
                    ("cursor", "the previous page's next_cursor"),
                )
            ]
            + [_query("limit", "1-200 (50)", kind="integer")],
            {**_READ_ERRORS, "400": _problem("A bad parameter.")},
        ),
        f"{p}/documents/{{message_id}}": {
            **_get(
                "A document: history, timeline, request and reply XML, warehouse lineage",
                {
                    "allOf": [
                        ref("AdminDocument"),
                        _obj(
                            auth={
                                "type": ["string", "null"],
                                "description": "how the partner authenticated: key:<key id>, "
                                "certificate:sha256:<fingerprint>, or both joined with +",
                            },
                            history={"type": "array"},
                            timeline={"type": "array"},
                            lineage={"type": "object"},
                            document={"type": ["object", "null"]},
                            reply={"type": ["object", "null"]},
                            as2={"type": "array", "items": {"type": "object"}},
                        ),
                    ]
                },
                errors={**_READ_ERRORS, "404": _problem("No such document.")},
            )["get"]
            | {"parameters": [{"name": "message_id", "in": "path", "required": True, "schema": _S}]}
        },
        f"{p}/documents/{{message_id}}/mdn": {
            "get": {
                "summary": "An AS2 MDN of the document, byte for byte as sent to or received from the partner",
                "tags": ["admin"],
                "security": _SECURITY,
                "parameters": [
                    {"name": "message_id", "in": "path", "required": True, "schema": _S},
                    _query("direction", "in (a message received) or out (a message sent)"),
                    _query("as2_message_id", "the AS2 Message-ID, as the document's as2 list shows it"),
                ],
                "responses": {
                    "200": {"description": "The MDN (a MIME entity)", "content": {"message/rfc822": {"schema": _S}}},
                    **_READ_ERRORS,
                    "400": _problem("direction or as2_message_id missing."),
                    "404": _problem("No such document, or no such MDN."),
                },
            }
        },
        f"{p}/documents/{{message_id}}/{{part}}": {
            "get": {
                "summary": "The request or reply document itself",
                "tags": ["admin"],
                "security": _SECURITY,
                "parameters": [
                    {"name": "message_id", "in": "path", "required": True, "schema": _S},
                    {
                        "name": "part",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "enum": ["request", "reply"]},
                    },
                ],
                "responses": {
                    "200": {"description": "The XML", "content": {"application/xml": {"schema": _S}}},
                    **_READ_ERRORS,
                    "404": _problem("No such document, or no reply."),
                },
            }
        },
        f"{p}/partners": _get(
            "Partners with their documents by status over the last hour and day",
            _obj(counted_at=_N, partners={"type": "array", "items": {"type": "object"}}),
        ),
        f"{p}/routes": _get(
            "Routes with their documents by status over the last hour and day",
            _obj(counted_at=_N, routes={"type": "array", "items": {"type": "object"}}),
        ),
        f"{p}/etl/runs": _get(
            "The warehouse load's latest runs",
            _obj(runs={"type": "array", "items": {"type": "object"}}),
            [_query("limit", "1-200 (20)", kind="integer")],
        ),
        f"{p}/audit": _get(
            "The audit trail, newest first",
            _obj(entries={"type": "array", "items": ref("AuditEntry")}, next_before=_IN),
            [
                _query("before", "an entry id: older ones", kind="integer"),
                _query("limit", "1-500 (50)", kind="integer"),
                _query("operator", "operator name"),
                _query("action", "login, logout, replay, delete, move, purge"),
            ],
        ),
    }


def merge_admin(document: dict[str, Any]) -> dict[str, Any]:
    """Add the admin API to an OpenAPI document (in place; returned)."""
    document.setdefault("paths", {}).update(admin_paths())
    document["paths"].update(delivery_paths(PREFIX, _SECURITY, _problem))
    document["paths"].update(partner_paths(PREFIX, _SECURITY, _problem))
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas.update(admin_schemas())
    codes = schemas.get("Problem", {}).get("properties", {}).get("code", {}).get("enum")
    if isinstance(codes, list):
        codes.extend(c for c in ADMIN_CODES if c not in codes)
    components.setdefault("securitySchemes", {}).update(
        {
            "operatorSession": {
                "type": "apiKey",
                "in": "cookie",
                "name": "b2bgw_session",
                "description": "The console's session (POST /admin/api/v1/session); changes also need "
                "its X-CSRF-Token.",
            },
            "operatorBasic": {
                "type": "http",
                "scheme": "basic",
                "description": "An operator's name and secret (operators: section). Never a partner key.",
            },
        }
    )
    tags = document.setdefault("tags", [])
    if not any(t.get("name") == "admin" for t in tags):
        tags.append(
            {
                "name": "admin",
                "description": "Operators' API: destinations, messages, dead letters, ledger, "
                "audit (admin.port may serve it on a listener of its own).",
            }
        )
    return document
