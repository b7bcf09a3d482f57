"""The admin HTTP API under ``/admin/api/v1`` (JSON; described in the served OpenAPI document).

Authentication: the console's session cookie, or HTTP Basic with an operator's
name and secret (see :mod:`.access`). A viewer may call every ``GET``; the
actions need the ``operator`` role, partner changes the ``admin`` role. Errors are RFC 9457 problems, as on the
partner API.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.admin.access import SESSION_COOKIE, Access, Principal, client_address
from gateway.admin.deliveries_api import delivery_routes
from gateway.admin.errors import InvalidRequestError, OperatorAuthError, TooManyAttemptsError
from gateway.admin.partners_api import partner_routes
from gateway.admin.read_audit import audit_read
from gateway.admin.service import AdminService, parse_limit, pretty_xml
from gateway.errors import GatewayError, NotFoundError
from gateway.problems import problem_response
from gateway.raw_documents import raw_document_response, raw_mdn_response

__all__ = ["PREFIX", "api_routes"]

log = logging.getLogger(__name__)

PREFIX = "/admin/api/v1"
MAX_BODY = 256 * 1024
ACTIONS = ("replay", "delete", "move", "purge")


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps(data, ensure_ascii=False, default=str, separators=(",", ":")).encode("utf-8")
    return Response(
        body,
        status_code=status,
        media_type="application/json",
        headers={"Cache-Control": "no-store", **(headers or {})},
    )


def problem(exc: GatewayError, path: str) -> Response:
    headers = {}
    if isinstance(exc, OperatorAuthError):
        headers["WWW-Authenticate"] = 'Basic realm="b2bgw-admin", charset="UTF-8"'
    if isinstance(exc, TooManyAttemptsError):
        headers["Retry-After"] = str(exc.retry_after)
    return problem_response(exc, path, headers=headers)


async def read_json(request: Request) -> dict[str, Any]:
    """The request's JSON object body (at most 256 KiB)."""
    media = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    if media != "application/json":
        raise InvalidRequestError("Send the parameters as a JSON object (Content-Type: application/json).")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise InvalidRequestError(f"The body is over {MAX_BODY // 1024} KiB.")
        chunks.append(chunk)
    try:
        data = json.loads(b"".join(chunks) or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequestError("The body is not JSON.") from None
    if not isinstance(data, dict):
        raise InvalidRequestError("The body must be a JSON object.")
    return data


Endpoint = Callable[[Request, Principal], Awaitable[Response]]


def api_routes(service: AdminService) -> list[Route]:
    """The routes of the admin API."""

    def access() -> Access:
        return service.access

    def guarded(endpoint: Endpoint, *, change: bool = False) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            try:
                principal = await access().authenticate(request.scope, request.headers, request.cookies)
                if change:
                    access().check_change(principal, request.method, request.headers)
                return await endpoint(request, principal)
            except GatewayError as exc:
                return problem(exc, request.url.path)
            except Exception:  # a bug: logged, the client learns nothing of it
                log.exception("unexpected error on %s %s", request.method, request.url.path)
                return problem(GatewayError(), request.url.path)

        run.__name__ = getattr(endpoint, "__name__", "endpoint")
        return run

    async def thread(fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    # --------------------------------------------------------------- session

    async def login(request: Request) -> Response:
        try:
            data = await read_json(request)
            name, secret = data.get("name"), data.get("secret")
            if not isinstance(name, str) or not isinstance(secret, str) or not name or not secret:
                raise InvalidRequestError('Send {"name": ..., "secret": ...}.')
            client = client_address(request.scope)
            operator = await access().verify(name[:64], secret[:512], client, "json")  # a failure is audited there
            token, csrf, expires = await thread(access().open_session, operator)
            await thread(
                lambda: service.audit.record(operator=operator.name, role=operator.role, action="login", client=client)
            )
            response = _json(
                {"operator": operator.name, "role": operator.role, "csrf_token": csrf, "expires_at": expires}
            )
            response.headers.append("Set-Cookie", f"{SESSION_COOKIE}={token}{access().cookie_flags(request.scope)}")
            return response
        except GatewayError as exc:
            return problem(exc, request.url.path)

    async def whoami(request: Request, principal: Principal) -> Response:
        return _json(
            {
                "operator": principal.name,
                "role": principal.role,
                "via": principal.via,
                "csrf_token": principal.csrf,
                "can_act": principal.can_act,
            }
        )

    async def logout(request: Request, principal: Principal) -> Response:
        if principal.session_id is not None:
            await thread(access().close_session, principal.session_id)
        await thread(
            lambda: service.audit.record(
                operator=principal.name, role=principal.role, action="logout", client=client_address(request.scope)
            )
        )
        response = Response(status_code=204, headers={"Cache-Control": "no-store"})
        response.headers.append("Set-Cookie", f"{SESSION_COOKIE}=; Max-Age=0{access().cookie_flags(request.scope)}")
        return response

    # --------------------------------------------------------------- destinations and messages

    async def destinations(request: Request, principal: Principal) -> Response:
        return _json(await thread(service.destinations))

    async def destination(request: Request, principal: Principal) -> Response:
        name = request.query_params.get("name")
        data = await thread(service.destination, name)
        data["history"] = await thread(service.history, data["name"])
        return _json(data)

    async def messages(request: Request, principal: Principal) -> Response:
        q = request.query_params
        limit = parse_limit(q.get("limit"), 50, 500)
        return _json(await thread(service.browse, q.get("destination"), q.get("selector"), q.get("cursor"), limit))

    async def message(request: Request, principal: Principal) -> Response:
        q = request.query_params
        found = await thread(service.message, q.get("destination"), q.get("id") or "")
        await audit_read(
            service,
            principal,
            "read-message",
            found["box"],
            client_address(request.scope),
            message_ids=[found["message_id"]],
            detail="admin API",
        )
        return _json(found)

    async def action(request: Request, principal: Principal) -> Response:
        name = request.path_params["action"]
        if name not in ACTIONS:
            raise NotFoundError(f"No action {name!r}: {', '.join(ACTIONS)}.")
        spec = await read_json(request)
        result = await thread(service.act, principal, name, spec, client_address(request.scope))
        return _json(result.to_json())

    # --------------------------------------------------------------- ledger

    async def documents(request: Request, principal: Principal) -> Response:
        return _json(await thread(service.search, dict(request.query_params)))

    async def document(request: Request, principal: Principal) -> Response:
        doc = await thread(service.document, request.path_params["message_id"])
        await audit_read(
            service,
            principal,
            "read-document",
            doc["message_id"],
            client_address(request.scope),
            detail="admin API: document and reply",
        )
        for key in ("document", "reply"):
            text, cut = pretty_xml(doc.pop(key))
            doc[key] = {"xml": text, "truncated": cut} if text is not None else None
        return _json(doc)

    async def document_xml(request: Request, principal: Principal) -> Response:
        part = request.path_params["part"]
        if part not in ("request", "reply"):
            raise NotFoundError()
        doc = await thread(service.document, request.path_params["message_id"])
        data = doc["document" if part == "request" else "reply"]
        if data is None:
            raise NotFoundError(f"Document {doc['message_id']} has no reply.")
        await audit_read(
            service,
            principal,
            "read-document",
            doc["message_id"],
            client_address(request.scope),
            detail=f"admin API: {part} downloaded",
        )
        return raw_document_response(data, f"{doc['message_id']}-{part}")

    async def document_mdn(request: Request, principal: Principal) -> Response:
        q = request.query_params
        direction, as2_message_id = q.get("direction") or "", q.get("as2_message_id") or ""
        if direction not in ("in", "out") or not as2_message_id:
            raise InvalidRequestError("Name the MDN by direction (in or out) and as2_message_id.")
        message_id = request.path_params["message_id"]
        record = await thread(service.as2_mdn, message_id, direction, as2_message_id)
        await audit_read(
            service,
            principal,
            "read-document",
            message_id,
            client_address(request.scope),
            detail=f"AS2 MDN ({direction}) {as2_message_id[:200]} downloaded",
        )
        return raw_mdn_response(record.mdn, f"{message_id}-mdn-{direction}")

    async def partners(request: Request, principal: Principal) -> Response:
        return _json(await thread(service.partners))

    async def routes(request: Request, principal: Principal) -> Response:
        return _json(await thread(service.routes))

    async def etl_runs(request: Request, principal: Principal) -> Response:
        limit = parse_limit(request.query_params.get("limit"), 20, 200)
        return _json(await thread(service.etl_runs, limit))

    async def audit(request: Request, principal: Principal) -> Response:
        q = request.query_params
        limit = parse_limit(q.get("limit"), 50, 500)
        before = q.get("before")
        if before is not None and not before.isdigit():
            raise InvalidRequestError("before is an audit entry id (a whole number).")
        entries = await thread(
            lambda: service.audit.recent(
                limit=limit, before=int(before) if before else None, operator=q.get("operator"), action=q.get("action")
            )
        )
        return _json(
            {
                "entries": [e.to_json() for e in entries],
                "next_before": entries[-1].id if len(entries) == limit else None,
            }
        )

    p = PREFIX
    return [
        Route(f"{p}/session", login, methods=["POST"]),
        Route(f"{p}/session", guarded(whoami), methods=["GET"]),
        Route(f"{p}/session", guarded(logout, change=True), methods=["DELETE"]),
        Route(f"{p}/destinations", guarded(destinations), methods=["GET"]),
        Route(f"{p}/destination", guarded(destination), methods=["GET"]),
        Route(f"{p}/messages", guarded(messages), methods=["GET"]),
        Route(f"{p}/message", guarded(message), methods=["GET"]),
        Route(f"{p}/actions/{{action}}", guarded(action, change=True), methods=["POST"]),
        Route(f"{p}/documents", guarded(documents), methods=["GET"]),
        Route(f"{p}/documents/{{message_id}}", guarded(document), methods=["GET"]),
        Route(f"{p}/documents/{{message_id}}/mdn", guarded(document_mdn), methods=["GET"]),
        Route(f"{p}/documents/{{message_id}}/{{part}}", guarded(document_xml), methods=["GET"]),
        Route(f"{p}/partners", guarded(partners), methods=["GET"]),
        Route(f"{p}/routes", guarded(routes), methods=["GET"]),
        Route(f"{p}/etl/runs", guarded(etl_runs), methods=["GET"]),
        Route(f"{p}/audit", guarded(audit), methods=["GET"]),
        *delivery_routes(service, guarded, thread, p, client_address),
        *partner_routes(service, guarded, thread, read_json, _json, p, client_address),
    ]
