"""The read-only web UI (Starlette + uvicorn): overview, teams, users, clusters, findings, inference services, fabric,
one allocation, chargeback (with CSV), and ``/api/...`` returning exactly the data each page renders.

Read-only by construction: every route is GET (HEAD) only, so POST/PUT/DELETE get 405, and the handlers
only SELECT. Access: bound to 127.0.0.1 by default. Behind a reverse proxy that authenticates users, set
``web.user_header`` (as Grafana's auth proxy): requests without the header are refused, and a user who is
not in ``web.admins`` / ``web.admin_groups`` sees only their own allocations. Names are escaped by Jinja2
autoescape and shortened by the ``shorten`` filter on every page; charts are server-side SVG.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from functools import lru_cache
from typing import Any

import jinja2
from markupsafe import Markup, escape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route

from auditor.config import Config
from auditor.errors import GpuAuditError
from auditor.intparse import INT32_MAX, parse_uint
from auditor.report import jobview
from auditor.report.chargeback import BY, to_csv
from auditor.report.render import _filters, plain
from auditor.resources import resource_dir
from auditor.store.engine import Store
from auditor.web import data as webdata
from auditor.web import svg

log = logging.getLogger("gpu_audit.web")
CSP = ("default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; "
       "base-uri 'none'")
PAGES = ("overview", "teams", "users", "clusters", "findings", "services", "fabric", "chargeback")


@dataclass(frozen=True)
class Viewer:
    """Who is looking: ``scope`` None sees everything (admin, or no auth proxy configured)."""

    user: str | None
    scope: str | None
    admin: bool


class Denied(Exception):
    """No authenticated user where the config requires one."""


def viewer(request: Request, cfg: Config) -> Viewer:
    w = cfg.web
    if not w.user_header:
        return Viewer(None, None, True)
    name = (request.headers.get(w.user_header) or "").strip()
    if not name:
        raise Denied(f"no authenticated user: the proxy must set {w.user_header}")
    groups = {g.strip() for g in (request.headers.get(w.groups_header) or "").split(",") if g.strip()} \
        if w.groups_header else set()
    admin = name in w.admins or bool(groups & set(w.admin_groups))
    return Viewer(name, None if admin else name, admin)


@lru_cache(maxsize=2)
def environment(template_dir: str | None = None) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(template_dir or str(resource_dir("templates"))),
                             autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    _filters(env)
    env.filters["words"] = words
    return env


_BREAKS = re.compile(r"[-/\u2010-\u2014]")


def words(value: Any) -> Markup:
    """Prose for a table cell, escaped: a word with a hyphen or slash goes in a nowrap span, so a line
    breaks between words only, never inside "GPU-hours" or "scancel/delete"."""
    return Markup(" ".join(f'<span class="nw">{escape(w)}</span>' if _BREAKS.search(w) else str(escape(w))
                           for w in plain(value).split()))


def to_jsonable(v: Any) -> Any:
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() and v.as_tuple().exponent >= 0 else float(v)
    if isinstance(v, datetime):
        return v.isoformat()
    raise TypeError(f"not JSON serialisable: {type(v).__name__}")


def json_response(data: Any, status: int = 200) -> Response:
    body = json.dumps(data, default=to_jsonable, ensure_ascii=False, separators=(",", ":"))
    return Response(body, status_code=status, media_type="application/json")


class SecurityHeaders:
    """CSP, no sniffing, no framing, no referrer: on every response (pure ASGI middleware)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        async def send_with(message: dict) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] += [(b"content-security-policy", CSP.encode()),
                                       (b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY"),
                                       (b"referrer-policy", b"no-referrer"), (b"cache-control", b"no-store")]
            await send(message)

        await self.app(scope, receive, send_with)


MAX_PAGE = 1_000_000
MAX_Q = 256  # characters of the findings search (a name or id fragment; SHOWN_MAX is what a page shows)
MAX_PARAM = 1024  # characters of any other query parameter value


class BadRequest(Exception):
    """A parameter no page can answer (HTTP 400, one line)."""


def _page_no(request: Request) -> int:
    p = request.query_params.get("page") or "1"
    try:
        return max(1, parse_uint(p, hi=MAX_PAGE, what="page"))
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


def check_params(request: Request) -> None:
    """Refuse oversized or malformed parameters before any query runs: a 60 kB search, a page or an
    allocation id that is no number the store can hold (10^30 overflowed the driver: HTTP 500 and a
    traceback). ``?run=`` is read by :func:`auditor.web.data.pick_run` (the same strict reader)."""
    for key, value in request.query_params.multi_items():
        limit = MAX_Q if key == "q" else MAX_PARAM
        if len(value) > limit:
            raise BadRequest(f"parameter {key[:20]!r}: {len(value):,} characters (at most {limit:,})")
    if "page" in request.query_params:
        _page_no(request)
    aid = request.path_params.get("aid")
    if aid is not None and aid > INT32_MAX:
        raise GpuAuditError(f"no allocation {str(aid)[:24]}")


def create_app(store: Store, cfg: Config) -> Any:
    """The ASGI app (``gpu-audit web`` serves it; tests drive it with Starlette's TestClient or Chromium)."""

    who_cache: dict[int, dict[str, Any]] = {}

    def data_for(page: str, request: Request, v: Viewer, kind: str) -> dict[str, Any]:
        q = request.query_params
        if page == "allocation":
            aid = request.path_params["aid"]
            return jobview.job_view(store, cfg, int(aid), user=v.scope, run_id=q.get("run"))
        choice = webdata.pick_run(store, cfg, q.get("run"))
        run_id = choice["id"]
        if page == "overview":
            data = webdata.overview(store, cfg, run_id, v.scope, mine=q.get("user"), cache=who_cache)
        elif page in ("teams", "users", "clusters"):
            data = webdata.groups(store, cfg, run_id, page, v.scope, page=_page_no(request))
        elif page == "findings":
            data = webdata.findings(store, cfg, run_id, v.scope, dict(q))
        elif page == "services":
            data = webdata.services(store, cfg, run_id, v.scope, page=_page_no(request))
        elif page == "fabric":
            data = webdata.fabric(store, cfg, run_id, v.scope)
        elif page == "chargeback":
            by = q.get("by") or "team"
            if by not in BY:
                raise GpuAuditError(f"by {by[:20]!r}: expected one of {', '.join(BY)}")
            data = webdata.chargeback_rows(store, cfg, run_id, v.scope, by,
                                           page=None if kind == "csv" else _page_no(request))
        else:
            raise GpuAuditError("no such page")
        webdata.say_run(data, choice, cfg)
        return data

    def handle(page: str, kind: str) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:
            try:
                v = viewer(request, cfg)
            except Denied as exc:
                return PlainTextResponse(str(exc), status_code=401)
            try:
                check_params(request)
                data = data_for(page, request, v, kind)
            except BadRequest as exc:
                return error_response(request, v, kind, str(exc), 400)
            except GpuAuditError as exc:
                return error_response(request, v, kind, str(exc), 404)
            if kind == "api":
                return json_response(data)
            if kind == "csv":
                name = f"chargeback-run{data['run']['id']}-by-{data['by']}.csv"
                return Response(to_csv(data["rows"]), media_type="text/csv; charset=utf-8",
                                headers={"content-disposition": f'attachment; filename="{name}"'})
            return HTMLResponse(render_page(page, data, v, request))

        endpoint.__name__ = f"{kind}_{page}"
        return endpoint

    def css(request: Request) -> Response:
        return Response(resource_dir("templates").joinpath("web", "web.css").read_text(encoding="utf-8"),
                        media_type="text/css")

    routes = [Route("/static/web.css", css, methods=["GET"])]
    for page in PAGES:
        path = "/" if page == "overview" else f"/{page}"
        routes += [Route(path, handle(page, "html"), methods=["GET"]),
                   Route(f"/api/{page}", handle(page, "api"), methods=["GET"])]
    routes += [Route("/allocation/{aid:int}", handle("allocation", "html"), methods=["GET"]),
               Route("/api/allocation/{aid:int}", handle("allocation", "api"), methods=["GET"]),
               Route("/chargeback.csv", handle("chargeback", "csv"), methods=["GET"])]
    app = Starlette(routes=routes)
    app.add_middleware(SecurityHeaders)
    return app


def error_response(request: Request, v: Viewer, kind: str, message: str, status: int) -> Response:
    """The one-line answer to a request no page can serve, and its one log line."""
    log.info("%s %s: %s (HTTP %d)", request.method, request.url.path[:200], message, status)
    if kind == "api":
        return json_response({"error": message}, status)
    if kind == "csv":
        return PlainTextResponse(message, status_code=status)
    return HTMLResponse(environment().get_template("web/error.html.j2").render(
        message=message, viewer=v, page="error", q={}, charts={}, path=request.url.path), status_code=status)


def render_page(page: str, data: dict[str, Any], v: Viewer, request: Request) -> str:
    """The page's template with its data, plus the server-side charts it draws."""
    charts: dict[str, Any] = {}
    if page == "overview" and data["trend"]:
        pts = data["trend"]
        charts["trend"] = svg.trend_bars([p["idle_gpu_hours"] for p in pts], [(p["until"] or "")[:10] for p in pts],
                                         f"Idle GPU-hours per window ({len(pts)} of them), this one highlighted",
                                         current=[p["current"] for p in pts].index(True) if any(
                                             p["current"] for p in pts) else -1)
    if page == "allocation":
        charts["gpus"] = [svg.gpu_chart(g["timeline"]["verdicts"], g["timeline"]["sm"], g["timeline"]["util"],
                                        data["axis"], f"GPU {g['gpu_index']} on {g['node']}: SM activity (bars), "
                                        "GPU-Util (line) and verdict per time bin") for g in data["gpus"]]
    q = dict(request.query_params)
    api = "/api" + (request.url.path if request.url.path != "/" else "/overview")
    if request.url.query:
        api += f"?{request.url.query}"
    return environment().get_template(f"web/{page}.html.j2").render(
        d=data, viewer=v, page=page, charts=charts, q=q, path=request.url.path, api=api)


def serve(store: Store, cfg: Config, listen: str, addr: tuple[str, int] | None = None) -> None:
    """Run the UI in the foreground until interrupted (``addr``: ``listen`` as :func:`listen_address` read it)."""
    import uvicorn

    host, port = addr or listen_address(listen, cfg)
    log.info("web UI on http://%s:%d (read-only)", host, port)
    uvicorn.run(create_app(store, cfg), host=host, port=port, log_level="warning", access_log=False)


def start_in_thread(store: Store, cfg: Config, listen: str) -> Any:
    """Start the UI in a daemon thread (``gpu-audit serve --web``); returns the uvicorn server to stop."""
    import uvicorn

    host, port = listen_address(listen, cfg)
    server = uvicorn.Server(uvicorn.Config(create_app(store, cfg), host=host, port=port, log_level="warning",
                                           access_log=False))
    threading.Thread(target=server.run, name="gpu-audit-web", daemon=True).start()
    return server


def listen_address(listen: str, cfg: Config) -> tuple[str, int]:
    """HOST:PORT to serve on, or a one-line error (config.base.parse_listen rules; 'off' is refused here).

    Every user's jobs and costs are on these pages: beyond loopback they are served only behind a proxy
    that authenticates (``web.user_header``) or where ``web.allow_unauthenticated`` says so."""
    from auditor.config.base import parse_listen

    try:
        addr = parse_listen(listen)
    except ValueError as exc:
        raise GpuAuditError(f"web listen address: {exc}") from None
    if addr is None:
        raise GpuAuditError("web listen address: 'off' is not an address to serve on")
    if not cfg.web.user_header and not loopback(addr[0]):
        if not cfg.web.allow_unauthenticated:
            raise GpuAuditError(f"web listen address {listen.strip()}: not loopback, and web.user_header is not set, "
                                "so everyone who reaches the port would see every user's jobs and costs; put it "
                                "behind an authenticating proxy (docs/web.md) or set web.allow_unauthenticated = true")
        log.warning("web UI on %s without authentication (web.allow_unauthenticated): everyone who reaches the "
                    "port sees every user's jobs and costs", listen.strip())
    return addr


def loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1) or the name localhost."""
    import ipaddress

    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any interface
