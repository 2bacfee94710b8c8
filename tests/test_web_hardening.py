"""The web UI refuses to serve everyone's jobs and costs on an open port without an authenticating proxy
(unless ``web.allow_unauthenticated``), and answers hostile parameters (ids of 10^30, Unicode digits, a
60 kB search) with 400/404 and one log line, never HTTP 500 and a traceback. SQLite and PostgreSQL."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from auditor.config import Config, WebConfig
from auditor.errors import GpuAuditError
from auditor.web.app import create_app, listen_address

sys.path.insert(0, str(Path(__file__).parent))
from test_web import audited  # noqa: E402, F401 (fixture)

BIG = str(10**30)


@pytest.mark.parametrize("listen", ["0.0.0.0:8080", "[::]:8080", ":8080", "10.1.2.3:8080", "gpu-audit.example:80"])
def test_open_port_without_auth_proxy_is_refused(listen: str, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(GpuAuditError, match="web.allow_unauthenticated"):
        listen_address(listen, Config())
    # behind a proxy that names the user, or explicitly allowed (then said loudly), it serves
    assert listen_address(listen, Config(web=WebConfig(user_header="X-WEBAUTH-USER")))[1] in (8080, 80)
    with caplog.at_level(logging.WARNING, logger="gpu_audit"):
        listen_address(listen, Config(web=WebConfig(allow_unauthenticated=True)))
    assert any("without authentication" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("listen", ["127.0.0.1:8080", "[::1]:8080", "localhost:8080", "127.0.0.2:9000"])
def test_loopback_needs_no_proxy(listen: str) -> None:
    assert listen_address(listen, Config())[1] in (8080, 9000)


def test_cli_web_on_all_interfaces_is_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from auditor.cli import main

    res = CliRunner().invoke(main, ["web", "--listen", "0.0.0.0:8080"])
    assert res.exit_code == 1 and len(res.output.strip().splitlines()) == 1, res.output
    assert res.output.startswith("gpu-audit: error: ") and "web.allow_unauthenticated" in res.output


@pytest.mark.parametrize(("path", "code"), [
    (f"/allocation/{BIG}", 404), (f"/api/allocation/{BIG}", 404),
    (f"/?run={BIG}", 404), (f"/api/findings?run={BIG}", 404), ("/api/teams?run=\uff11", 404),
    (f"/teams?page={BIG}", 400), ("/api/users?page=\u00b2", 400), ("/findings?page=\u00b2", 400),
    ("/api/chargeback?page=-1", 400),
    ("/findings?q=" + "a" * 60_000, 400), ("/api/findings?q=" + "%" * 60_000, 400),
    ("/api/findings?user=" + "u" * 60_000, 400),
])
def test_hostile_parameters_are_400_or_404_with_one_log_line(audited, path: str, code: int,  # noqa: ANN001, F811
                                                               caplog: pytest.LogCaptureFixture) -> None:
    c = TestClient(create_app(audited, Config()), raise_server_exceptions=False)
    with caplog.at_level(logging.INFO):
        r = c.get(path)
    assert r.status_code == code, (path, r.status_code, r.text[:200])
    assert len(r.text) < 2000 and "Traceback" not in r.text
    ours = [rec for rec in caplog.records if rec.name.startswith("gpu_audit")]
    assert len(ours) == 1 and not ours[0].exc_info and "\n" not in ours[0].getMessage(), ours
    assert not [rec for rec in caplog.records if rec.exc_info]  # no traceback anywhere in the log
