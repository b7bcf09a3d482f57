"""The admin API's partner changes (admin role, audited): add a partner, issue and revoke keys, pin and unpin
certificates; and every partner's credentials as served now (:mod:`gateway.admin.partners_ops`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.admin import partners_ops as ops

__all__ = ["partner_paths", "partner_routes"]


def partner_routes(
    service: Any,
    guarded: Callable[..., Any],
    thread: Callable[..., Any],
    read_json: Callable[..., Any],
    respond: Callable[..., Response],
    prefix: str,
    client: Callable[[Any], str],
) -> list[Route]:
    async def changed(request: Request, fn: Callable[..., Any], *args: Any) -> Response:
        result, fresh = await thread(fn, *args, client(request.scope))
        service.assembly.partners.adopt(fresh)  # this process at once; the others at their next poll
        return respond(result, 201 if request.method == "POST" else 200)

    async def credentials(request: Request, principal: Any) -> Response:
        return respond(await thread(ops.credentials, service))

    async def add(request: Request, principal: Any) -> Response:
        principal.require_admin()
        return await changed(request, ops.add_partner, service, principal, await read_json(request))

    async def issue(request: Request, principal: Any) -> Response:
        principal.require_admin()
        pid = request.path_params["partner_id"]
        return await changed(request, ops.issue_key, service, principal, pid, await read_json(request))

    async def revoke(request: Request, principal: Any) -> Response:
        principal.require_admin()
        pid, key_id = request.path_params["partner_id"], request.path_params["key_id"]
        result, fresh = await thread(ops.revoke_key, service, principal, pid, key_id, client(request.scope))
        service.assembly.partners.adopt(fresh)
        return respond(result)

    async def certificates(request: Request, principal: Any) -> Response:
        principal.require_admin()
        pid = request.path_params["partner_id"]
        fn = ops.pin_certificate if request.method == "POST" else ops.unpin_certificate
        return await changed(request, fn, service, principal, pid, await read_json(request))

    p = prefix
    return [
        Route(f"{p}/credentials", guarded(credentials), methods=["GET"]),
        Route(f"{p}/partners", guarded(add, change=True), methods=["POST"]),
        Route(f"{p}/partners/{{partner_id}}/keys", guarded(issue, change=True), methods=["POST"]),
        Route(f"{p}/partners/{{partner_id}}/keys/{{key_id}}/revoke", guarded(revoke, change=True), methods=["POST"]),
        Route(
            f"{p}/partners/{{partner_id}}/certificates", guarded(certificates, change=True), methods=["POST", "DELETE"]
        ),
    ]


def partner_paths(
    prefix: str, security: list[dict[str, Any]], problem: Callable[[str], dict[str, Any]]
) -> dict[str, Any]:
    """The OpenAPI paths of the routes above (merged into the admin API's part of the document)."""
    s, sn = {"type": "string"}, {"type": ["string", "null"]}
    errors = {
        "400": problem("Bad parameters (the detail says which)."),
        "401": problem("No operator session and no valid operator credentials."),
        "403": problem("Not an admin (forbidden), or the CSRF check failed (csrf-failed)."),
        "404": problem("No such partner, key or pin."),
        "409": problem("The id is taken, the key revoked already, the certificate pinned already (partner-conflict)."),
        "503": problem("The store is not reachable."),
    }

    def op(summary: str, body: dict[str, Any] | None, answer: dict[str, Any], params: list[str], code: str) -> Any:
        out: dict[str, Any] = {
            "summary": summary,
            "tags": ["admin"],
            "security": security,
            "parameters": [{"name": n, "in": "path", "required": True, "schema": s} for n in params],
            "responses": {
                code: {"description": "Done", "content": {"application/json": {"schema": answer}}},
                **errors,
            },
        }
        if body is not None:
            out["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
        return out

    def obj(*required: str, **props: Any) -> dict[str, Any]:
        return {"type": "object", "required": list(required), "properties": props}

    dates = {"type": ["string", "null"], "format": "date-time"}
    cert = obj(sha256={**s, "description": "SHA-256 fingerprint, 64 hex digits"}, pem={**s, "description": "PEM"})
    return {
        f"{prefix}/credentials": {
            "get": {
                "summary": "Every partner's keys (from the partners file or the admin side), revoked keys and pins",
                "tags": ["admin"],
                "security": security,
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": {"schema": obj()}}},
                    "401": errors["401"],
                    "503": errors["503"],
                },
            }
        },
        f"{prefix}/partners": {
            "post": op(
                "Add a partner (admin role; audited as partner-add)",
                obj("id", id=s, name=s),
                obj(id=s, name=s),
                [],
                "201",
            )
        },
        f"{prefix}/partners/{{partner_id}}/keys": {
            "post": op(
                "Issue a key (admin role; audited as key-issue): the answer's key is shown this once",
                obj("id", id=s, label=sn, not_before=dates, not_after=dates),
                obj(partner=s, id=s, label=sn, key=s, not_before=dates, not_after=dates),
                ["partner_id"],
                "201",
            )
        },
        f"{prefix}/partners/{{partner_id}}/keys/{{key_id}}/revoke": {
            "post": op(
                "Revoke a key, declared in the partners file or issued here (admin role; audited as key-revoke)",
                None,
                obj(partner=s, id=s, revoked={"type": "boolean"}),
                ["partner_id", "key_id"],
                "200",
            )
        },
        f"{prefix}/partners/{{partner_id}}/certificates": {
            "post": op(
                "Pin a certificate by fingerprint or PEM (admin role; audited as pin-add)",
                {**cert, "properties": {**cert["properties"], "label": sn}},
                obj(partner=s, sha256=s, label=sn),
                ["partner_id"],
                "201",
            ),
            "delete": op(
                "Unpin a certificate by fingerprint or PEM (admin role; audited as pin-remove)",
                cert,
                obj(partner=s, sha256=s, pinned={"type": "boolean"}),
                ["partner_id"],
                "200",
            ),
        },
    }
