"""The daemon's health: ``/healthz`` for liveness probes and alerts, and the HTTP endpoint that also serves
``/metrics`` (:mod:`auditor.daemon.metrics`) through prometheus_client's WSGI exposition app.

The server is wsgiref's, threaded as prometheus_client's own ``start_wsgi_server`` is; no HTTP is parsed
here.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from sqlalchemy import select

from auditor.collect import source_key
from auditor.config import Config
from auditor.intparse import uint_or_none
from auditor.store import schema
from auditor.store.engine import Store
from auditor.timeutil import utcnow

if TYPE_CHECKING:
    from auditor.daemon.metrics import Metrics

log = logging.getLogger("gpu_audit.health")


def expected_sources(cfg: Config) -> list[tuple[str, str]]:
    """(cluster, source key) of every configured source: what /healthz expects to be fresh."""
    return [(c.name, source_key(role, i, src)) for c in cfg.clusters
            for role in ("allocations", "telemetry") for i, src in enumerate(getattr(c, role))]


def watermarks(store: Store) -> dict[tuple[str, str], tuple[int, int | None]]:
    """(cluster, source) -> (watermark_ts, updated_ts): updated_ts is the last successful collect."""
    t = schema.watermarks
    with store.engine.connect() as conn:
        return {(r.cluster, r.source): (r.watermark_ts, r.updated_ts)
                for r in conn.execute(select(t.c.cluster, t.c.source, t.c.watermark_ts, t.c.updated_ts))}


def health(store: Store, cfg: Config, max_age_s: float, now: datetime | None = None,
           scheduler_running: bool = True) -> tuple[bool, dict[str, Any]]:
    """Healthy when the scheduler runs and every configured source collected within ``max_age_s``."""
    now_ts = int((now or utcnow()).timestamp())
    marks = watermarks(store)
    stale: list[dict[str, Any]] = []
    sources: list[dict[str, Any]] = []
    for cluster, source in expected_sources(cfg):
        _wm, updated = marks.get((cluster, source), (None, None))
        age = None if updated is None else now_ts - updated
        ok = age is not None and age <= max_age_s
        item = {"cluster": cluster, "source": source, "last_success_ts": updated, "age_s": age, "ok": ok}
        sources.append(item)
        if not ok:
            stale.append(item)
    healthy = scheduler_running and not stale
    return healthy, {"status": "ok" if healthy else "unhealthy", "scheduler_running": scheduler_running,
                     "max_age_s": max_age_s, "stale": [f"{s['cluster']} {s['source']}" for s in stale],
                     "sources": sources}


class _QuietHandler(WSGIRequestHandler):
    """Access lines go to the debug log, not stderr."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server API)
        log.debug("http: " + format, *args)


def _reply(start_response: Callable, status: str, ctype: str, body: bytes) -> list[bytes]:
    start_response(status, [("Content-Type", ctype), ("Content-Length", str(len(body)))])
    return [body]


def health_app(metrics: Metrics, check: Callable[[], tuple[bool, dict]]) -> Callable:
    """The WSGI app: ``/metrics`` is prometheus_client's exposition app over the metrics' registry,
    ``/healthz`` (or ``/health``) the JSON of ``check`` with 200 or 503."""
    metrics_app = make_wsgi_app(metrics.registry)

    def app(environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics":
            return metrics_app(environ, start_response)
        if path in ("/healthz", "/health"):
            try:
                ok, detail = check()
            except Exception as exc:
                ok, detail = False, {"status": "unhealthy", "error": str(exc).splitlines()[0][:300]}
            return _reply(start_response, "200 OK" if ok else "503 Service Unavailable", "application/json",
                          json.dumps(detail).encode())
        return _reply(start_response, "404 Not Found", "text/plain", b"not found: try /healthz or /metrics\n")

    return app


class HealthServer:
    """``/healthz`` and ``/metrics`` on a small threaded WSGI server in a daemon thread."""

    def __init__(self, host: str, port: int, metrics: Metrics, check: Callable[[], tuple[bool, dict]]) -> None:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0] if ":" in host else socket.AF_INET

        class Server(ThreadingWSGIServer):
            address_family = family

        self.httpd = make_server(host, port, health_app(metrics, check), server_class=Server,
                                 handler_class=_QuietHandler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="health-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> HealthServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def parse_listen(text: str) -> tuple[str, int] | None:
    """``127.0.0.1:9464`` / ``:9464`` / ``[::1]:9464``; ``off`` or empty disables the server."""
    text = text.strip()
    if text.lower() in ("", "off", "none"):
        return None
    host, sep, port = text.rpartition(":")
    number = uint_or_none(port, hi=65535)
    if not sep or number is None:
        raise ValueError(f"--listen {text!r}: want HOST:PORT, e.g. 127.0.0.1:9464, or 'off'")
    return host.strip("[]") or "0.0.0.0", number  # noqa: S104 (":9464" asks for all interfaces)
