"""Secrets (issue 15 part 3): eleven distinct secrets planted in every place a site puts one, several with
the trailing newline an `echo > file` leaves, grepped for in every output: stdout and stderr (logs included)
of config check (--json, --debug, --probe), collect, run with every step (--debug tracebacks, --json), the
report and outbox files, every table of the store, and /metrics."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from helpers_crash import REPO
from sqlalchemy import select

from auditor.config import SecretRef
from auditor.store import schema


def _plant(tmp_path: Path, pg_url: str) -> tuple[Path, dict[str, str], list[str]]:
    tok = uuid.uuid4().hex[:8]
    s = {name: f"{name}-{tok}" for name in ("StorePw", "SslPw", "SmtpPw", "UrlPw", "PromBearer", "PromBasic",
                                           "PromBearer2", "PromBasic2", "K8sToken", "SlurmJwt", "SlurmJwt2")}
    files = {"PromBearer": "prom-bearer", "K8sToken": "k8s-token", "SlurmJwt2": "jwt2", "PromBasic2": "basic2"}
    for name, fname in files.items():
        f = tmp_path / fname
        f.write_text(s[name] + "\n")  # the newline `echo > file` leaves
        f.chmod(0o600)
    base, _, query = pg_url.partition("?")
    store_url = base.replace("postgresql+psycopg://postgres@", f"postgresql+psycopg://postgres:{s['StorePw']}@") \
        + f"?sslpassword={s['SslPw']}" + (f"&{query}" if query else "")
    env = {"SEC_STORE": store_url + "\n", "SEC_SMTP": s["SmtpPw"] + "\n", "SEC_PROMPW": s["PromBasic"],
           "SEC_PROM2": s["PromBearer2"] + "\r\n", "SEC_JWT": s["SlurmJwt"] + "\n"}
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[store]\nurl_env = "SEC_STORE"\n'
        '[email]\nusername = "mailer"\npassword = { env = "SEC_SMTP" }\nsmtp_host = "127.0.0.1"\nsmtp_port = 9\n'
        'security = "none"\nadmin_to = ["ops@example.com"]\n'
        '[[clusters]]\nname = "c"\n'
        '[[clusters.allocations]]\nkind = "kubernetes"\nhost = "http://127.0.0.1:9"\n'
        f'token = {{ file = "{tmp_path / "k8s-token"}" }}\ntimeout_s = 2\n'
        '[[clusters.allocations]]\nkind = "slurm"\nbackend = "rest"\nrest_url = "http://127.0.0.1:9"\n'
        'rest_token = { env = "SEC_JWT" }\ntimeout_s = 2\n'
        f'[[clusters.telemetry]]\nkind = "prometheus"\nurl = "http://scraper:{s["UrlPw"]}@127.0.0.1:9"\n'
        f'bearer_token = {{ file = "{tmp_path / "prom-bearer"}" }}\nusername = "u"\n'
        'password = { env = "SEC_PROMPW" }\ntimeout_s = 2\nretries = 0\n'
        '[[clusters.telemetry]]\nkind = "prometheus"\nurl = "http://127.0.0.1:9"\n'
        'bearer_token = { env = "SEC_PROM2" }\nusername = "v"\n'
        f'password = {{ file = "{tmp_path / "basic2"}" }}\ntimeout_s = 2\nretries = 0\n'
        '[[clusters]]\nname = "d"\n'
        '[[clusters.allocations]]\nkind = "slurm"\nbackend = "rest"\nrest_url = "http://127.0.0.1:9"\n'
        f'rest_token = {{ file = "{tmp_path / "jwt2"}" }}\ntimeout_s = 2\n')
    return cfg, env, list(s.values())


COMMANDS = [["--json", "config", "check"], ["--debug", "config", "check"], ["--json", "config", "check", "--probe"],
            ["--debug", "config", "check", "--probe"], ["--debug", "collect"], ["--debug", "db", "current"],
            ["--debug", "run", "--steps", "collect,audit,report,notify", "--dry-run"],
            ["--debug", "run", "--steps", "collect,audit,report,notify"],
            ["--json", "run", "--steps", "collect,audit,report,notify,chargeback"],
            ["--debug", "audit", "--since", "not-a-time"]]


@pytest.mark.service  # the store is PostgreSQL
@pytest.mark.slow  # ten CLI runs as processes: what leaves a process is the point
def test_eleven_secrets_never_leave(tmp_path: Path, pg_schema_url: str) -> None:
    for mod in ("connectors.kubernetes", "connectors.slurm", "connectors.prometheus"):
        pytest.importorskip(mod)
    cfg, env, planted = _plant(tmp_path, pg_schema_url)
    assert len(set(planted)) >= 10
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **env}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "auditor", "-c", str(cfg), *args], capture_output=True,
                              text=True, cwd=tmp_path, timeout=300, env=full_env)

    assert cli("db", "upgrade").returncode == 0
    seen = ""
    for args in COMMANDS:
        extra = ["--out", str(tmp_path / "out")] if "run" in args else []
        res = cli(*args, *extra)
        assert "Traceback" not in res.stderr or "--debug" in args
        seen += f"\n$ {args}\n{res.stdout}\n{res.stderr}"
    assert "Traceback" in seen  # --debug printed tracebacks (scrubbed), so they were searched too
    assert "FAIL" in seen and "cannot connect" in seen  # the sources were down: their errors were searched
    for f in (tmp_path / "out").rglob("*"):
        if f.is_file():
            seen += f.read_bytes().decode("utf-8", "replace")
    seen += _metrics(cfg, full_env)
    seen += _store_dump(pg_schema_url)
    leaked = [s for s in planted if s in seen]
    assert not leaked, f"leaked: {leaked}"


def _metrics(cfg: Path, env: dict[str, str]) -> str:
    """/metrics of a daemon that just ran a failing collection, rendered in a child with the secrets' env."""
    code = ("import sys; from auditor import config; from auditor.store.engine import Store; "
            "from auditor.daemon.health import Metrics; from auditor.daemon.pipeline import run_steps; "
            "c = config.load(sys.argv[1]); s = Store.open(c.store.resolved_url()); m = Metrics(s, c); "
            "m.observe(run_steps(s, c, ['collect', 'audit'], base_dir=__import__('pathlib').Path('.'))); "
            "sys.stdout.write(m.render().decode())")
    res = subprocess.run([sys.executable, "-c", code, str(cfg)], capture_output=True, text=True, timeout=300,
                         env=env, cwd=REPO)
    assert res.returncode == 0 and "gpu_audit" in res.stdout, res.stderr[-2000:]
    return res.stdout + res.stderr


def _store_dump(url: str) -> str:
    from auditor.store.engine import Store

    store = Store.open(url)
    out = []
    with store.engine.connect() as c:
        for table in schema.metadata.sorted_tables:
            out += [repr(tuple(r)) for r in c.execute(select(table))]
    store.engine.dispose()
    assert out, "the run stored nothing: the dump would prove nothing"
    return "\n".join(out)


def test_secrets_from_files_and_env_are_stripped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "t"
    f.write_text("  tok-file-1 \t\nsecond line\n")
    f.chmod(0o600)
    monkeypatch.setenv("SEC_T", "tok-env-1\r\n")
    assert SecretRef(file=f).resolve("x") == "tok-file-1"
    assert SecretRef(env="SEC_T").resolve("x") == "tok-env-1"


class _Echo(http.server.BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        _Echo.seen.append(self.headers.get("Authorization", ""))
        body = b'{"status":"success","data":{"version":"test"}}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_a: object) -> None:
        pass


def test_a_token_with_a_trailing_newline_is_sent_stripped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: httpx refused the header and its error quoted the token; now the header is the token."""
    from connectors.base import Context
    from connectors.prometheus import PrometheusTelemetry

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("SEC_NL", "nl-token-42\n")
    try:
        conn = PrometheusTelemetry(Context("c"), PrometheusTelemetry.Options(
            url=f"http://127.0.0.1:{server.server_port}", bearer_token={"env": "SEC_NL"}, retries=0))
        assert b"test" in conn.request("/api/v1/status/buildinfo", {}, "GET")
    finally:
        server.shutdown()
    assert _Echo.seen == ["Bearer nl-token-42"]


@pytest.mark.parametrize("url,hidden", [
    ("postgresql+psycopg://u:Pw1@db:5432/x", ["Pw1"]),
    ("postgresql://db/x?user=u&password=Pw2&sslmode=require", ["Pw2"]),
    ("postgresql://u@db/x?sslpassword=Pw3&options=-csearch_path%3Dy", ["Pw3"]),
    ("postgresql+psycopg://u:P%40w4@db/x?password=Pw5&sslpassword=Pw6", ["P%40w4", "Pw5", "Pw6"]),
    ("http://u:Pw7@host:9090/path?api_key=Pw8&token=Pw9", ["Pw7", "Pw8", "Pw9"]),
])
def test_store_urls_are_redacted_in_every_form(url: str, hidden: list[str]) -> None:
    from auditor.logs import redact_url

    shown = redact_url(url)
    assert not [h for h in hidden if h in shown] and "***" in shown
    assert shown.split("/")[2].split("@")[-1] == url.split("/")[2].split("@")[-1]  # host and port stay


def test_an_invalid_header_value_is_reworded_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token with a newline in the middle survives stripping; httpx refuses the header and quotes it in
    its error. The source error says which setting to check, never the value."""
    from auditor.errors import SourceError
    from connectors.base import Context
    from connectors.prometheus import PrometheusTelemetry

    monkeypatch.setenv("SEC_MID", "mid-secret-1\nmid-secret-2")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        conn = PrometheusTelemetry(Context("c"), PrometheusTelemetry.Options(
            url=f"http://127.0.0.1:{server.server_port}", bearer_token={"env": "SEC_MID"}, retries=0))
        with pytest.raises(SourceError) as info:
            conn.request("/api/v1/status/buildinfo", {}, "GET")
    finally:
        server.shutdown()
    assert "header value is invalid" in str(info.value) and "mid-secret" not in str(info.value)
