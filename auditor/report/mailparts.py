"""Pieces of the nudges and their MIME form: a header policy that never folds right after the name, the
subject line, and the "still running, release it now" facts a nudge leads with."""

from __future__ import annotations

import re
import smtplib
import ssl
from collections import defaultdict
from email.headerregistry import Address
from email.message import EmailMessage
from email.policy import EmailPolicy
from email.utils import format_datetime, make_msgid
from typing import Any

from sqlalchemy import select

from auditor.audit import kinds, verdict
from auditor.config import Config
from auditor.errors import GpuAuditError
from auditor.report import context as report
from auditor.report.charts import Image
from auditor.store import schema
from auditor.store.engine import Store
from auditor.timeutil import utcnow

#: SMTP timeout in seconds: a mail server that has not answered in 30 s is down (an `[email]` setting until
#: issue 45)
SMTP_TIMEOUT_S = 30


class MailPolicy(EmailPolicy):
    """The SMTP policy (CRLF, folded at 78), except that a header is never folded right after its name.

    The stdlib folds ``Subject: <77 characters>`` as ``Subject:`` + CRLF + the text; several mail clients
    then show an empty subject. Such a first line stays whole instead (legal: lines may be 998 long)."""

    def _lead(self, name: str, folded: str) -> str:
        lead = f"{name}:{self.linesep} "
        return f"{name}: {folded[len(lead):]}" if folded.startswith(lead) else folded

    def fold(self, name: str, value: str) -> str:
        return self._lead(name, super().fold(name, value))

    def fold_binary(self, name: str, value: str) -> bytes:
        lead = f"{name}:{self.linesep} ".encode("ascii")
        out = super().fold_binary(name, value)
        return f"{name}: ".encode("ascii") + out[len(lead):] if out.startswith(lead) else out


SMTP_POLICY = MailPolicy(linesep="\r\n")


def release_hint(source: str, external_id: str, account: str, name: str) -> str:
    """The command that frees the GPUs (what a nudge about a running job should say first)."""
    if source == "slurm":
        return f"scancel {external_id}"
    if source == "kubernetes":
        return f"kubectl delete pod -n {account} {name}"
    return "end the job to release its GPUs"


def mark_running(store: Store, rows: list[dict[str, Any]], now_ts: int, idle_sm: float, tz: Any) -> None:
    """Add ``running_now`` (the job still holds its GPUs at send time), ``idle_now`` (its latest telemetry bin
    was idle) and a release command to each nudge row: the most actionable fact a nudge can carry."""
    ids = sorted({int(r["allocation_id"]) for r in rows if r.get("allocation_id") is not None})
    state: dict[int, Any] = {}
    t = schema.allocations
    with store.engine.connect() as conn:
        for i in range(0, len(ids), 500):
            for a in conn.execute(select(t.c.id, t.c.start_ts, t.c.end_ts, t.c.source, t.c.external_id,
                                         t.c.account, t.c.name).where(t.c.id.in_(ids[i:i + 500]))):
                state[a.id] = a
    for r in rows:
        a = state.get(r.get("allocation_id"))
        running = a is not None and a.start_ts is not None and (a.end_ts is None or a.end_ts > now_ts)
        sm = [v for v in ((r.get("sparkline") or {}).get("sm") or []) if v is not None]
        r["running_now"] = running
        r["idle_now"] = bool(running and sm and verdict.is_below(sm[-1], idle_sm))
        r["checked_at"] = report._when(now_ts, tz)
        r["release_hint"] = release_hint(a.source, a.external_id, a.account, a.name) if a is not None else ""


def nudge_subject(audience: str, who: str, n: int, totals: dict[str, Any], currency: str, running: int) -> str:
    """A subject that starts with a short ASCII tag (never folded right after ``Subject:``), names shortened."""
    from auditor.report.render import shorten

    lead = f"[gpu-audit] {running} still running with idle GPUs; " if running else "[gpu-audit] "
    return (f"{lead}{audience} {shorten(who, 40)}: {n} allocation{'' if n == 1 else 's'} held GPUs idle, "
            f"{totals['idle_gpu_hours']:,.1f} GPU-hours, {currency} {totals['cost']:,.2f}")




_CTRL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


_LOCAL_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")


def safe_header(value: Any, limit: int = 200) -> str:
    """A header value with every CR, LF and other control character replaced by a space."""
    return " ".join(_CTRL.sub(" ", str(value)).split())[:limit]


def address(addr: str) -> Address:
    """Parse one bare address (``user@host``); anything with control characters or odd syntax is refused."""
    if not isinstance(addr, str) or _CTRL.search(addr) or addr.count("@") != 1:
        raise GpuAuditError(f"invalid email address {safe_header(addr, 80)!r}")
    try:
        a = Address(addr_spec=addr.strip())
    except (ValueError, IndexError) as exc:
        raise GpuAuditError(f"invalid email address {safe_header(addr, 80)!r}: {exc}") from None
    if not a.username or not a.domain or a.addr_spec != addr.strip():
        raise GpuAuditError(f"invalid email address {safe_header(addr, 80)!r}")
    return a


def user_address(user: str, domain: str | None) -> str | None:
    """user@domain for a plain login name; None for anything that is not one (it is never guessed)."""
    if not domain or not _LOCAL_PART.fullmatch(user or ""):
        return None
    try:
        return address(f"{user}@{domain}").addr_spec
    except GpuAuditError:
        return None


def compose(cfg: Config, to: str, subject: str, text_body: str, html_body: str, images: list[Image]
            ) -> EmailMessage:
    """multipart/alternative: text, then HTML (multipart/related with its PNGs when it has images)."""
    e = cfg.email
    sender = address(e.sender)
    msg = EmailMessage(policy=SMTP_POLICY)
    msg["From"] = Address(display_name="gpu-audit", username=sender.username, domain=sender.domain)
    msg["To"] = address(to)
    cc = [address(a) for a in e.cc if a.strip().lower() != to.strip().lower()]
    if cc:
        msg["Cc"] = cc
    if e.reply_to:
        msg["Reply-To"] = address(e.reply_to)
    msg["Subject"] = safe_header(subject)
    msg["Date"] = format_datetime(utcnow())
    msg["Message-ID"] = make_msgid(domain=sender.domain)
    msg["Auto-Submitted"] = "auto-generated"
    msg.set_content(text_body)
    msg.add_alternative(html_body, subtype="html")
    html_part = msg.get_payload()[1]
    for img in images:
        html_part.add_related(img.png, "image", "png", cid=f"<{img.cid}>", disposition="inline",
                              filename=img.cid.split("@")[0] + ".png")
    return msg


def nudge_rows(store: Store, cfg: Config, run_id: int) -> list[dict[str, Any]]:
    """Every nudge-worthy finding of the run (about an allocation), costliest first: one row per allocation,
    its idle GPU-hours and cost those of all its nudged findings counted once
    (:func:`auditor.report.context.finding_totals`), so that a nudge's rows add up to its total; with where
    to look further (``ref``, ``command``, ``url``: :func:`auditor.report.context.allocation_links`, as the
    report's actions say it)."""
    where = " AND f.allocation_id IS NOT NULL"
    with store.engine.connect() as conn:
        table = report.findings_table(conn, run_id, kinds.NUDGED, report._tz(cfg), full=True, top_n=0,
                                      where=where)
        counted = report.finding_totals(conn, run_id, kinds.NUDGED, where=where)["by_allocation"]
        links = report.allocation_links(conn, cfg, [r["allocation_id"] for r in table["rows"]])
    best: dict[int, dict[str, Any]] = {}
    named: dict[int, list[str]] = defaultdict(list)
    for r in table["rows"]:  # one row per allocation: the costliest finding, naming all its kinds
        named[r["allocation_id"]].append(r["kind"])
        best.setdefault(r["allocation_id"], r)
    out = [{**r, "kind": ", ".join(named[a]), **counted.get(a, {}), **links.get(a, {})} for a, r in best.items()]
    return sorted(out, key=lambda r: -r["cost"])  # stable: ties keep the table's order


def smtp_connect(cfg: Config) -> smtplib.SMTP:
    """Connect, secure (STARTTLS or SSL) and log in; errors are one line and never carry the password."""
    e = cfg.email
    ctx = ssl.create_default_context()
    if not e.verify_tls:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    where = f"SMTP {e.smtp_host}:{e.smtp_port}"
    try:
        if e.security == "ssl":
            smtp: smtplib.SMTP = smtplib.SMTP_SSL(e.smtp_host, e.smtp_port, timeout=SMTP_TIMEOUT_S, context=ctx)
        else:
            smtp = smtplib.SMTP(e.smtp_host, e.smtp_port, timeout=SMTP_TIMEOUT_S)
            smtp.ehlo()
            if e.security == "starttls":
                smtp.starttls(context=ctx)
                smtp.ehlo()
        if e.username:
            smtp.login(e.username, e.password.resolve("email.password") or "")
    except smtplib.SMTPAuthenticationError as exc:
        raise GpuAuditError(f"{where}: login as {e.username} refused ({exc.smtp_code})") from None
    except (OSError, smtplib.SMTPException) as exc:
        raise GpuAuditError(f"{where}: {type(exc).__name__}: {safe_header(exc, 160)}") from None
    return smtp
