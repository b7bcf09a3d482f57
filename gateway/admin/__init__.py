"""Operations: the admin API (``/admin/api/v1``), the web console (``/console``) and ``/metrics``.

:class:`Operations` is what :func:`gateway.http.app.create_app` adds to the gateway: its routes, the HTTP
metrics around every request, the store's commit observer, and, when ``admin.port`` is set, a listener of
its own for the admin side (then the partner API's port serves none of it; with ``--processes N`` process 0
alone binds it). By default the admin side is served by the partner API's server: simplest where that port
is private; where it is public, give the admin side its own port on a private address.

The admin API and the console are mounted when operators are configured (or ``admin.enabled: true``).
``/metrics`` names partners and their traffic, so it is served where the admin side is: on the admin
listener, or, when the admin side shares the partner API's port, there behind the operators'
authentication (:mod:`gateway.admin.metrics_access`); never to anyone on the partner port unless
``admin.metrics_on_partner_port: true``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.admin.api import api_routes
from gateway.admin.console import console_routes
from gateway.admin.metrics_access import partner_port_metrics
from gateway.admin.openapi import merge_admin
from gateway.admin.service import AdminService
from gateway.config.operations import AdminSettings
from gateway.telemetry.metrics import HttpMetrics, StoreMetrics, observe_commit, scrape

__all__ = ["Operations"]

log = logging.getLogger(__name__)


class Operations:
    """The operators' side of one gateway app (see the module docstring)."""

    def __init__(self, assembly: Any, runtime: Callable[[], Any], *, listener: bool = True) -> None:
        self.assembly = assembly
        self.admin: AdminSettings = assembly.settings.admin or AdminSettings()
        self.service = AdminService(assembly, runtime, self.admin)
        self.http = HttpMetrics(set(assembly.partners.partners))
        self.store_metrics = StoreMetrics(self._snapshot, self._dead_letter_prefix)
        self._listener_wanted = listener and self.admin.active and self.admin.separate
        self._server: Any = None
        self._serving: asyncio.Task[None] | None = None
        self._broker: Any = None
        self._lifecycle: Any = None  # the retention metrics, read from the store (gateway.ledger.retention_metrics)

    def _snapshot(self) -> Any:
        return self.service.sampler.current()

    def _dead_letter_prefix(self) -> str:
        return f"queue://{self.service.broker.policy.dead_letter_prefix}"

    # ----------------------------------------------------------------- routes

    def admin_routes(self) -> list[Route]:
        routes = [Route("/metrics", self.metrics_endpoint, methods=["GET"])]
        if self.admin.active:
            routes += api_routes(self.service) + console_routes(self.service)
        return routes

    def routes(self) -> list[Route]:
        """The routes the partner API's app adds: the admin side's unless it has its own listener, and
        ``/metrics`` as :func:`gateway.admin.metrics_access.partner_port_metrics` decides."""
        routes = partner_port_metrics(self.admin, self.metrics_endpoint, self.service)
        if self.admin.active and not self.admin.separate:
            routes += api_routes(self.service) + console_routes(self.service)
        return routes

    def openapi(self, document: dict[str, Any]) -> dict[str, Any]:
        return merge_admin(document) if self.admin.active else document

    async def metrics_endpoint(self, request: Request) -> Response:
        def exposition() -> tuple[bytes, str]:
            self.http.flush()  # this process's requests up to now
            return scrape(self.store_metrics, self._lifecycle)

        body, media = await asyncio.to_thread(exposition)
        return Response(body, media_type=media, headers={"Cache-Control": "no-store"})

    # ----------------------------------------------------------------- lifecycle (the app's lifespan)

    async def started(self, runtime: Any) -> None:
        broker = getattr(runtime, "broker", None)
        if broker is not None:
            broker.observe_commits(observe_commit)
            self._broker = broker
            engine = broker.engine
            if engine is not None:
                from gateway.ledger.retention_metrics import LifecycleCollector

                self._lifecycle = LifecycleCollector(engine)
        if self._listener_wanted:
            await self._start_listener()

    async def stopping(self) -> None:
        self.http.flush()
        if self._server is not None:
            self._server.should_exit = True
            if self._serving is not None:
                await self._serving
            await self._server.shutdown()
            self._server = None
        if self._broker is not None and not self._broker.closed:
            self._broker.observe_commits(None)
        self.service.close()

    async def _start_listener(self) -> None:
        import uvicorn

        app = Starlette(routes=self.admin_routes() + [Route("/healthz", _healthz, methods=["GET"])])
        from gateway.runtime.trust_serving import admin_listener_options, start_reloading
        from gateway.trust.peer import TrustMiddleware

        settings = self.assembly.settings
        trusted = TrustMiddleware(app, settings.trust, on_lifespan=lambda: start_reloading(None))
        config = uvicorn.Config(
            trusted,
            host=self.admin.host or "127.0.0.1",
            port=self.admin.port or 0,
            lifespan="off",
            log_config=None,
            **admin_listener_options(settings),
        )
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        try:
            await server.startup()
        except SystemExit:  # uvicorn exits when it cannot bind: the partner API still serves
            log.error("admin listener not started on %s:%s (set admin.port to a free port)", config.host, config.port)
            return
        self._server = server
        self._serving = asyncio.create_task(server.main_loop())
        log.info(
            "admin side (console, admin API, metrics) on %s://%s:%d",
            "https" if settings.trust.tls is not None else "http",
            config.host,
            server.servers[0].sockets[0].getsockname()[1] if server.servers else config.port,
        )

    @property
    def listener_port(self) -> int | None:
        """The admin listener's port (tests ask for port 0), when it runs."""
        if self._server is None or not self._server.servers:
            return None
        return self._server.servers[0].sockets[0].getsockname()[1]


async def _healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})
