"""Who may read ``/metrics`` on the partner API's port.

The exposition names every partner and counts its requests and refusals: nothing a partner (or anyone
who reaches the partner port) should read. On the partner port it is therefore served

* to anyone only with ``admin.metrics_on_partner_port: true`` (a scraper that cannot authenticate, on a
  port that is private anyway);
* else, when the admin side is served on that port (no ``admin.port``), to operators only: HTTP Basic
  credentials of any configured operator (viewer is enough), or a console session;
* else not at all (404): the admin side's own listener serves it, or nothing does.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.config.operations import AdminSettings
from gateway.errors import GatewayError

__all__ = ["partner_port_metrics"]

log = logging.getLogger(__name__)

Endpoint = Callable[[Request], Awaitable[Response]]


def partner_port_metrics(admin: AdminSettings, endpoint: Endpoint, service: Any) -> list[Route]:
    """The ``/metrics`` route of the partner port (none, open, or for operators: see the module docstring)."""
    if admin.metrics_on_partner_port:
        return [Route("/metrics", endpoint, methods=["GET"])]
    if not admin.active or admin.separate:
        return []

    async def for_operators(request: Request) -> Response:
        from gateway.admin.api import problem

        try:
            await service.access.authenticate(request.scope, request.headers, request.cookies)
        except GatewayError as exc:
            return problem(exc, request.url.path)
        return await endpoint(request)

    return [Route("/metrics", for_operators, methods=["GET"])]
