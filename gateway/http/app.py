"""The HTTP API (Starlette): :func:`create_app`.

==========================================  ==========================================================
``POST /v1/documents``                      submit a document: 202 receipt (one-way) or 200 reply
``GET  /v1/documents/{message_id}``         the partner's own document: status, history, reply
``GET  /v1/documents/{message_id}/reply``   the reply document itself (XML)
``GET  /healthz``                           the process is up
``GET  /readyz``                            the store is reachable (503 otherwise)
``GET  /openapi.json``                      the OpenAPI 3.1 description
``/console``, ``/admin/api/v1/...``         the operators' console and admin API (:mod:`gateway.admin`,
                                            when operators are configured; or on ``admin.port``)
``GET  /metrics``                           Prometheus metrics (:mod:`gateway.telemetry.metrics`)
``POST /as2``                               an AS2 message, answered with its MDN (:mod:`gateway.as2`;
                                            when the ``as2:`` section is configured)
==========================================  ==========================================================

Checks on ``POST``, in order: the API key (401), the partner's request limits
(429, with ``Retry-After``: :class:`gateway.routing.partners.PartnerLimiter`), the media
type (415), the declared length then the streamed size (413), the
``X-Correlation-ID`` / ``Idempotency-Key`` headers (400), then
:meth:`gateway.exchange.submission.Gateway.submit` (400 / 422 / 403 / 502 / 503 / 504).
Every error goes through
:func:`gateway.problems.problem_response` (RFC 9457 ``application/problem+json``);
an unexpected exception is logged and answered with a bare 500 problem that
says nothing about it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from broker_core.collector import settle_collector
from gateway.config.loader import Settings
from gateway.errors import (
    GatewayError,
    InvalidHeaderError,
    MethodNotAllowedError,
    NotFoundError,
    StoreUnavailableError,
)
from gateway.exchange.assemble import Assembly, assemble_or_raise
from gateway.exchange.ids import iso_ms
from gateway.exchange.submission import Gateway, Outcome
from gateway.http.auth import authenticated
from gateway.http.openapi import CORRELATION_ID_PATTERN, IDEMPOTENCY_KEY_PATTERN, openapi_document
from gateway.intake.xmlsafe import check_media_type, read_body
from gateway.ledger.records import LedgerRecord
from gateway.problems import problem_response
from gateway.raw_documents import raw_document_response
from gateway.routing.overlay import attach_overlay
from gateway.routing.partners import PartnerLimiter
from gateway.runtime.serving import Runtime, start_stomp
from gateway.security.attach import attach_key_digests

__all__ = ["create_app"]

log = logging.getLogger(__name__)

# the patterns the OpenAPI document states; a value is matched once HTTP's surrounding whitespace is stripped
_CORRELATION = re.compile(CORRELATION_ID_PATTERN)
_IDEMPOTENCY = re.compile(IDEMPOTENCY_KEY_PATTERN)
_JSON = "application/json"
_XML = "application/xml; charset=utf-8"
_JSON_RAW = _JSON.encode("latin-1")
_XML_RAW = _XML.encode("latin-1")


def _header(request: Request, name: str, pattern: re.Pattern[str], rule: str) -> str | None:
    return _checked(request.headers.get(name), name, pattern, rule)


def _checked(value: str | None, name: str, pattern: re.Pattern[str], rule: str) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if not pattern.fullmatch(value):
        raise InvalidHeaderError(f"The {name} header must be {rule}.", header=name)
    return value


def _length(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        raise InvalidHeaderError("The Content-Length header is not a number.", header="Content-Length") from None
    if length < 0:
        raise InvalidHeaderError("The Content-Length header is negative.", header="Content-Length")
    return length


_CORRELATION_RULE = "1 to 128 printable ASCII characters without spaces"
_IDEMPOTENCY_RULE = "1 to 200 printable ASCII characters (spaces only between others)"


def _outcome_raw(outcome: Outcome) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, raw ASGI headers and body of the answer to an accepted document (the same bytes as a
    Starlette ``Response`` with these headers and media type would send)."""
    headers = [
        (b"x-message-id", outcome.message_id.encode("latin-1")),
        (b"x-correlation-id", outcome.correlation_id.encode("latin-1")),
        (b"x-route-id", outcome.route.encode("latin-1")),
        (b"cache-control", b"no-store"),
    ]
    if outcome.replayed:
        headers.append((b"idempotent-replayed", b"true"))
    if outcome.reply is not None:
        status, body, media_type = 200, outcome.reply, _XML_RAW
        headers.append((b"content-location", outcome.status_url.encode("latin-1")))
    else:
        status, media_type = 202, _JSON_RAW
        receipt = outcome.receipt_json
        body = (receipt if receipt is not None else json.dumps(outcome.receipt, separators=(",", ":"))).encode("utf-8")
        headers.append((b"location", outcome.status_url.encode("latin-1")))
    headers.append((b"content-length", str(len(body)).encode("latin-1")))
    headers.append((b"content-type", media_type))
    return status, headers, body


def _outcome_response(outcome: Outcome) -> Response:
    status, headers, body = _outcome_raw(outcome)
    response = Response(body, status_code=status)
    response.raw_headers = headers
    return response


def _status_body(record: LedgerRecord) -> dict[str, Any]:
    warnings = json.loads(record.receipt).get("warnings") if record.receipt and '"warnings"' in record.receipt else None
    reply = None
    if record.reply is not None:
        reply = record.reply.decode("utf-8", errors="replace")
    return {
        "message_id": record.message_id,
        "correlation_id": record.correlation_id,
        "route": record.route,
        "document_type": record.doc_type,
        "document_id": record.doc_id,
        "status": record.status,
        "received_at": iso_ms(record.received_at),
        "updated_at": iso_ms(record.updated_at),
        "history": [{"status": s, "at": iso_ms(at)} for s, at in (record.history or [])],
        "reply": reply,
        "reply_type": record.reply_type,
        "reply_url": f"/v1/documents/{record.message_id}/reply" if record.reply is not None else None,
        "error": record.error,
        **({"warnings": warnings} if warnings else {}),  # business rule warnings the receipt listed
    }


Handler = Callable[[Request], Awaitable[Response]]


def _problems(endpoint: Handler) -> Handler:
    """Answer every error of *endpoint* with a problem (nothing escapes to the server)."""

    async def wrapped(request: Request) -> Response:
        try:
            return await endpoint(request)
        except GatewayError as exc:
            return problem_response(exc, request.url.path)
        except Exception:  # a bug: log it, tell the client nothing about it
            log.exception("unexpected error on %s %s", request.method, request.url.path)
            return problem_response(GatewayError(), request.url.path)

    wrapped.__name__ = getattr(endpoint, "__name__", "endpoint")
    wrapped.__doc__ = endpoint.__doc__
    return wrapped


class _RawHeaders:
    """The first value of each request header, like Starlette's ``Headers.get`` (names in lower case),
    straight from the ASGI scope."""

    __slots__ = ("_values",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        values: dict[bytes, bytes] = {}
        for name, value in raw:
            if name not in values:
                values[name] = value
        self._values = values

    def get(self, name: str) -> str | None:
        value = self._values.get(name.encode("latin-1"))
        return None if value is None else value.decode("latin-1")


async def _stream(receive: Any) -> AsyncIterator[bytes]:
    """The request body's chunks, like Starlette's ``Request.stream()``."""
    while True:
        message = await receive()
        if message["type"] == "http.request":
            body = message.get("body", b"")
            if body:
                yield body
            if not message.get("more_body", False):
                return
        elif message["type"] == "http.disconnect":
            raise ClientDisconnect()


RawAnswer = tuple[int, list[tuple[bytes, bytes]], bytes]


def _fast_endpoint(endpoint: Callable[[Any, Any], Awaitable[RawAnswer]]) -> Callable[[Any, Any, Any], Awaitable[None]]:
    """A bare ASGI endpoint answering errors like :func:`_problems` does."""

    async def run(scope: Any, receive: Any, send: Any) -> None:
        try:
            status, headers, body = await endpoint(scope, receive)
        except GatewayError as exc:
            await problem_response(exc, scope["path"])(scope, receive, send)
            return
        except Exception:  # a bug: log it, tell the client nothing about it
            log.exception("unexpected error on %s %s", scope["method"], scope["path"])
            await problem_response(GatewayError(), scope["path"])(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return run


class _GatewayApp(Starlette):
    """Starlette, with the hot ``POST`` endpoints (``/v1/documents``, and ``/v1/noop`` when enabled) called
    directly: the same checks, answers and errors, without the router, the middleware stack and a
    ``Request`` per document (about a tenth of the CPU time of an accepted document). Anything else, and
    these paths too once middleware is added or under a ``root_path``, goes through Starlette."""

    fast_posts: dict[str, Callable[[Any, Any, Any], Awaitable[None]]] = {}
    #: Counts every HTTP request around the dispatch (gateway.admin.Operations: metrics, log context).
    observer: Callable[[Any, Any, Any, Any], Awaitable[None]] | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        observer = self.observer
        if observer is not None and scope["type"] == "http":
            await observer(scope, receive, send, self._dispatch)
            return
        await self._dispatch(scope, receive, send)

    async def _dispatch(self, scope: Any, receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and not scope.get("root_path")
            and not self.user_middleware
        ):
            endpoint = self.fast_posts.get(scope["path"])
            if endpoint is not None:
                scope["app"] = self
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


class _PartnerApi:
    """The partner API's endpoints over one assembled configuration and the runtime serving it (made by the
    app's lifespan, or given by the caller)."""

    def __init__(self, assembly: Assembly, runtime: Runtime | None, noop_endpoint: bool) -> None:
        self.assembly = assembly
        self.partners = assembly.partners
        self.limits = assembly.settings.limits
        self.runtime = runtime
        self.noop_endpoint = noop_endpoint
        self.limiter = PartnerLimiter()  # each partner's requests in progress and rate (429 over them)
        self.document: dict[str, Any] = {}  # the OpenAPI document, once the admin side has added its paths

    def gateway(self) -> Gateway:
        rt = self.runtime
        if rt is None or rt.gateway is None or not rt.gateway.ready:
            raise StoreUnavailableError("The gateway is starting or stopping; retry in a moment.")
        return rt.gateway

    async def accept(self, scope: Any, headers: Any, chunks: AsyncIterator[bytes]) -> Outcome:
        """``POST /v1/documents``: the checks in order (see the module docstring), then the gateway."""
        identity = await authenticated(self.partners, scope, headers.get("authorization"))
        partner = identity.partner
        await self.limiter.admit(partner)
        try:
            charset = check_media_type(headers.get("content-type"))
            correlation = _checked(headers.get("x-correlation-id"), "X-Correlation-ID", _CORRELATION, _CORRELATION_RULE)
            key = _checked(headers.get("idempotency-key"), "Idempotency-Key", _IDEMPOTENCY, _IDEMPOTENCY_RULE)
            declared = _length(headers.get("content-length"))
            body = await read_body(chunks, self.limits.max_bytes, declared_length=declared)
            return await self.gateway().submit(
                partner, body, charset=charset, correlation_id=correlation, idempotency_key=key, auth=identity.method
            )
        finally:
            self.limiter.release(partner)

    async def post_document(self, request: Request) -> Response:
        return _outcome_response(await self.accept(request.scope, request.headers, request.stream()))

    async def fast_post_document(self, scope: Any, receive: Any) -> RawAnswer:
        return _outcome_raw(await self.accept(scope, _RawHeaders(scope["headers"]), _stream(receive)))

    async def _own_record(self, request: Request, refresh: bool) -> LedgerRecord:
        partner = (await authenticated(self.partners, request.scope, request.headers.get("authorization"))).partner
        await self.limiter.admit(partner)
        try:
            gw = self.gateway()
            reconciler = self.runtime.reconciler if refresh and self.runtime is not None else None
            if reconciler is None:
                return await gw.document(partner, request.path_params["message_id"])
            return await gw.document(partner, request.path_params["message_id"], reconciler.refresh)
        finally:
            self.limiter.release(partner)

    async def get_document(self, request: Request) -> Response:
        record = await self._own_record(request, refresh=True)
        body = json.dumps(_status_body(record), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return Response(
            body, media_type=_JSON, headers={"Cache-Control": "no-store", "X-Correlation-ID": record.correlation_id}
        )

    async def get_reply(self, request: Request) -> Response:
        record = await self._own_record(request, refresh=False)
        if record.reply is None:
            raise NotFoundError(f"Document {record.message_id} has no reply yet (status: {record.status}).")
        return raw_document_response(
            record.reply,
            f"{record.message_id}-reply",
            {"X-Message-ID": record.message_id, "X-Correlation-ID": record.correlation_id},
        )

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        gw = self.gateway()
        try:
            await asyncio.to_thread(gw.ledger.ping)
        except Exception as exc:  # any failure means not ready
            log.warning("readiness check failed: %s", str(exc).splitlines()[0][:200] if str(exc) else type(exc))
            raise StoreUnavailableError("The store does not answer.") from None
        return JSONResponse({"status": "ready"})

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(self.document)

    async def _noop_body(self, headers: Any, chunks: AsyncIterator[bytes]) -> bytes:
        body = await read_body(chunks, self.limits.max_bytes, declared_length=_length(headers.get("content-length")))
        return b'{"status":"noop","bytes":%d}' % len(body)

    async def noop(self, request: Request) -> Response:
        return Response(await self._noop_body(request.headers, request.stream()), status_code=202, media_type=_JSON)

    async def fast_noop(self, scope: Any, receive: Any) -> RawAnswer:
        body = await self._noop_body(_RawHeaders(scope["headers"]), _stream(receive))
        return 202, [(b"content-length", str(len(body)).encode("latin-1")), (b"content-type", _JSON_RAW)], body

    def routes(self) -> list[Route]:
        routes = [
            Route("/v1/documents", _problems(self.post_document), methods=["POST"]),
            Route("/v1/documents/{message_id}", _problems(self.get_document), methods=["GET"]),
            Route("/v1/documents/{message_id}/reply", _problems(self.get_reply), methods=["GET"]),
            Route("/healthz", _problems(self.healthz), methods=["GET"]),
            Route("/readyz", _problems(self.readyz), methods=["GET"]),
            Route("/openapi.json", _problems(self.openapi), methods=["GET"]),
        ]
        if self.noop_endpoint:
            routes.append(Route("/v1/noop", _problems(self.noop), methods=["POST"]))
        if self.assembly.settings.as2 is not None:  # AS2 (RFC 4130): gateway.as2
            from gateway.as2.endpoint import as2_endpoint

            endpoint = as2_endpoint(self.assembly, self.gateway, self.limiter)
            routes.append(Route("/as2", _problems(endpoint), methods=["POST"]))
        return routes

    def fast_posts(self) -> dict[str, Callable[[Any, Any, Any], Awaitable[None]]]:
        """The POST endpoints served without Starlette's router (see :class:`_GatewayApp`)."""
        fast = {"/v1/documents": _fast_endpoint(self.fast_post_document)}
        if self.noop_endpoint:
            fast["/v1/noop"] = _fast_endpoint(self.fast_noop)
        return fast


def _openapi(api: _PartnerApi, ops: Any) -> dict[str, Any]:
    """The OpenAPI document: the partner API's, the admin side's paths, and ``POST /as2`` when configured."""
    document = ops.openapi(openapi_document(max_body_bytes=api.limits.max_bytes, noop_endpoint=api.noop_endpoint))
    if api.assembly.settings.as2 is not None:
        from gateway.as2.endpoint import as2_openapi_path

        document["paths"]["/as2"] = as2_openapi_path()
    return document


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 and 405 (and any other HTTPException) as problem documents."""
    status = getattr(exc, "status_code", 500)
    if status == 404:
        error: GatewayError = NotFoundError()
    elif status == 405:
        allowed = (getattr(exc, "headers", None) or {}).get("Allow", "")
        error = MethodNotAllowedError(
            f"{request.method} is not allowed here; use {allowed or 'another method'}.",
            allowed=[m.strip() for m in allowed.split(",") if m.strip()],
        )
    else:
        error = GatewayError()
    return problem_response(error, request.url.path)


def _lifespan(
    api: _PartnerApi,
    ops: Any,
    *,
    workers: bool,
    etl: bool,
    reconcile: bool,
    stomp: bool,
    freeze_gc: bool,
    on_started: Callable[[], None] | None,
) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    """Start what serves the app (unless the caller gave its runtime), and stop it, in that order back."""
    assembly = api.assembly

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        own = api.runtime is None
        listener = None
        if own:
            rt = Runtime(assembly, workers=workers, etl=etl, reconcile=reconcile)
            await asyncio.to_thread(rt.start)
            api.runtime = rt
            if stomp:
                listener = await start_stomp(assembly.settings, rt.broker)
        await asyncio.to_thread(attach_key_digests, api.partners, api.runtime)
        served = await asyncio.to_thread(attach_overlay, api.partners, getattr(api.runtime, "broker", None))
        if served is not None:  # the partner changes made from the admin side, over the partners file
            api.partners.adopt(served)
        if freeze_gc:
            settle_collector()  # see broker_core.collector
        await ops.started(api.runtime)
        if on_started is not None:
            on_started()
        try:
            yield
        finally:
            await ops.stopping()
            if listener is not None:
                await listener.stop()
            if own:
                rt, api.runtime = api.runtime, None
                await asyncio.to_thread(rt.stop)

    return lifespan


def create_app(
    settings: Settings | Assembly,
    *,
    runtime: Runtime | None = None,
    workers: bool = True,
    etl: bool = True,
    reconcile: bool = True,
    noop_endpoint: bool = False,
    stomp: bool = False,
    freeze_gc: bool = False,
    on_started: Callable[[], None] | None = None,
    admin_listener: bool = True,
) -> Starlette:
    """The gateway's ASGI app for *settings* (or an already assembled configuration).

    With *stomp* the lifespan also starts the STOMP listener (``stomp:``
    section; on by default at 127.0.0.1:61613) on the app's event loop.

    The configuration is checked here (a :class:`~gateway.errors.ConfigError`
    raises at once); the broker, ledger, reconciler, workers (``workers:``)
    and warehouse load (``etl:``) start in the app's lifespan. *runtime*
    replaces the runtime the lifespan would make (tests share one broker).
    ``noop_endpoint`` adds ``POST /v1/noop`` (reads the body, answers 202):
    the benchmark's measure of the HTTP stack alone. With *freeze_gc* the
    lifespan moves everything the start-up made (broker, store, engine,
    workers: tens of thousands of long-lived objects) out of the garbage
    collector's sight once it has started (``gc.freeze``), as ``b2bgw serve``
    does with the configuration before: every full collection would otherwise
    walk them again, a pause of tens of milliseconds in the middle of some
    requests (:mod:`broker_core.collector`). *on_started* is called once everything has started (``b2bgw
    serve --processes`` tells its supervisor so). The console, the admin API
    and ``/metrics`` come from :class:`gateway.admin.Operations`; with
    *admin_listener* (process 0's) the admin side's own listener starts when
    ``admin.port`` is set.
    """
    from gateway.admin import Operations

    assembly = settings if isinstance(settings, Assembly) else assemble_or_raise(settings)
    api = _PartnerApi(assembly, runtime, noop_endpoint)
    ops = Operations(assembly, lambda: api.runtime, listener=admin_listener)
    api.document = _openapi(api, ops)
    lifespan = _lifespan(
        api, ops, workers=workers, etl=etl, reconcile=reconcile, stomp=stomp, freeze_gc=freeze_gc, on_started=on_started
    )
    app = _GatewayApp(
        routes=api.routes() + ops.routes(), exception_handlers={HTTPException: _http_error}, lifespan=lifespan
    )
    app.fast_posts = api.fast_posts()
    app.observer = ops.http
    app.state.ops = ops
    app.state.assembly = assembly
    return app
