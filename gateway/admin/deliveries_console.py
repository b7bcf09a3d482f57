"""The console's deliveries: per partner endpoint (pending, in flight, failing, dead), the deliveries of a
partner or status, one delivery's timeline, and replay or discard of dead ones (operator role, audited)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.admin import deliveries_ops as operations
from gateway.admin.deliveries_api import _STATUSES, _row, endpoint_summary
from gateway.delivery.errors import UnknownEndpointError
from gateway.delivery.hooks import endpoint_of
from gateway.delivery.records import DeliveryLedger
from gateway.errors import GatewayError, NotFoundError

__all__ = ["delivery_console_routes"]


def delivery_console_routes(
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
    def broker() -> Any:
        return service.parts()[0]

    async def deliveries(request: Request, principal: Any) -> Response:
        q = {k: v for k, v in request.query_params.items() if k in ("partner", "endpoint", "status") and v}
        if q.get("status") not in (None, *_STATUSES):
            q.pop("status")
        summary = await thread(lambda: endpoint_summary(service, broker()))
        rows = await thread(
            lambda: DeliveryLedger(broker().engine).list(
                partner=q.get("partner"), endpoint=q.get("endpoint"), status=q.get("status") or "dead", limit=200
            )
        )
        return render(
            "deliveries.html",
            request,
            principal,
            title="Deliveries",
            nav="deliveries",
            endpoints=summary["endpoints"],
            rows=[_row(r) for r in rows],
            q=q,
            statuses=_STATUSES,
        )

    async def delivery(request: Request, principal: Any) -> Response:
        row = await thread(lambda: DeliveryLedger(broker().engine).get(request.path_params["message_id"]))
        if row is None:
            raise NotFoundError("No such delivery.")
        return render(
            "delivery.html", request, principal, title=f"Delivery {row.message_id}", nav="deliveries", d=_row(row)
        )

    async def act(request: Request, principal: Any) -> Response:
        form = await read_form(request)
        service.access.check_change(principal, "POST", request.headers, one(form, "csrf"))
        return_to = one(form, "return_to") or "/console/deliveries"
        action = one(form, "action") or ""
        if action not in ("replay", "discard"):
            return back(return_to, error="Choose replay or discard.")
        try:
            principal.require_operator()
            endpoint = endpoint_of(service.assembly.partners, one(form, "partner") or "", one(form, "endpoint") or "")
        except UnknownEndpointError as exc:
            return back(return_to, error=exc.detail)
        except GatewayError as exc:
            return back(return_to, error=exc.detail)
        ids = [i for i in form.get("message_id", []) if i][:1000] or None
        done = await thread(
            lambda: getattr(operations, action)(
                broker(), endpoint, ids, operator=principal.name, role=principal.role, client=client(request.scope)
            )
        )
        verb = "Replayed" if action == "replay" else "Discarded"
        return back(return_to, done=f"{verb} {len(done)} dead deliver{'y' if len(done) == 1 else 'ies'}.")

    return [
        Route("/console/deliveries", page(deliveries), methods=["GET"]),
        Route("/console/deliveries/actions", page(act), methods=["POST"]),
        Route("/console/deliveries/{message_id}", page(delivery), methods=["GET"]),
    ]
