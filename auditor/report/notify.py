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
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path
from typing import Any

from sqlalchemy import insert, select, text

from auditor import owned
from auditor.audit import kinds
from auditor.config import Config
from auditor.errors import GpuAuditError
from auditor.report import context as report
from auditor.report.mailparts import (
    SMTP_POLICY,
    compose,
    mark_running,
    nudge_rows,
    nudge_subject,
    safe_header,
    smtp_connect,
    user_address,
)
from auditor.report.render import render_html, render_text, site_templates
from auditor.store import schema
from auditor.store.engine import Store
from auditor.timeutil import utcnow

log = logging.getLogger("gpu_audit.notify")


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


def nudge_totals(store: Store, run_id: int, rows: list[dict[str, Any]], audience: str, who: str
                 ) -> dict[str, Any]:
    """Idle GPU-hours and cost of the nudged allocations (the one findings total,
    :func:`auditor.report.context.finding_totals`, over their nudged kinds), the GPU-hours they reserved,
    and ``reserved_by_recipient``: every GPU-hour the user (team) reserved in the window, as the web shows
    them (:func:`auditor.report.context.usage_of`)."""
    ids = sorted({int(r["allocation_id"]) for r in rows if r.get("allocation_id") is not None})
    with store.engine.connect() as conn:
        t = report.finding_totals(conn, run_id, kinds.NUDGED,
                                  where=f" AND f.allocation_id IN ({', '.join(map(str, ids)) or 'NULL'})")
        scope = {"team": who} if audience == "team" else {"user": who}
        t["reserved_by_recipient"] = report.usage_of(conn, run_id, **scope)["reserved_gpu_hours"]
    return t


def nudge_context(ctx: dict[str, Any], audience: str, who: str, rows: list[dict[str, Any]], top_n: int,
                  totals: dict[str, Any], help_url: str | None = None) -> dict[str, Any]:
    """What a nudge shows: its rows (one per allocation), ``totals`` (:func:`nudge_totals`) and the site's
    advice page (``email.help_url``)."""
    return {"audience": audience, "who": who, "run": ctx["run"], "currency": ctx["currency"],
            "help_url": help_url,
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
    site = site_templates(cfg)
    if admin:
        html, images = render_html(ctx, mode="cid", templates=site)
        h = ctx["headline"]
        subject = (f"GPU audit {ctx['run']['since']} to {ctx['run']['until']}: "
                   f"{h['idle_gpu_hours']:,.1f} idle GPU-hours, {ctx['currency']} {h['idle_cost']:,.2f}")
        txt = render_text(ctx, templates=site)
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
                    _nudge(out, skipped, store, cfg, ctx, throttle, "team_nudge", team.name, rcpt,
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
                _nudge(out, skipped, store, cfg, ctx, throttle, "user_nudge", user, rcpt, urows, pkey)
    return out, skipped


def _nudge(out: list[Outgoing], skipped: list[dict], store: Store, cfg: Config, ctx: dict[str, Any],
           throttle: Throttle, kind: str, who: str, rcpt: str, rows: list[dict[str, Any]], pkey: str) -> None:
    block = throttle.nudge_block(rcpt, cfg.email.nudge_min_days)
    if block:
        skipped.append({"kind": kind, "to": rcpt, "reason": block})
        return
    fresh = throttle.new_for(rcpt, rows)
    if not fresh:
        skipped.append({"kind": kind, "to": rcpt, "reason": "already nudged about every allocation"})
        return
    audience = "team" if kind == "team_nudge" else "user"
    nctx = nudge_context(ctx, audience, who, fresh, cfg.report.top_n,
                         nudge_totals(store, ctx["run"]["id"], fresh, audience, who), cfg.email.help_url)
    site = site_templates(cfg)
    html, images = render_html(nctx, template="nudge.html.j2", mode="cid", templates=site)
    txt = render_text(nctx, "nudge.txt.j2", templates=site)
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
    if cfg.channels and (teams or users):  # chat/webhook nudges (auditor.report.channels), same throttling rules
        from auditor.report.channels import send_nudges

        result["channels"] = send_nudges(store, cfg, run_id, dry_run=dry_run)
    if not messages:
        return result
    outdir = Path(out_dir or cfg.report.out_dir)
    smtp = None
    if dry_run:
        # only over .eml files an earlier dry run wrote, checked before the first is written (auditor.owned)
        owned.check(outdir, [outdir / _file_name(o, run_id) for o in messages])
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
                owned.record(outdir, [path])
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
