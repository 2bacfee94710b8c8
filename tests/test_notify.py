"""Email through a real SMTP server on loopback (aiosmtpd): what arrives (recipients, both parts, inline
images), throttling in the store, STARTTLS/SSL with login, dry-run .eml files, and header injection."""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
from datetime import timedelta
from email import policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from conftest import need
from helpers import free_port

from auditor.audit.run import run_audit
from auditor.config import Config, EmailConfig, SecretRef, Team
from auditor.errors import GpuAuditError
from auditor.records import AllocatedGpu, Allocation
from auditor.report import charts, mailparts, notify

sys.path.insert(0, str(Path(__file__).parent))
from test_report import EVIL_NAMES, EVIL_USER, T0, WEEK, audited, buckets, make_cfg  # noqa: E402

try:
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult, LoginPassword
except ImportError:  # pragma: no cover - aiosmtpd is a test dependency
    Controller = None

PASSWORD = "s3cr3t-Pa55word"


class Inbox:
    """aiosmtpd handler keeping every envelope it accepted."""

    def __init__(self) -> None:
        self.envelopes: list[dict[str, Any]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        self.envelopes.append({"from": envelope.mail_from, "rcpt": list(envelope.rcpt_tos),
                               "msg": email.message_from_bytes(envelope.content, policy=policy.default)})
        return "250 OK"


@pytest.fixture
def smtp_server():
    need(Controller is not None, "aiosmtpd is not installed")
    started = []

    def start(**kwargs: Any) -> tuple[Inbox, int]:
        inbox, port = Inbox(), free_port()
        c = Controller(inbox, hostname="127.0.0.1", port=port, **kwargs)
        c.start()
        started.append(c)
        return inbox, port

    yield start
    for c in started:
        c.stop()


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    need(shutil.which("openssl") is not None, "openssl is not installed")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    cmd = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
           "-days", "1", "-subj", "/CN=127.0.0.1"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)  # noqa: S603
    return key, cert


def cfg_for(port: int, **email_kw: Any) -> Config:
    base = make_cfg()
    return base.model_copy(update={"email": EmailConfig(**{
        **base.email.model_dump(exclude={"password"}), "smtp_host": "127.0.0.1", "smtp_port": port,
        "security": "none", "cc": ["audit-archive@example.org"], "reply_to": "gpu-help@example.org",
        **email_kw})})


def parts(msg: EmailMessage) -> dict[str, Any]:
    """text, html and inline images (by Content-ID) of a received message."""
    out: dict[str, Any] = {"images": {}}
    for p in msg.walk():
        ct = p.get_content_type()
        if ct == "text/plain":
            out["text"] = p.get_content()
        elif ct == "text/html":
            out["html"] = p.get_content()
        elif ct == "image/png":
            out["images"][p["Content-ID"].strip("<>")] = p.get_payload(decode=True)
    return out


@pytest.mark.service
def test_send_through_real_smtp(tmp_path: Path, smtp_server: Any) -> None:
    inbox, port = smtp_server()
    cfg = cfg_for(port)
    store, run_id = audited(tmp_path, cfg)
    res = notify.notify(store, cfg, run_id)
    got = {(e["rcpt"][0], e["msg"]["Subject"]) for e in inbox.envelopes}
    assert len(inbox.envelopes) == len(res["sent"]) == 5
    to = sorted(e["rcpt"][0] for e in inbox.envelopes)
    assert to == sorted(["ops@example.org", "ml-leads@example.org", "vision@example.org",
                         "alice@example.org", "bob@example.org"]), got
    assert any(s["kind"] == "user_nudge" and "evil" in s["to"] for s in res["skipped"])
    for e in inbox.envelopes:
        m = e["msg"]
        assert e["from"] == "gpu-audit@example.org"
        assert e["rcpt"][1:] == ["audit-archive@example.org"]
        assert "x@y" not in " ".join(e["rcpt"]) and m["Bcc"] is None
        assert m.get_content_type() == "multipart/alternative"
        assert str(m["Reply-To"]) == "gpu-help@example.org" and m["Message-ID"]
        p = parts(m)
        assert p["text"] and p["html"]
        assert "<script>" not in p["html"] and "<img src=x" not in p["html"]
        if EVIL_NAMES[0] in p["text"]:
            assert "&lt;script&gt;alert(1)&lt;/script&gt;" in p["html"]
        for cid, png in p["images"].items():
            assert f'src="cid:{cid}"' in p["html"]
            assert charts.png_size(png)[0] > 0
        assert p["html"].count('src="cid:') == len(p["images"]) and p["html"].count("alt=\"Sparkline") >= 1
    admin = next(e["msg"] for e in inbox.envelopes if e["rcpt"][0] == "ops@example.org")
    assert "idle GPU-hours" in admin["Subject"] and len(parts(admin)["images"]) >= 3
    ml = parts(next(e["msg"] for e in inbox.envelopes if e["rcpt"][0] == "ml-leads@example.org"))
    assert EVIL_NAMES[0] in ml["text"] and "evil Bcc: x@y" in ml["text"]
    assert "Release the GPUs" in ml["text"] and "MIG" in ml["html"]
    alice = parts(next(e["msg"] for e in inbox.envelopes if e["rcpt"][0] == "alice@example.org"))
    assert "8.0 idle GPU-hours" in alice["html"].replace("</strong>", "").replace("<strong>", "")
    assert notify.sent_count(store, kind="admin_report", dry_run=False) == 1


@pytest.mark.service
def test_throttling_in_the_store(tmp_path: Path, smtp_server: Any) -> None:
    inbox, port = smtp_server()
    cfg = cfg_for(port)
    store, run_id = audited(tmp_path, cfg)
    assert len(notify.notify(store, cfg, run_id)["sent"]) == 5
    again = notify.notify(store, cfg, run_id)
    assert again["sent"] == [] and len(inbox.envelopes) == 5
    reasons = {s["to"]: s["reason"] for s in again["skipped"]}
    assert "already sent" in reasons["ops@example.org"] and "nudged 0.0 days ago" in reasons["alice@example.org"]
    # min days 0: still never twice about the same allocation
    cfg0 = cfg_for(port, nudge_min_days=0)
    res = notify.notify(store, cfg0, run_id, admin=False)
    assert res["sent"] == [] and all("every allocation" in s["reason"] for s in res["skipped"] if s["to"]
                                     and "evil" not in s["to"])
    # a new idle allocation of alice's: only that one is in the next nudge
    later = T0 + WEEK + WEEK / 2
    store.ingest([Allocation("c1", "slurm", "201", name="again", user="alice", account="acct-ml", start=later,
                             end=later + timedelta(hours=3), gpus=[AllocatedGpu("n1", 0)]),
                  *buckets("n1", 0, later, 3, 0.0, 0.0)])
    run2 = run_audit(store, cfg0, T0 + WEEK, T0 + 2 * WEEK).run_id
    res = notify.notify(store, cfg0, run2, admin=False, teams=False)
    assert [s["to"] for s in res["sent"]] == ["alice@example.org"] and len(res["sent"][0]["allocations"]) == 1
    assert inbox.envelopes[-1]["rcpt"][0] == "alice@example.org"


@pytest.mark.service
def test_starttls_with_login(tmp_path: Path, smtp_server: Any, tls_files: tuple[Path, Path],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    import ssl

    key, cert = tls_files
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    logins: list[tuple[bytes, bytes]] = []

    def authenticator(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> AuthResult:
        ok = isinstance(data, LoginPassword) and data.login == b"gpu" and data.password == PASSWORD.encode()
        logins.append((data.login, data.password))
        return AuthResult(success=ok)

    inbox, port = smtp_server(tls_context=ctx, require_starttls=True, authenticator=authenticator,
                              auth_require_tls=True)
    monkeypatch.setenv("GPU_AUDIT_TEST_SMTP_PW", PASSWORD)
    cfg = cfg_for(port, security="starttls", verify_tls=False, username="gpu",
                  password=SecretRef(env="GPU_AUDIT_TEST_SMTP_PW"))
    store, run_id = audited(tmp_path, cfg, weeks=1)
    res = notify.notify(store, cfg, run_id, teams=False, users=False)
    assert len(res["sent"]) == 1 and len(inbox.envelopes) == 1 and logins == [(b"gpu", PASSWORD.encode())]
    monkeypatch.delenv("GPU_AUDIT_TEST_SMTP_PW")
    with pytest.raises(GpuAuditError, match="GPU_AUDIT_TEST_SMTP_PW is not set"):
        mailparts.smtp_connect(cfg)
    plain_cfg = cfg_for(port, security="none")
    refused = notify.notify(store, plain_cfg, run_id, admin=False, users=False)  # server insists on TLS
    assert refused["sent"] == [] and all("send failed" in s["reason"] for s in refused["skipped"])
    assert len(inbox.envelopes) == 1 and notify.sent_count(store, kind="team_nudge") == 0
    assert PASSWORD not in inbox.envelopes[0]["msg"].as_string()


@pytest.mark.service
def test_implicit_ssl(tmp_path: Path, smtp_server: Any, tls_files: tuple[Path, Path]) -> None:
    import ssl

    key, cert = tls_files
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    inbox, port = smtp_server(ssl_context=ctx)
    cfg = cfg_for(port, security="ssl", verify_tls=False)
    store, run_id = audited(tmp_path, cfg, weeks=1)
    assert len(notify.notify(store, cfg, run_id, teams=False, users=False)["sent"]) == 1
    assert inbox.envelopes[0]["rcpt"][0] == "ops@example.org"
    verified = cfg_for(port, security="ssl", verify_tls=True)
    with pytest.raises(GpuAuditError, match="SMTP 127.0.0.1"):  # self-signed: refused when verifying
        mailparts.smtp_connect(verified)


def test_dry_run_writes_eml_and_does_not_throttle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_AUDIT_TEST_SMTP_PW", PASSWORD)
    cfg = cfg_for(free_port(), username="gpu", password=SecretRef(env="GPU_AUDIT_TEST_SMTP_PW"))
    store, run_id = audited(tmp_path, cfg, weeks=1)
    out = tmp_path / "outbox"
    res = notify.notify(store, cfg, run_id, dry_run=True, out_dir=out)
    files = sorted(out.glob("*.eml"))
    assert len(files) == len(res["sent"]) == 5
    for f in files:
        raw = f.read_bytes()
        headers = raw.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
        assert PASSWORD.encode() not in raw and not any(h.startswith(b"Bcc") for h in headers)
        m = email.message_from_bytes(raw, policy=policy.default)
        assert {"text", "html"} <= set(parts(m))
    assert notify.sent_count(store, dry_run=True) >= 5 and notify.sent_count(store, dry_run=False) == 0
    again = notify.notify(store, cfg, run_id, dry_run=True, out_dir=tmp_path / "again")
    assert len(again["sent"]) == 5  # dry runs preview; only real sends throttle


def test_header_values_cannot_inject(tmp_path: Path) -> None:
    assert "\n" not in mailparts.safe_header("a\r\nBcc: x@y") and "\r" not in mailparts.safe_header("a\rb")
    for bad in (EVIL_USER, "a@b\r\nBcc: x@y", "no-at-sign", "a@b@c"):
        with pytest.raises(GpuAuditError):
            mailparts.address(bad)
    assert mailparts.user_address(EVIL_USER, "example.org") is None
    assert mailparts.user_address("bob", None) is None
    assert mailparts.user_address("alice", "example.org") == "alice@example.org"
    cfg = make_cfg().model_copy(update={"teams": [Team(name="ml\r\nBcc: x@y", accounts=["acct-ml"],
                                                       emails=["ml-leads@example.org"])]})
    store, run_id = audited(tmp_path, cfg, weeks=1)
    msgs, _ = notify.build_messages(store, cfg, run_id, admin=False, users=False)
    assert len(msgs) == 1
    raw = msgs[0].message.as_bytes()
    m = email.message_from_bytes(raw, policy=policy.default)
    assert m["Bcc"] is None and "ml Bcc: x@y" in m["Subject"]
    assert notify.recipients_of(msgs[0].message) == ["ml-leads@example.org"]
    headers = raw.split(b"\r\n\r\n", 1)[0]
    assert not any(line.startswith(b"Bcc") for line in headers.split(b"\r\n"))


def test_bad_team_address_is_skipped_not_fatal(tmp_path: Path) -> None:
    cfg = make_cfg().model_copy(update={"teams": [
        Team(name="ml", accounts=["acct-ml"], emails=["ml-leads@example.org\r\nBcc: x@y", "ok@example.org"])]})
    store, run_id = audited(tmp_path, cfg, weeks=1)
    msgs, skipped = notify.build_messages(store, cfg, run_id, admin=False, users=False)
    assert [m.recipient for m in msgs] == ["ok@example.org"]
    assert len(skipped) == 1 and "invalid email address" in skipped[0]["reason"]
    assert "\n" not in skipped[0]["to"] and "\r" not in skipped[0]["reason"]
