"""The web console at ``/console``: server-rendered pages (Jinja2), one stylesheet and one small script,
all served by the package (it works offline).

Pages: overview (destinations with depth, trend and rates, dead letters, recent errors), a destination
(counters, chart, browse page by page with a selector, actions), a message (headers, properties, body), the
dead-letter queues, the ledger search and a document's timeline (request, reply, warehouse), partners and
routes, the warehouse load's runs, the audit log. Changes are HTML forms posted with the session's CSRF
token; each answers with a redirect back (303) and a one-line outcome.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import secrets
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from gateway.admin.access import LOGIN_COOKIE, SESSION_COOKIE, Principal, client_address
from gateway.admin.deliveries_console import delivery_console_routes
from gateway.admin.errors import InvalidRequestError, OperatorAuthError, TooManyAttemptsError
from gateway.admin.partners_console import partner_console_routes
from gateway.admin.read_audit import audit_read
from gateway.admin.service import SHOW_BYTES, AdminService, parse_limit, pretty_xml
from gateway.errors import GatewayError
from ledger_contract.tables import STATUSES

__all__ = ["console_routes"]

HERE = Path(__file__).resolve().parent
MAX_FORM = 256 * 1024
#: The overview lists the busiest destinations; the destinations page lists them all, a page at a time.
OVERVIEW_ROWS = 50
PAGE_ROWS = 200


def _static_files() -> dict[str, tuple[bytes, str, str]]:
    out = {}
    for name, media in (("console.css", "text/css; charset=utf-8"), ("console.js", "text/javascript; charset=utf-8")):
        data = (HERE / "static" / name).read_bytes()
        out[name] = (data, media, hashlib.sha256(data).hexdigest()[:12])
    return out


def when(ms: Any) -> str:
    if not ms:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + "Z"


def age(seconds: Any) -> str:
    if seconds is None:
        return "–"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60}s"
    if s < 86400:
        return f"{s // 3600}h {s % 3600 // 60}m"
    return f"{s // 86400}d {s % 86400 // 3600}h"


def ago(epoch: float) -> str:
    return age(max(0.0, time.time() - epoch)) + " ago"


def size(n: Any) -> str:
    n = n or 0
    for unit in ("B", "KB", "MB"):
        if n < 1024 or unit == "MB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def dest_url(name: str | None) -> str:
    return "/console/destination?name=" + urllib.parse.quote(name or "", safe="")


def svg_series(points: list[float | None], width: int, height: int, css: str, label: str) -> str:
    """A line chart of *points* (None: no reading) as inline SVG, scaled to its maximum."""
    values = [p for p in points if p is not None]
    if len(values) < 2:
        return f'<svg class="{css}" width="{width}" height="{height}" role="img" aria-label="{html.escape(label)}: not enough readings yet"></svg>'
    top = max(values) or 1.0
    step = width / max(1, len(points) - 1)
    coords = []
    for i, p in enumerate(points):
        if p is None:
            continue
        coords.append(f"{i * step:.1f},{height - 2 - (p / top) * (height - 4):.1f}")
    return (
        f'<svg class="{css}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'preserveAspectRatio="none" role="img" aria-label="{html.escape(label)}, max {top:g}">'
        f'<polyline fill="none" stroke="#1f6feb" stroke-width="1.5" points="{" ".join(coords)}"/></svg>'
    )


class Console:
    """The console's pages over the admin service: each page a method, :meth:`routes` their table."""

    def __init__(self, service: AdminService) -> None:
        self.service = service
        self.env = env = Environment(
            loader=FileSystemLoader(str(HERE / "templates")),
            autoescape=select_autoescape(["html"]),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.statics = statics = _static_files()
        env.globals.update(
            static=lambda name: f"/console/static/{name}?v={statics[name][2]}",
            when=when,
            age=age,
            ago=ago,
            size=size,
            dest_url=dest_url,
            statuses=STATUSES,
            show_bytes=SHOW_BYTES,
        )
        env.filters["n"] = lambda value: f"{value:,}" if isinstance(value, int) else value

    def render(
        self, template: str, request: Request, principal: Principal | None, status: int = 200, **values: Any
    ) -> HTMLResponse:
        context = {
            "principal": principal,
            "flash": request.query_params.get("done") or request.query_params.get("error"),
            "flash_error": "error" in request.query_params,
        }
        context.update(values)
        body = self.env.get_template(template).render(**context)
        return HTMLResponse(
            body,
            status_code=status,
            headers={
                "Cache-Control": "no-store",
                "X-Frame-Options": "DENY",
                "Referrer-Policy": "same-origin",
                "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                "frame-ancestors 'none'; form-action 'self'",
            },
        )

    def error_page(self, request: Request, principal: Principal | None, exc: GatewayError) -> HTMLResponse:
        return self.render(
            "base.html", request, principal, status=exc.status, flash=exc.detail, flash_error=True, title="Error"
        )

    def page(self, handler: Callable[..., Any], nav: str | None = None) -> Callable[[Request], Any]:
        async def run(request: Request) -> Response:
            try:
                principal = await asyncio.to_thread(self.service.access.session, request.cookies.get(SESSION_COOKIE))
            except GatewayError as exc:
                return self.error_page(request, None, exc)
            if principal is None:
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse("/console/login?next=" + urllib.parse.quote(target, safe=""), 303)
            try:
                return await handler(request, principal)
            except GatewayError as exc:
                return self.error_page(request, principal, exc)

        run.__name__ = handler.__name__
        return run

    def thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return asyncio.to_thread(fn, *args)

    async def read_form(self, request: Request) -> dict[str, list[str]]:
        media = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
        if media != "application/x-www-form-urlencoded":
            raise InvalidRequestError("The console posts forms (application/x-www-form-urlencoded).")
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > MAX_FORM:
                raise InvalidRequestError("The form is too large.")
            chunks.append(chunk)
        try:
            pairs = urllib.parse.parse_qsl(
                b"".join(chunks).decode("utf-8"), keep_blank_values=True, max_num_fields=2000
            )
        except (UnicodeDecodeError, ValueError):
            raise InvalidRequestError("The form could not be read.") from None
        form: dict[str, list[str]] = {}
        for key, value in pairs:
            form.setdefault(key, []).append(value)
        return form

    def one(self, form: dict[str, list[str]], key: str) -> str | None:
        values = form.get(key)
        return values[0] if values else None

    def back(self, target: str | None, **message: str) -> RedirectResponse:
        if not target or not target.startswith("/console") or target.startswith("//"):
            target = "/console"
        if message:
            target += ("&" if "?" in target else "?") + urllib.parse.urlencode(message)
        return RedirectResponse(target, 303)

    # --------------------------------------------------------------- login

    async def login_form(self, request: Request) -> Response:
        token = secrets.token_urlsafe(24)
        response = self.render(
            "login.html",
            request,
            None,
            title="Log in",
            login_token=token,
            next=request.query_params.get("next", "/console"),
        )
        response.headers.append(
            "Set-Cookie", f"{LOGIN_COOKIE}={token}; Max-Age=900{self.service.access.cookie_flags(request.scope)}"
        )
        return response

    async def login(self, request: Request) -> Response:
        try:
            form = await self.read_form(request)
            token = self.one(form, "csrf")
            cookie = request.cookies.get(LOGIN_COOKIE)
            if not token or not cookie or not secrets.compare_digest(token, cookie):
                return self.back("/console/login", error="The login form expired; try again.")
            name, secret = self.one(form, "name") or "", self.one(form, "secret") or ""
            client = client_address(request.scope)
            try:
                operator = await self.service.access.verify(name[:64], secret[:512], client, "form")  # audits a failure
            except OperatorAuthError:
                return self.back("/console/login", error="Unknown operator or wrong secret.")
            except TooManyAttemptsError as exc:
                return self.back("/console/login", error=exc.detail)
            cookie_value, _, _ = await self.thread(self.service.access.open_session, operator)
            await self.thread(
                lambda: self.service.audit.record(
                    operator=operator.name, role=operator.role, action="login", client=client
                )
            )
            response = self.back(self.one(form, "next") or "/console")
            flags = self.service.access.cookie_flags(request.scope)
            response.headers.append("Set-Cookie", f"{SESSION_COOKIE}={cookie_value}{flags}")
            response.headers.append("Set-Cookie", f"{LOGIN_COOKIE}=; Max-Age=0{flags}")
            return response
        except GatewayError as exc:
            return self.back("/console/login", error=exc.detail)

    async def logout(self, request: Request, principal: Principal) -> Response:
        form = await self.read_form(request)
        self.service.access.check_change(principal, "POST", request.headers, self.one(form, "csrf"))
        await self.thread(self.service.access.close_session, principal.session_id)
        await self.thread(
            lambda: self.service.audit.record(
                operator=principal.name, role=principal.role, action="logout", client=client_address(request.scope)
            )
        )
        response = RedirectResponse("/console/login", 303)
        response.headers.append(
            "Set-Cookie", f"{SESSION_COOKIE}=; Max-Age=0{self.service.access.cookie_flags(request.scope)}"
        )
        return response

    # --------------------------------------------------------------- pages

    def destinations_view(
        self, limit: int = OVERVIEW_ROWS, offset: int = 0, name_filter: str | None = None, by_name: bool = False
    ) -> dict[str, Any]:
        data = self.service.destinations()
        history = self.service.sampler.history()
        items = data["destinations"]
        totals = {
            "depth": sum(d["depth"] for d in items if d["kind"] != "dead-letter"),
            "in_flight": sum(d["in_flight"] for d in items),
            "dead": sum(d["depth"] for d in items if d["kind"] == "dead-letter"),
            "rate": sum(d["enqueue_rate"] for d in items if d["kind"] != "dead-letter"),
            "consumers": sum(d["consumers"] for d in items),
        }

        def spark(name: str) -> str:
            points = [values.get(name, (0, 0, 0))[0] for _, values in history[-40:]]
            return svg_series(points, 96, 22, "spark", f"depth of {name}")

        listed = [d for d in items if d["kind"] != "dead-letter" and (not name_filter or name_filter in d["name"])]
        if not by_name:  # the overview: the busiest first (dead letters, then depth)
            listed.sort(key=lambda d: (-d["dead_letter_depth"], -d["depth"], d["name"]))
        return {
            "destinations": listed[offset : offset + limit],
            "listed": len(listed),
            "offset": offset,
            "limit": limit,
            "totals": totals,
            "taken_at": data["taken_at"],
            "spark": spark,
            "interval": self.service.admin.stats_interval,
            "name_filter": name_filter or "",
        }

    async def overview(self, request: Request, principal: Principal) -> Response:
        view = await self.thread(self.destinations_view)
        failed = await self.thread(self.service.search, {"status": "failed", "limit": "10"})
        dead = await self.thread(self.service.search, {"status": "dead_lettered", "limit": "10"})
        errors = sorted(failed["documents"] + dead["documents"], key=lambda d: -d["updated_at"])[:10]
        return self.render("overview.html", request, principal, title="Overview", nav="overview", errors=errors, **view)

    async def fragment(self, request: Request, principal: Principal) -> Response:
        view = await self.thread(self.destinations_view)
        return HTMLResponse(
            self.env.get_template("_destinations.html").render(**view), headers={"Cache-Control": "no-store"}
        )

    async def destination(self, request: Request, principal: Principal) -> Response:
        q = request.query_params
        name = q.get("name")
        d = await self.thread(self.service.destination, name)
        d["history"] = await self.thread(self.service.history, d["name"])
        selector, cursor = q.get("selector") or None, q.get("cursor") or None
        limit = parse_limit(q.get("limit"), 50, 500)
        browse_error = None
        try:
            page_data = await self.thread(self.service.browse, d["name"], selector, cursor, limit)
        except InvalidRequestError as exc:
            page_data, browse_error = {"messages": [], "next_cursor": None}, exc.detail

        def page_url(next_cursor: str | None) -> str:
            params = {"name": d["name"], "limit": str(limit)}
            if selector:
                params["selector"] = selector
            if next_cursor:
                params["cursor"] = next_cursor
            return "/console/destination?" + urllib.parse.urlencode(params)

        points = d["history"][-120:]
        chart = (
            svg_series([p["depth"] for p in points], 600, 140, "chart", f"depth of {d['name']}")
            + '<p class="muted">Depth over the last readings; enqueued per second: '
            + html.escape(
                ", ".join(f"{p['enqueue_rate']:.1f}" for p in points[-8:] if p["enqueue_rate"] is not None) or "–"
            )
            + "</p>"
        )
        here = page_url(cursor)
        return self.render(
            "destination.html",
            request,
            principal,
            title=d["name"],
            nav="dlq" if d["kind"] == "dead-letter" else "overview",
            d=d,
            page=page_data,
            selector=selector,
            cursor=cursor,
            limit=limit,
            page_url=page_url,
            here=here,
            chart=chart,
            browse_error=browse_error,
        )

    async def message(self, request: Request, principal: Principal) -> Response:
        q = request.query_params
        m = await self.thread(self.service.message, q.get("destination"), q.get("id") or "")
        await audit_read(
            self.service,
            principal,
            "read-message",
            m["box"],
            client_address(request.scope),
            message_ids=[m["message_id"]],
            detail="console",
        )
        is_dlq = m["box"].startswith(f"queue://{self.service.broker.policy.dead_letter_prefix}")
        return self.render(
            "message.html", request, principal, title=m["message_id"], nav="overview", m=m, is_dlq=is_dlq
        )

    async def all_destinations(self, request: Request, principal: Principal) -> Response:
        q = request.query_params
        page_no = max(0, int(q.get("page") or 0)) if (q.get("page") or "0").isdigit() else 0
        name_filter = (q.get("q") or "").strip()[:200] or None
        view = await self.thread(lambda: self.destinations_view(PAGE_ROWS, page_no * PAGE_ROWS, name_filter, True))
        return self.render(
            "destinations.html",
            request,
            principal,
            title="Destinations",
            nav="overview",
            page_no=page_no,
            full_list=True,
            **view,
        )

    async def dead_letters(self, request: Request, principal: Principal) -> Response:
        data = await self.thread(self.service.destinations)
        dlqs = [d for d in data["destinations"] if d["kind"] == "dead-letter"]
        return self.render("dead_letters.html", request, principal, title="Dead letters", nav="dlq", dlqs=dlqs)

    async def actions(self, request: Request, principal: Principal) -> Response:
        form = await self.read_form(request)
        self.service.access.check_change(principal, "POST", request.headers, self.one(form, "csrf"))
        return_to = self.one(form, "return_to")
        action = self.one(form, "action") or ""
        spec: dict[str, Any] = {"destination": self.one(form, "destination")}
        ids = [i for i in form.get("message_id", []) if i]
        selector = (self.one(form, "selector") or "").strip()
        if ids:
            spec["message_ids"] = ids
        if selector:
            spec["selector"] = selector
        limit = (self.one(form, "limit") or "").strip()
        if limit:
            if not limit.isdigit():
                return self.back(return_to, error="The limit must be a whole number.")
            spec["limit"] = int(limit)
        for key in ("target", "confirm"):
            value = (self.one(form, key) or "").strip()
            if value:
                spec[key] = value
        try:
            result = await self.thread(self.service.act, principal, action, spec, client_address(request.scope))
        except GatewayError as exc:
            return self.back(return_to, error=exc.detail)
        verb = {"replay": "Replayed", "delete": "Deleted", "move": "Moved", "purge": "Purged"}.get(action, action)
        extra = f" ({result.ledger_documents} ledger documents back to accepted)" if result.ledger_documents else ""
        where = f" to {result.destination}" if action == "move" else ""
        return self.back(
            return_to, done=f"{verb} {result.count} message{'s' if result.count != 1 else ''}{where}{extra}."
        )

    async def ledger(self, request: Request, principal: Principal) -> Response:
        params = {k: v for k, v in request.query_params.items() if v}
        error = None
        result: dict[str, Any] = {"documents": [], "next_cursor": None}
        try:
            result = await self.thread(self.service.search, params)
        except InvalidRequestError as exc:
            error = exc.detail
        next_url = ""
        if result.get("next_cursor"):
            next_url = "/console/ledger?" + urllib.parse.urlencode({**params, "cursor": result["next_cursor"]})
        return self.render(
            "ledger.html",
            request,
            principal,
            title="Ledger",
            nav="ledger",
            q=params,
            result=result,
            error=error,
            next_url=next_url,
            partners=sorted(self.service.assembly.partners.partners),
        )

    async def document(self, request: Request, principal: Principal) -> Response:
        doc = await self.thread(self.service.document, request.path_params["message_id"])
        await audit_read(
            self.service, principal, "read-document", doc["message_id"], client_address(request.scope), detail="console"
        )
        request_xml, _ = pretty_xml(doc.get("document"))
        reply_xml, _ = pretty_xml(doc.get("reply"))
        return self.render(
            "document.html",
            request,
            principal,
            title=f"{doc['doc_type']} {doc.get('doc_id') or ''}",
            nav="ledger",
            doc=doc,
            request_xml=request_xml,
            reply_xml=reply_xml,
        )

    async def partners(self, request: Request, principal: Principal) -> Response:
        p = await self.thread(self.service.partners)
        r = await self.thread(self.service.routes)
        return self.render(
            "partners.html",
            request,
            principal,
            title="Partners",
            nav="partners",
            partners=p["partners"],
            routes=r["routes"],
            counted_at=p["counted_at"],
        )

    async def etl(self, request: Request, principal: Principal) -> Response:
        runs = (await self.thread(self.service.etl_runs, 50))["runs"]
        return self.render("etl.html", request, principal, title="ETL runs", nav="etl", runs=runs)

    async def audit(self, request: Request, principal: Principal) -> Response:
        before = request.query_params.get("before")
        entries = await self.thread(
            lambda: self.service.audit.recent(limit=100, before=int(before) if before and before.isdigit() else None)
        )
        return self.render(
            "audit.html",
            request,
            principal,
            title="Audit",
            nav="audit",
            entries=entries,
            next_before=entries[-1].id if len(entries) == 100 else None,
        )

    async def static(self, request: Request) -> Response:
        found = self.statics.get(request.path_params["name"])
        if found is None:
            return Response(status_code=404)
        data, media, _ = found
        return Response(data, media_type=media, headers={"Cache-Control": "public, max-age=86400"})

    def routes(self) -> list[Route]:
        return [
            Route("/console", self.page(self.overview), methods=["GET"]),
            Route("/console/", self.page(self.overview), methods=["GET"]),
            Route("/console/login", self.login_form, methods=["GET"]),
            Route("/console/login", self.login, methods=["POST"]),
            Route("/console/logout", self.page(self.logout), methods=["POST"]),
            Route("/console/fragments/destinations", self.page(self.fragment), methods=["GET"]),
            Route("/console/destination", self.page(self.destination), methods=["GET"]),
            Route("/console/destinations", self.page(self.all_destinations), methods=["GET"]),
            Route("/console/message", self.page(self.message), methods=["GET"]),
            Route("/console/dead-letters", self.page(self.dead_letters), methods=["GET"]),
            Route("/console/actions", self.page(self.actions), methods=["POST"]),
            *delivery_console_routes(
                self.service,
                render=self.render,
                page=self.page,
                read_form=self.read_form,
                one=self.one,
                back=self.back,
                thread=self.thread,
                client=client_address,
            ),
            *partner_console_routes(
                self.service,
                render=self.render,
                page=self.page,
                read_form=self.read_form,
                one=self.one,
                back=self.back,
                thread=self.thread,
                client=client_address,
            ),
            Route("/console/ledger", self.page(self.ledger), methods=["GET"]),
            Route("/console/ledger/{message_id}", self.page(self.document), methods=["GET"]),
            Route("/console/partners", self.page(self.partners), methods=["GET"]),
            Route("/console/etl", self.page(self.etl), methods=["GET"]),
            Route("/console/audit", self.page(self.audit), methods=["GET"]),
            Route("/console/static/{name}", self.static, methods=["GET"]),
        ]


def console_routes(service: AdminService) -> list[Route]:
    """The console's routes."""
    return Console(service).routes()
