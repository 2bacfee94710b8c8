"""Chat and webhook channels (Slack, Microsoft Teams, Mattermost, generic JSON webhooks, ... through
apprise) beside SMTP, routed per team and user, throttled through the same ``notifications`` table as
email: one message per recipient, kind and allocation, ever (only messages really sent count).

A channel's apprise URL holds its webhook secret, so it comes from an environment variable or a file and
is never printed: errors name the channel, not the URL, and apprise's own log lines are kept out of ours.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from html import escape
from typing import Any

from sqlalchemy import insert, select

from auditor.config import Channel, Config
from auditor.errors import ConfigError, GpuAuditError
from auditor.logs import log_safe
from auditor.report.mailparts import compose, safe_header, smtp_connect, user_address
from auditor.report.render import _MD_SPECIAL as MD_SPECIAL  # the report's Markdown escaping, reused
from auditor.store import schema
from auditor.store.engine import Store
from auditor.timeutil import utcnow

#: HTTP timeout (connect and read, seconds) of a chat or webhook channel (a `channels[]` setting until issue 45)
CHANNEL_TIMEOUT_S = 10

log = logging.getLogger("gpu_audit.channels")
logging.getLogger("apprise").propagate = False  # its lines could carry URLs (webhook secrets)
logging.getLogger("apprise").addHandler(logging.NullHandler())
_QUIET = threading.Lock()


@dataclass
class Message:
    """One notice about one allocation (or reservation) to everyone it is routed to."""

    kind: str  # warn, escalate, action, nudge, notify_owners
    subject: str
    body: str
    team: str = ""
    user: str = ""
    allocation_id: int | None = None
    period_key: str | None = None  # reservations: "resv:<id>" (they have no allocation id)
    emails: list[str] = field(default_factory=list)
    channels: list[str] = field(default_factory=list)


def routes(cfg: Config, msg: Message) -> list[Channel]:
    """Channels for a message: those named explicitly, plus those whose teams/users name it (a channel with
    neither takes every message of its kinds)."""
    named = set(msg.channels)
    kind = "action" if msg.kind == "notify_owners" else msg.kind
    out = []
    for ch in cfg.channels:
        if ch.name in named:
            out.append(ch)
        elif kind in ch.kinds and ((not ch.teams and not ch.users) or (msg.team and msg.team in ch.teams)
                                   or (msg.user and msg.user in ch.users)):
            out.append(ch)
    return out


def _sent_before(store: Store, recipient: str, kind: str, msg: Message) -> bool:
    t = schema.notifications
    q = select(t.c.id).where(t.c.recipient == recipient, t.c.kind == f"enforce_{kind}", t.c.dry_run.is_(False))
    q = q.where(t.c.allocation_id == msg.allocation_id) if msg.allocation_id is not None else \
        q.where(t.c.period_key == msg.period_key)
    with store.engine.connect() as conn:
        return conn.execute(q.limit(1)).first() is not None


def _record(store: Store, recipient: str, msg: Message) -> None:
    with store.begin() as conn:
        conn.execute(insert(schema.notifications).values(
            recipient=recipient[:320], kind=f"enforce_{msg.kind}"[:32], allocation_id=msg.allocation_id,
            sent_ts=int(utcnow().timestamp()), dry_run=False, message_id=None, period_key=msg.period_key))


@contextmanager
def _quiet_http() -> Iterator[None]:
    """urllib3 logs request lines (webhook paths are secrets) at DEBUG, e.g. under --debug: mute it meanwhile."""
    with _QUIET:
        lg = logging.getLogger("urllib3")
        old = lg.level
        lg.setLevel(max(old, logging.WARNING))
        try:
            yield
        finally:
            lg.setLevel(old)


# MD_SPECIAL: links and images ([ ]), emphasis, code, strike, tables, HTML and autolinks (< >), made literal by
# a backslash; "(" and "!" mean nothing without "[", "#" and "-" only at a line start, which is always ours.
#: the markup each apprise service renders a message in: "markdown" (escaped here), "slack" (apprise
#: escapes & < > and turns mrkdwn off), "text" (no markup: a JSON webhook, SMS, ...)
MARKUP = {"NotifyMattermost": "markdown", "NotifyDiscord": "markdown", "NotifyWorkflows": "markdown",
          "NotifyMSTeams": "markdown", "NotifySlack": "slack", "NotifyJSON": "text"}
# @channel, @here, @all, @everyone, @user, <@123>, <!here>: a zero-width space after the @ keeps it text
_MENTION = re.compile(r"@(?=[\w&!])")


def escape_for(markup: str, text: str) -> str:
    """``text`` (plain text, user names in it) made literal for a channel's markup: control characters
    escaped on every channel (:func:`auditor.logs.log_safe`, line by line: our own newlines stay), mentions
    made inert on chat channels, Markdown backslash-escaped where the service renders it."""
    lines = [log_safe(line) for line in text.split("\n")]
    if markup in ("markdown", "slack"):
        lines = [_MENTION.sub("@\u200b", line) for line in lines]
    if markup == "markdown":
        lines = [MD_SPECIAL.sub(r"\\\1", line) for line in lines]
    return "\n".join(lines)


def send_channel(ch: Channel, subject: str, body: str) -> None:
    """Post through apprise; raises a one-line GpuAuditError naming the channel (never its URL).

    Subject and body are plain text carrying user-controlled names (pod labels, job names): each channel
    gets them escaped for the markup it renders (:func:`escape_for`), and apprise is handed Markdown as
    Markdown so it converts nothing (a Mattermost post got a live @channel and a link to an attacker's URL)."""
    import apprise

    try:
        url = ch.url.resolve(f"channels[{ch.name}].url") or ""
    except ConfigError as exc:
        raise GpuAuditError(str(exc)) from None
    sep = "&" if "?" in url else "?"
    ap = apprise.Apprise()
    if not url or not ap.add(f"{url}{sep}cto={CHANNEL_TIMEOUT_S:g}&rto={CHANNEL_TIMEOUT_S:g}"):
        raise GpuAuditError(f"channel {ch.name}: the URL is not one apprise understands")
    markup = MARKUP.get(type(ap[0]).__name__, "text")
    fmt = apprise.NotifyFormat.MARKDOWN if markup == "markdown" else apprise.NotifyFormat.TEXT
    with _quiet_http():
        ok = ap.notify(title=escape_for(markup, subject), body=escape_for(markup, body), body_format=fmt)
    if not ok:
        raise GpuAuditError(f"channel {ch.name}: delivery failed")


class Notifier:
    """Sends :class:`Message` s to channels and email; ``dry_run`` only says where they would go."""

    def __init__(self, store: Store, cfg: Config, *, dry_run: bool) -> None:
        self.store, self.cfg, self.dry_run = store, cfg, dry_run
        self._smtp: Any = None

    def recipients(self, msg: Message) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = [(f"channel:{ch.name}", ch) for ch in routes(self.cfg, msg)]
        emails = list(msg.emails)
        if msg.kind in ("warn", "action", "notify_owners") and msg.user:
            addr = user_address(msg.user, self.cfg.email.user_domain)
            if addr:
                emails.append(addr)
        seen = set()
        for e in emails:
            if e.lower() not in seen:
                seen.add(e.lower())
                out.append((e, None))
        return out

    def send(self, msg: Message) -> list[dict[str, Any]]:
        """Deliver to every routed recipient not already told; one result entry per recipient."""
        results = []
        for rcpt, ch in self.recipients(msg):
            if _sent_before(self.store, rcpt, msg.kind, msg):
                results.append({"to": rcpt, "status": "throttled"})
                continue
            if self.dry_run:
                results.append({"to": rcpt, "status": "dry_run"})
                continue
            try:
                if ch is not None:
                    send_channel(ch, msg.subject, msg.body)
                else:
                    self._email(rcpt, msg)
            except GpuAuditError as exc:
                log.warning("%s", exc)
                results.append({"to": rcpt, "status": "failed", "error": str(exc)})
                continue
            _record(self.store, rcpt, msg)
            results.append({"to": rcpt, "status": "sent"})
        return results

    def _email(self, rcpt: str, msg: Message) -> None:
        import smtplib

        if self._smtp is None:
            self._smtp = smtp_connect(self.cfg)
        m = compose(self.cfg, rcpt, msg.subject, msg.body, f"<pre>{escape(msg.body)}</pre>", [])
        try:
            self._smtp.send_message(m)
        except smtplib.SMTPException as exc:
            raise GpuAuditError(f"email to {rcpt}: {type(exc).__name__}") from None

    def close(self) -> None:
        if self._smtp is not None:
            try:
                self._smtp.quit()
            except OSError:
                self._smtp.close()
            self._smtp = None


def send_nudges(store: Store, cfg: Config, run_id: int, *, dry_run: bool) -> list[dict[str, Any]]:
    """The weekly per-team / per-user nudges to channels routed for kind ``nudge``, throttled like email:
    ``email.nudge_min_days`` between two nudges to one channel, never twice about one allocation."""
    from collections import defaultdict

    from auditor.report.mailparts import nudge_rows

    chans = [c for c in cfg.channels if "nudge" in c.kinds]
    if not chans:
        return []
    rows = nudge_rows(store, cfg, run_id)
    now = int(utcnow().timestamp())
    t = schema.notifications
    last: dict[str, int] = {}
    seen: dict[str, set[int]] = defaultdict(set)
    with store.engine.connect() as conn:
        for r in conn.execute(select(t.c.recipient, t.c.allocation_id, t.c.sent_ts).where(
                t.c.kind == "channel_nudge", t.c.dry_run.is_(False))):
            last[r.recipient] = max(last.get(r.recipient, 0), r.sent_ts)
            seen[r.recipient].add(r.allocation_id)
    out = []
    for ch in chans:
        rcpt = f"channel:{ch.name}"
        mine = [r for r in rows if (not ch.teams and not ch.users) or r["team"] in ch.teams
                or r["user"] in ch.users]
        fresh = [r for r in mine if r["allocation_id"] not in seen[rcpt]]
        if not fresh:
            continue
        if rcpt in last and now - last[rcpt] < cfg.email.nudge_min_days * 86400:
            out.append({"to": rcpt, "status": "throttled", "reason": "email.nudge_min_days"})
            continue
        idle = sum(r["idle_gpu_hours"] for r in fresh)
        n = len(fresh)
        subject = f"[gpu-audit] {n} allocation{'s' if n != 1 else ''} held GPUs idle, {idle:,.1f} GPU-hours"
        body = "\n".join(safe_header(f"- {r['cluster']} {r['source']} {r['job_id']} ({r['user']}, {r['team']}): "
                                     f"{r['idle_gpu_hours']:,.1f} idle GPU-h, {r['kind']}"
                                     + "".join(f"; {x}" for x in (r.get("command"), r.get("url")) if x), 400)
                         for r in fresh[:cfg.report.top_n])  # one line each: names are user-controlled text
        if dry_run:
            out.append({"to": rcpt, "status": "dry_run", "allocations": len(fresh)})
            continue
        try:
            send_channel(ch, subject, body)
        except GpuAuditError as exc:
            out.append({"to": rcpt, "status": "failed", "error": str(exc)})
            continue
        with store.begin() as conn:
            conn.execute(insert(t), [{"recipient": rcpt, "kind": "channel_nudge", "allocation_id": r["allocation_id"],
                                      "sent_ts": now, "dry_run": False, "message_id": None, "period_key": None}
                                     for r in fresh])
        out.append({"to": rcpt, "status": "sent", "allocations": len(fresh)})
    return out
