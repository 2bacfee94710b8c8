"""Email: the weekly admin report and per-team / per-user nudges, throttled through the store.

Messages are multipart/alternative (plain text + HTML with inline PNG sparklines as ``cid:`` parts).
Headers are built with :mod:`email.headerregistry` from values stripped of control characters, so a user
or job name cannot add headers. Throttling reads the ``notifications`` table: nobody is nudged twice about
the same allocation, nudges to one address are ``email.nudge_min_days`` apart, and the admin report goes
once per period. Only messages really sent count for throttling; ``--dry-run`` writes .eml files, records
them with dry_run=1 and so previews exactly what a real run would send.
"""

from __future__ import annotations

import logging
import re
import smtplib
import ssl
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select, text

from auditor import report, schema
from auditor.charts import Image
from auditor.config import Config
from auditor.errors import GpuAuditError
from auditor.mailparts import SMTP_POLICY, mark_running, nudge_subject
from auditor.render import environment, render_html, render_text
from auditor.store import Store
from auditor.timeutil import utcnow

log = logging.getLogger("gpu_audit.notify")
#: user-facing kinds (ghost_busy goes to operations, not the user)
NUDGE_KINDS = ("idle_allocation", "util_mirage", "hung_collective", "idle_gpus", "idle_episode")
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


@dataclass
class Outgoing:
    """One message to one recipient, with what throttling must record once it is sent."""

    kind: str
    recipient: str
    message: EmailMessage
    allocation_ids: list[int] = field(default_factory=list)
    period_key: str | None = None
    stem: str = ""


def period_key(until_ts: int) -> str:
    """ISO week of the window's last second, e.g. 2026-W48."""
    y, w, _ = datetime.fromtimestamp(until_ts - 1, UTC).isocalendar()
    return f"{y}-W{w:02d}"


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


def recipients_of(msg: EmailMessage) -> list[str]:
    out = []
    for h in ("To", "Cc"):
        for a in getattr(msg[h], "addresses", ()) if msg[h] else ():
            out.append(a.addr_spec)
    return out


class Throttle:
    """What has already been sent (for real), read once per run."""

    def __init__(self, store: Store, now: int) -> None:
        self.now = now
        t = schema.notifications
        self.last: dict[str, int] = {}
        self.about: dict[str, set[int]] = defaultdict(set)
        self.periods: set[tuple[str, str]] = set()
        with store.engine.connect() as conn:
            for r in conn.execute(select(t.c.recipient, t.c.kind, t.c.allocation_id, t.c.sent_ts,
                                         t.c.period_key).where(t.c.dry_run.is_(False))):
                rcpt = r.recipient.lower()
                if r.kind == "admin_report":
                    self.periods.add((rcpt, r.period_key or ""))
                    continue
                self.last[rcpt] = max(self.last.get(rcpt, 0), r.sent_ts)
                if r.allocation_id is not None:
                    self.about[rcpt].add(r.allocation_id)

    def nudge_block(self, rcpt: str, min_days: float) -> str | None:
        last = self.last.get(rcpt.lower())
        if last is not None and self.now - last < min_days * 86400:
            return f"nudged {(self.now - last) / 86400:.1f} days ago (email.nudge_min_days = {min_days:g})"
        return None

    def new_for(self, rcpt: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        seen = self.about.get(rcpt.lower(), set())
        return [r for r in rows if r["allocation_id"] not in seen]


def nudge_rows(store: Store, cfg: Config, run_id: int) -> list[dict[str, Any]]:
    """Every nudge-worthy finding of the run (about an allocation), costliest first."""
    with store.engine.connect() as conn:
        table = report.findings_table(conn, run_id, NUDGE_KINDS, report._tz(cfg), full=True, top_n=0,
                                      where=" AND f.allocation_id IS NOT NULL")
    best: dict[int, dict[str, Any]] = {}
    kinds: dict[int, list[str]] = defaultdict(list)
    for r in table["rows"]:  # one row per allocation: the costliest finding, naming all its kinds
        kinds[r["allocation_id"]].append(r["kind"])
        best.setdefault(r["allocation_id"], r)
    return [{**r, "kind": ", ".join(kinds[a])} for a, r in best.items()]


def nudge_context(ctx: dict[str, Any], audience: str, who: str, rows: list[dict[str, Any]], top_n: int
                  ) -> dict[str, Any]:
    totals = {"gpu_hours": sum(r["gpu_hours"] for r in rows), "cost": sum(r["cost"] for r in rows),
              "idle_gpu_hours": sum(r["idle_gpu_hours"] for r in rows)}
    return {"audience": audience, "who": who, "run": ctx["run"], "currency": ctx["currency"],
            "definitions": ctx["definitions"],
            "judged": ctx.get("judged") or [], "thresholds": ctx["thresholds"], "files": ctx["files"],
            "allocations": len({r["allocation_id"] for r in rows}),
            "findings": {"rows": rows[:top_n], "total": len(rows), "shown": min(top_n, len(rows)),
                         "cut": len(rows) > top_n, "totals": totals},
            "kinds": sorted({k for r in rows for k in r["kind"].split(", ")}), "advice": report.ADVICE}


def build_messages(store: Store, cfg: Config, run_id: int, *, admin: bool = True, teams: bool = True,
                   users: bool = True, now: datetime | None = None) -> tuple[list[Outgoing], list[dict]]:
    """Every message this run should send, after throttling; plus what was skipped and why."""
    now_ts = int((now or utcnow()).timestamp())
    throttle = Throttle(store, now_ts)
    ctx = report.build_context(store, cfg, run_id)
    pkey = period_key(ctx["run"]["until_ts"])
    out: list[Outgoing] = []
    skipped: list[dict] = []
    if admin:
        html, images = render_html(ctx, mode="cid")
        h = ctx["headline"]
        subject = (f"GPU audit {ctx['run']['since']} to {ctx['run']['until']}: "
                   f"{h['idle_gpu_hours']:,.1f} idle GPU-hours, {ctx['currency']} {h['idle_cost']:,.2f}")
        txt = render_text(ctx)
        for rcpt in cfg.email.admin_to:
            if (rcpt.lower(), pkey) in throttle.periods:
                skipped.append({"kind": "admin_report", "to": rcpt, "reason": f"already sent for {pkey}"})
                continue
            try:
                msg = compose(cfg, rcpt, subject, txt, html, images)
            except GpuAuditError as exc:
                skipped.append({"kind": "admin_report", "to": safe_header(rcpt, 80), "reason": str(exc)})
                continue
            out.append(Outgoing("admin_report", rcpt, msg, period_key=pkey, stem=f"admin-{pkey}"))
    rows = nudge_rows(store, cfg, run_id) if (teams or users) else []
    mark_running(store, rows, now_ts, float(ctx["thresholds"].get("idle_sm", cfg.thresholds.idle_sm)),
                 report._tz(cfg))
    if teams:
        by_team: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            by_team[r["team"]].append(r)
        for team in cfg.teams:
            if by_team.get(team.name):
                for rcpt in team.emails:
                    _nudge(out, skipped, cfg, ctx, throttle, "team_nudge", team.name, rcpt,
                           by_team[team.name], pkey)
    if users:
        if not cfg.email.user_domain:
            skipped.append({"kind": "user_nudge", "to": "", "reason": "email.user_domain is not set"})
        else:
            by_user: dict[str, list[dict[str, Any]]] = defaultdict(list)
            for r in rows:
                by_user[r["user"]].append(r)
            for user, urows in sorted(by_user.items()):
                rcpt = user_address(user, cfg.email.user_domain)
                if rcpt is None:
                    skipped.append({"kind": "user_nudge", "to": safe_header(user, 80),
                                    "reason": "user name is not a plain login name; no address derived"})
                    continue
                _nudge(out, skipped, cfg, ctx, throttle, "user_nudge", user, rcpt, urows, pkey)
    return out, skipped


def _nudge(out: list[Outgoing], skipped: list[dict], cfg: Config, ctx: dict[str, Any], throttle: Throttle,
           kind: str, who: str, rcpt: str, rows: list[dict[str, Any]], pkey: str) -> None:
    block = throttle.nudge_block(rcpt, cfg.email.nudge_min_days)
    if block:
        skipped.append({"kind": kind, "to": rcpt, "reason": block})
        return
    fresh = throttle.new_for(rcpt, rows)
    if not fresh:
        skipped.append({"kind": kind, "to": rcpt, "reason": "already nudged about every allocation"})
        return
    audience = "team" if kind == "team_nudge" else "user"
    nctx = nudge_context(ctx, audience, who, fresh, cfg.report.top_n)
    html, images = render_html(nctx, template="nudge.html.j2", mode="cid")
    txt = environment("text").get_template("nudge.txt.j2").render(**nctx)
    t = nctx["findings"]["totals"]
    n = nctx["allocations"]
    subject = nudge_subject(audience, who, n, t, ctx["currency"], sum(1 for r in fresh if r.get("running_now")))
    try:
        msg = compose(cfg, rcpt, subject, txt, html, images)
    except GpuAuditError as exc:  # a bad address in the team mapping: skip it, send the rest
        skipped.append({"kind": kind, "to": safe_header(rcpt, 80), "reason": str(exc)})
        return
    throttle.last[rcpt.lower()] = throttle.now  # one nudge per address per run
    out.append(Outgoing(kind, rcpt, msg, sorted({r["allocation_id"] for r in fresh}), pkey, f"{audience}-{who}"))


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
            smtp: smtplib.SMTP = smtplib.SMTP_SSL(e.smtp_host, e.smtp_port, timeout=e.timeout_s, context=ctx)
        else:
            smtp = smtplib.SMTP(e.smtp_host, e.smtp_port, timeout=e.timeout_s)
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


def _file_name(o: Outgoing, run_id: int) -> str:
    """Stable per run and recipient, so a second dry run replaces its own files and nothing else."""
    stem = re.sub(r"[^A-Za-z0-9_.@-]+", "_", f"{o.stem}-{o.recipient}")[:120]
    return f"run{run_id}-{stem}.eml"


def notify(store: Store, cfg: Config, run_id: int, *, dry_run: bool = False, out_dir: Path | str | None = None,
           admin: bool = True, teams: bool = True, users: bool = True, now: datetime | None = None
           ) -> dict[str, list[dict[str, Any]]]:
    """Send (or with ``dry_run`` write as .eml) the admin report and nudges for ``run_id``; record them.

    Returns ``{"sent": [...], "skipped": [...]}`` (plain data: the pipeline prints it as JSON)."""
    messages, skipped = build_messages(store, cfg, run_id, admin=admin, teams=teams, users=users, now=now)
    result: dict[str, list[dict[str, Any]]] = {"sent": [], "skipped": skipped}
    if cfg.channels and (teams or users):  # chat/webhook nudges (auditor.channels), same throttling rules
        from auditor.channels import send_nudges

        result["channels"] = send_nudges(store, cfg, run_id, dry_run=dry_run)
    if not messages:
        return result
    outdir = Path(out_dir or cfg.report.out_dir)
    smtp = None
    if dry_run:
        try:
            outdir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise GpuAuditError(f"cannot create {outdir}: {exc.strerror}") from None
    else:
        smtp = smtp_connect(cfg)
    try:
        for o in messages:
            entry: dict[str, Any] = {"kind": o.kind, "to": o.recipient, "subject": str(o.message["Subject"]),
                                     "allocations": o.allocation_ids}
            if dry_run:
                path = outdir / _file_name(o, run_id)
                path.write_bytes(o.message.as_bytes(policy=SMTP_POLICY))
                entry["file"] = str(path)
            else:
                assert smtp is not None
                try:
                    smtp.send_message(o.message, to_addrs=recipients_of(o.message))
                except smtplib.SMTPException as exc:
                    result["skipped"].append({"kind": o.kind, "to": o.recipient,
                                           "reason": f"send failed: {safe_header(exc, 160)}"})
                    continue
            _record(store, o, dry_run)
            result["sent"].append(entry)
    finally:
        if smtp is not None:
            try:
                smtp.quit()
            except (OSError, smtplib.SMTPException):
                smtp.close()
    return result


def _record(store: Store, o: Outgoing, dry_run: bool) -> None:
    ts = int(utcnow().timestamp())
    base = {"recipient": o.recipient, "kind": o.kind, "sent_ts": ts, "dry_run": dry_run,
            "message_id": str(o.message["Message-ID"]), "period_key": o.period_key}
    rows = [{**base, "allocation_id": a} for a in o.allocation_ids] or [{**base, "allocation_id": None}]
    with store.begin() as conn:
        conn.execute(insert(schema.notifications), rows)


def sent_count(store: Store, **where: Any) -> int:
    """Rows in the notifications table matching ``where`` (for tests and `notify` summaries)."""
    t = schema.notifications
    q = select(text("COUNT(*)")).select_from(t)
    for k, v in where.items():
        q = q.where(t.c[k] == v)
    with store.engine.connect() as conn:
        return int(conn.execute(q).scalar() or 0)
