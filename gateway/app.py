"""The HTTP API (Starlette): :func:`create_app`.

==========================================  ==========================================================
``POST /v1/documents``                      submit a document: 202 receipt (one-way) or 200 reply
``GET  /v1/documents/{message_id}``         the partner's own document: status, history, reply
``GET  /v1/documents/{message_id}/reply``   the reply document itself (XML)
``GET  /healthz``                           the process is up
``GET  /readyz``                            the store is reachable (503 otherwise)
``GET  /openapi.json``                      the OpenAPI 3.1 description
==========================================  ==========================================================

Checks on ``POST``, in order: the API key (401), the media type (415), the
declared length then the streamed size (413), the ``X-Correlation-ID`` /
``Idempotency-Key`` headers (400), then :meth:`gateway.service.Gateway.submit`
(400 / 422 / 403 / 502 / 503 / 504). Every error goes through
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
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .assemble import Assembly, assemble_or_raise
from .config import Settings
from .errors import (
    GatewayError,
    InvalidHeaderError,
    MethodNotAllowedError,
    NotFoundError,
    StoreUnavailableError,
)
from .ledger import LedgerRecord
from .openapi import openapi_document
from .problems import problem_response
from .runtime import Runtime, start_stomp
from .service import Gateway, Outcome, iso_ms
from .xmlintake import check_media_type, read_body

__all__ = ["create_app"]

log = logging.getLogger(__name__)

_CORRELATION = re.compile(r"^[!-~]{1,128}$")
_IDEMPOTENCY = re.compile(r"^[ -~]{1,200}$")
_JSON = "application/json"
_XML = "application/xml; charset=utf-8"


def _header(request: Request, name: str, pattern: re.Pattern[str], rule: str) -> str | None:
    value = request.headers.get(name)
    if value is None:
        return None
    value = value.strip()
    if not pattern.match(value):
        raise InvalidHeaderError(f"The {name} header must be {rule}.", header=name)
    return value


def _content_length(request: Request) -> int | None:
    value = request.headers.get("content-length")
    if value is None:
        return None
    try:
        length = int(value)
    except ValueError:
        raise InvalidHeaderError("The Content-Length header is not a number.", header="Content-Length") from None
    if length < 0:
        raise InvalidHeaderError("The Content-Length header is negative.", header="Content-Length")
    return length


def _outcome_response(outcome: Outcome) -> Response:
    headers = {
        "X-Message-ID": outcome.message_id,
        "X-Correlation-ID": outcome.correlation_id,
        "X-Route-ID": outcome.route,
        "Cache-Control": "no-store",
    }
    if outcome.replayed:
        headers["Idempotent-Replayed"] = "true"
    if outcome.reply is not None:
        headers["Content-Location"] = outcome.status_url
        return Response(outcome.reply, status_code=200, headers=headers, media_type=_XML)
    headers["Location"] = outcome.status_url
    body = json.dumps(outcome.receipt, separators=(",", ":")).encode("utf-8")
    return Response(body, status_code=202, headers=headers, media_type=_JSON)


def _status_body(record: LedgerRecord) -> dict[str, Any]:
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
    }


Handler = Callable[[Request], Awaitable[Response]]


def _problems(endpoint: Handler) -> Handler:
    """Answer every error of *endpoint* with a problem (nothing escapes to the server)."""

    async def wrapped(request: Request) -> Response:
        try:
            return await endpoint(request)
        except GatewayError as exc:
            return problem_response(exc, request.url.path)
        except Exception:  # noqa: BLE001 - a bug: log it, tell the client nothing about it
            log.exception("unexpected error on %s %s", request.method, request.url.path)
            return problem_response(GatewayError(), request.url.path)

    wrapped.__name__ = getattr(endpoint, "__name__", "endpoint")
    wrapped.__doc__ = endpoint.__doc__
    return wrapped


def create_app(
    settings: Settings | Assembly,
    *,
    runtime: Runtime | None = None,
    workers: bool = True,
    etl: bool = True,
    reconcile: bool = True,
    noop_endpoint: bool = False,
    stomp: bool = False,
) -> Starlette:
    """The gateway's ASGI app for *settings* (or an already assembled configuration).

    With *stomp* the lifespan also starts the STOMP listener (``stomp:``
    section; on by default at 127.0.0.1:61613) on the app's event loop.

    The configuration is checked here (a :class:`~gateway.errors.ConfigError`
    raises at once); the broker, ledger, reconciler, workers (``workers:``)
    and warehouse load (``etl:``) start in the app's lifespan. *runtime*
    replaces the runtime the lifespan would make (tests share one broker).
    ``noop_endpoint`` adds ``POST /v1/noop`` (reads the body, answers 202):
    the benchmark's measure of the HTTP stack alone.
    """
    assembly = settings if isinstance(settings, Assembly) else assemble_or_raise(settings)
    limits = assembly.settings.limits
    partners = assembly.partners
    state: dict[str, Any] = {"runtime": runtime}

    def gateway() -> Gateway:
        rt: Runtime | None = state["runtime"]
        if rt is None or rt.gateway is None or not rt.gateway.ready:
            raise StoreUnavailableError("The gateway is starting or stopping; retry in a moment.")
        return rt.gateway

    async def post_document(request: Request) -> Response:
        partner = await partners.authenticate_async(request.headers.get("authorization"))
        charset = check_media_type(request.headers.get("content-type"))
        correlation = _header(request, "X-Correlation-ID", _CORRELATION,
                              "1 to 128 printable ASCII characters without spaces")
        key = _header(request, "Idempotency-Key", _IDEMPOTENCY, "1 to 200 printable ASCII characters")
        declared = _content_length(request)
        body = await read_body(request.stream(), limits.max_bytes, declared_length=declared)
        outcome = await gateway().submit(partner, body, charset=charset, correlation_id=correlation,
                                         idempotency_key=key)
        return _outcome_response(outcome)

    async def get_document(request: Request) -> Response:
        partner = await partners.authenticate_async(request.headers.get("authorization"))
        gw = gateway()
        rt: Runtime = state["runtime"]
        refresh = rt.reconciler.refresh if rt.reconciler is not None else None
        record = await gw.document(partner, request.path_params["message_id"], refresh)
        body = json.dumps(_status_body(record), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return Response(body, media_type=_JSON, headers={"Cache-Control": "no-store",
                                                         "X-Correlation-ID": record.correlation_id})

    async def get_reply(request: Request) -> Response:
        partner = await partners.authenticate_async(request.headers.get("authorization"))
        record = await gateway().document(partner, request.path_params["message_id"])
        if record.reply is None:
            raise NotFoundError(f"Document {record.message_id} has no reply yet (status: {record.status}).")
        return Response(record.reply, media_type=_XML, headers={"Cache-Control": "no-store",
                                                                "X-Message-ID": record.message_id,
                                                                "X-Correlation-ID": record.correlation_id})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        gw = gateway()
        try:
            await asyncio.to_thread(gw.ledger.ping)
        except Exception as exc:  # noqa: BLE001 - any failure means not ready
            log.warning("readiness check failed: %s", str(exc).splitlines()[0][:200] if str(exc) else type(exc))
            raise StoreUnavailableError("The store does not answer.") from None
        return JSONResponse({"status": "ready"})

    document = openapi_document()

    async def openapi(request: Request) -> Response:
        return JSONResponse(document)

    async def noop(request: Request) -> Response:
        body = await read_body(request.stream(), limits.max_bytes, declared_length=_content_length(request))
        return Response(b'{"status":"noop","bytes":%d}' % len(body), status_code=202, media_type=_JSON)

    routes = [
        Route("/v1/documents", _problems(post_document), methods=["POST"]),
        Route("/v1/documents/{message_id}", _problems(get_document), methods=["GET"]),
        Route("/v1/documents/{message_id}/reply", _problems(get_reply), methods=["GET"]),
        Route("/healthz", _problems(healthz), methods=["GET"]),
        Route("/readyz", _problems(readyz), methods=["GET"]),
        Route("/openapi.json", _problems(openapi), methods=["GET"]),
    ]
    if noop_endpoint:
        routes.append(Route("/v1/noop", _problems(noop), methods=["POST"]))

    async def http_error(request: Request, exc: Exception) -> Response:
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

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        own = state["runtime"] is None
        listener = None
        if own:
            rt = Runtime(assembly, workers=workers, etl=etl, reconcile=reconcile)
            await asyncio.to_thread(rt.start)
            state["runtime"] = rt
            if stomp:
                listener = await start_stomp(assembly.settings, rt.broker)
        try:
            yield
        finally:
            if listener is not None:
                await listener.stop()
            if own:
                rt = state["runtime"]
                state["runtime"] = None
                await asyncio.to_thread(rt.stop)

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan)
    app.state.assembly = assembly
    app.state.runtime_holder = state
    return app
