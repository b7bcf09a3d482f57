"""The console's partner credentials: every partner's keys, revoked keys and pinned certificates as served,
and for an admin the forms that add a partner, issue a key (shown once, on the answer page itself, never in
a URL), revoke a key, pin or unpin a certificate, posting to the same functions as the admin API
(:mod:`gateway.admin.partners_ops`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.admin import partners_ops as ops
from gateway.errors import GatewayError

__all__ = ["partner_console_routes"]

PAGE = "/console/partners/credentials"
_FIELDS = ("id", "name", "label", "not_before", "not_after", "sha256", "pem")


def partner_console_routes(
    service: Any,
    *,
    render: Callable[..., Response],
    page: Callable[..., Any],
    read_form: Callable[..., Any],
    one: Callable[..., Any],
    back: Callable[..., Response],
    thread: Callable[..., Any],
    client: Callable[[Any], str],
) -> list[Route]:
    async def show(request: Request, principal: Any, issued: dict[str, Any] | None = None) -> Response:
        data = await thread(ops.credentials, service)
        return render(
            "partner_credentials.html",
            request,
            principal,
            title="Partner credentials",
            nav="partners",
            partners=data["partners"],
            issued=issued,
        )

    async def credentials(request: Request, principal: Any) -> Response:
        return await show(request, principal)

    async def act(request: Request, principal: Any) -> Response:
        form = await read_form(request)
        service.access.check_change(principal, "POST", request.headers, one(form, "csrf"))
        action = one(form, "action") or ""
        partner = (one(form, "partner") or "").strip()
        spec = {k: (one(form, k) or "").strip() for k in _FIELDS}
        where = client(request.scope)
        try:
            principal.require_admin()
            if action == "add-partner":
                done, fresh = await thread(ops.add_partner, service, principal, spec, where)
                message = f"Partner {done['id']} added."
            elif action == "issue-key":
                done, fresh = await thread(ops.issue_key, service, principal, partner, spec, where)
                service.assembly.partners.adopt(fresh)
                return await show(request, principal, issued=done)  # the key on this page only, once
            elif action == "revoke-key":
                done, fresh = await thread(ops.revoke_key, service, principal, partner, spec["id"], where)
                message = f"Key {done['id']} of {partner} revoked."
            elif action == "pin":
                done, fresh = await thread(ops.pin_certificate, service, principal, partner, spec, where)
                message = f"Certificate sha256:{done['sha256']} pinned to {partner}."
            elif action == "unpin":
                done, fresh = await thread(ops.unpin_certificate, service, principal, partner, spec, where)
                message = f"Certificate sha256:{done['sha256']} unpinned from {partner}."
            else:
                return back(PAGE, error="Choose an action.")
        except GatewayError as exc:
            return back(PAGE, error=exc.detail)
        service.assembly.partners.adopt(fresh)
        return back(PAGE, done=message)

    return [
        Route(PAGE, page(credentials), methods=["GET"]),
        Route("/console/partners/actions", page(act), methods=["POST"]),
    ]
