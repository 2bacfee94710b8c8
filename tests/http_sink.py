"""A local HTTP sink on loopback that records every request (path, headers, JSON or raw body): the far end
of Slack/Teams/Mattermost/generic webhooks in tests, reached over real HTTP by apprise."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def _self_signed(tls_dir: Path) -> ssl.SSLContext:
    """A server context with a throw-away self-signed certificate (clients connect with verify=no)."""
    cert, key = tls_dir / "sink.crt", tls_dir / "sink.key"
    if not cert.exists():
        subprocess.run([shutil.which("openssl") or "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",  # noqa: S603
                        "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"],
                       check=True, capture_output=True, timeout=60)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    return ctx


class Sink:
    """``tls_dir``: serve HTTPS. ``proxy_tls_dir``: also act as an HTTPS proxy that answers CONNECT itself
    (TLS with a self-signed certificate), so services whose host apprise fixes (hooks.slack.com,
    discord.com) reach this sink over real HTTPS with ``HTTPS_PROXY`` set; each request records its Host."""

    def __init__(self, tls_dir: Path | None = None, proxy_tls_dir: Path | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.fail_paths: set[str] = set()
        sink = self
        mitm = _self_signed(proxy_tls_dir) if proxy_tls_dir is not None else None

        class Handler(BaseHTTPRequestHandler):
            def do_CONNECT(self) -> None:  # noqa: N802 (http.server API)
                if mitm is None:
                    self.send_error(405)
                    return
                self.send_response(200, "Connection established")
                self.end_headers()
                self.connection = mitm.wrap_socket(self.connection, server_side=True)
                self.rfile = self.connection.makefile("rb")  # the request loop goes on inside the tunnel
                self.wfile = self.connection.makefile("wb")
                self.close_connection = False

            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode(errors="replace")
                sink.requests.append({"path": self.path, "content_type": self.headers.get("Content-Type"),
                                      "body": body, "host": self.headers.get("Host")})
                status = 500 if any(self.path.startswith(p) for p in sink.fail_paths) else 200
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                """Quiet."""

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if tls_dir is not None:  # HTTPS with a throw-away self-signed certificate (Teams workflows are https only)
            self.httpd.socket = _self_signed(tls_dir).wrap_socket(self.httpd.socket, server_side=True)
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def __enter__(self) -> Sink:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
