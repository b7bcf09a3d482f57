"""The admin API's deliveries: per endpoint (pending, in flight, failing since, dead), one delivery with its
timeline, and replay or discard of dead deliveries (operator role, audited)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from broker_core import Queue
from gateway.admin import deliveries_ops as operations
from gateway.admin.errors import InvalidRequestError
from gateway.delivery.errors import UnknownEndpointError
from gateway.delivery.hooks import endpoint_of
from gateway.delivery.records import DeliveryLedger, DeliveryRow
from gateway.delivery.running import all_endpoints
from gateway.errors import NotFoundError

__all__ = ["delivery_paths", "delivery_routes", "endpoint_summary"]

_STATUSES = ("pending", "delivered", "dead", "discarded")


def _row(row: DeliveryRow) -> dict[str, Any]:
    return {
        "message_id": row.message_id,
        "partner": row.partner,
        "endpoint": row.endpoint,
        "kind": row.kind,
        "source": row.source,
        "doc_type": row.doc_type,
        "content_type": row.content_type,
        "status": row.status,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "attempts": row.attempts,
        "failing_since": row.failing_since,
        "last_status": row.last_status,
        "last_detail": row.last_detail,
        "timeline": [
            {
                "attempt": a.attempt,
                "at": a.at,
                "endpoint": a.endpoint,
                "outcome": a.outcome,
                "status": a.status,
                "detail": a.detail,
                "duration_ms": a.duration_ms,
            }
            for a in row.timeline
        ],
    }


def endpoint_summary(service: Any, b: Any) -> dict[str, Any]:
    """Per configured endpoint: pending and in flight (its queue), dead (its dead-letter queue), failing and
    since when, delivered (the ledger)."""
    failing = {(s.partner, s.endpoint): s for s in DeliveryLedger(b.engine).summary()}
    rows = []
    for endpoint in all_endpoints(service.assembly.partners):
        stats, dead = b.stats(Queue(endpoint.queue)), b.stats(Queue(endpoint.dead_queue))
        s = failing.get((endpoint.partner, endpoint.name))
        rows.append(
            {
                "partner": endpoint.partner,
                "endpoint": endpoint.name,
                "kind": endpoint.kind,
                "pending": stats.depth,
                "in_flight": stats.in_flight,
                "dead": dead.depth,
                "failing": s.failing if s else 0,
                "failing_since": s.failing_since if s else None,
                "delivered": s.delivered if s else 0,
            }
        )
    return {"endpoints": rows}


def delivery_routes(
    service: Any,
    guarded: Callable[..., Callable[[Request], Awaitable[Response]]],
    thread: Callable[..., Awaitable[Any]],
    prefix: str,
    client: Callable[[Any], str],
) -> list[Route]:
    """The routes, guarded like the admin API's others (``guarded``; ``thread`` runs blocking reads)."""

    def broker() -> Any:
        return service.parts()[0]

    def summary() -> dict[str, Any]:
        return endpoint_summary(service, broker())

    async def endpoints(request: Request, principal: Any) -> Response:
        q = request.query_params
        if q.get("status") or q.get("partner"):
            status = q.get("status")
            if status and status not in _STATUSES:
                raise InvalidRequestError(f"status must be one of {', '.join(_STATUSES)}.")
            rows = await thread(
                lambda: DeliveryLedger(broker().engine).list(
                    partner=q.get("partner"), endpoint=q.get("endpoint"), status=status, limit=200
                )
            )
            return JSONResponse({"deliveries": [_row(r) for r in rows]})
        return JSONResponse(await thread(summary))

    async def one(request: Request, principal: Any) -> Response:
        row = await thread(lambda: DeliveryLedger(broker().engine).get(request.path_params["message_id"]))
        if row is None:
            raise NotFoundError("No such delivery.")
        return JSONResponse(_row(row))

    async def act(request: Request, principal: Any) -> Response:
        name = request.path_params["action"]
        if name not in ("replay", "discard"):
            raise NotFoundError(f"No delivery action {name!r}: replay, discard.")
        principal.require_operator()
        try:
            spec = await request.json()
        except ValueError:
            raise InvalidRequestError("The body must be JSON: {partner, endpoint, message_ids}.") from None
        if (
            not isinstance(spec, dict)
            or not isinstance(spec.get("partner"), str)
            or not isinstance(spec.get("endpoint"), str)
        ):
            raise InvalidRequestError("partner and endpoint are required strings.")
        ids = spec.get("message_ids")
        if ids is not None and (
            not isinstance(ids, list) or len(ids) > 1000 or not all(isinstance(i, str) for i in ids)
        ):
            raise InvalidRequestError("message_ids must be a list of at most 1000 delivery ids.")
        try:
            endpoint = endpoint_of(service.assembly.partners, spec["partner"], spec["endpoint"])
        except UnknownEndpointError as exc:
            raise NotFoundError(exc.detail) from None
        done = await thread(
            lambda: getattr(operations, name)(
                broker(),
                endpoint,
                ids or None,
                operator=principal.name,
                role=principal.role,
                client=client(request.scope),
            )
        )
        return JSONResponse({"action": name, "message_ids": done, "count": len(done)})

    return [
        Route(f"{prefix}/deliveries", guarded(endpoints), methods=["GET"]),
        Route(f"{prefix}/deliveries/actions/{{action}}", guarded(act, change=True), methods=["POST"]),
        Route(f"{prefix}/deliveries/{{message_id}}", guarded(one), methods=["GET"]),
    ]


def delivery_paths(
    prefix: str, security: list[dict[str, Any]], problem: Callable[[str], dict[str, Any]]
) -> dict[str, Any]:
    """The OpenAPI paths of the routes above (merged into the admin API's part of the document)."""
    s, i = {"type": "string"}, {"type": "integer"}
    attempt = {
        "type": "object",
        "properties": {
            "attempt": i,
            "at": i,
            "endpoint": s,
            "outcome": s,
            "status": {"type": ["integer", "null"]},
            "detail": s,
            "duration_ms": i,
        },
    }
    delivery = {
        "type": "object",
        "properties": {
            "message_id": s,
            "partner": s,
            "endpoint": s,
            "kind": s,
            "source": s,
            "doc_type": {"type": ["string", "null"]},
            "content_type": s,
            "status": {"type": "string", "enum": list(_STATUSES)},
            "created_at": i,
            "updated_at": i,
            "attempts": i,
            "failing_since": {"type": ["integer", "null"]},
            "last_status": {"type": ["integer", "null"]},
            "last_detail": {"type": ["string", "null"]},
            "timeline": {"type": "array", "items": attempt},
        },
    }
    endpoint = {
        "type": "object",
        "properties": {
            "partner": s,
            "endpoint": s,
            "kind": s,
            "pending": i,
            "in_flight": i,
            "dead": i,
            "failing": i,
            "failing_since": {"type": ["integer", "null"]},
            "delivered": i,
        },
    }
    errors = {
        "401": problem("No operator session and no valid operator credentials."),
        "503": problem("The store is not reachable."),
    }

    def ok(schema: dict[str, Any]) -> dict[str, Any]:
        return {"description": "OK", "content": {"application/json": {"schema": schema}}}

    def query(name: str, description: str) -> dict[str, Any]:
        return {"name": name, "in": "query", "required": False, "description": description, "schema": s}

    return {
        f"{prefix}/deliveries": {
            "get": {
                "summary": "Deliveries per partner endpoint; with partner or status, the deliveries themselves",
                "tags": ["admin"],
                "security": security,
                "parameters": [
                    query("partner", "only this partner's deliveries"),
                    query("endpoint", "only this endpoint's (with partner)"),
                    query("status", "pending, delivered, dead or discarded"),
                ],
                "responses": {
                    "200": ok(
                        {
                            "type": "object",
                            "properties": {
                                "endpoints": {"type": "array", "items": endpoint},
                                "deliveries": {"type": "array", "items": delivery},
                            },
                        }
                    ),
                    "400": problem("A status that does not exist."),
                    **errors,
                },
            }
        },
        f"{prefix}/deliveries/{{message_id}}": {
            "get": {
                "summary": "One delivery and its timeline of attempts",
                "tags": ["admin"],
                "security": security,
                "parameters": [{"name": "message_id", "in": "path", "required": True, "schema": s}],
                "responses": {"200": ok(delivery), "404": problem("No such delivery."), **errors},
            }
        },
        f"{prefix}/deliveries/actions/{{action}}": {
            "post": {
                "summary": "Replay or discard dead deliveries of an endpoint (operator role; audited)",
                "tags": ["admin"],
                "security": security,
                "parameters": [
                    {
                        "name": "action",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string", "enum": ["replay", "discard"]},
                    }
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "required": ["partner", "endpoint"],
                                "properties": {
                                    "partner": s,
                                    "endpoint": s,
                                    "message_ids": {"type": "array", "items": s, "maxItems": 1000},
                                },
                            }
                        }
                    },
                },
                "responses": {
                    "200": ok(
                        {
                            "type": "object",
                            "properties": {"action": s, "message_ids": {"type": "array", "items": s}, "count": i},
                        }
                    ),
                    "400": problem("Bad parameters (the detail says which)."),
                    "403": problem("A viewer asked for a change (forbidden), or the CSRF check failed."),
                    "404": problem("No such action, partner or endpoint."),
                    **errors,
                },
            }
        },
    }
