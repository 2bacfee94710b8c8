"""Pieces of the nudges and their MIME form: a header policy that never folds right after the name, the
subject line, and the "still running, release it now" facts a nudge leads with."""

from __future__ import annotations

from email.policy import EmailPolicy
from typing import Any

from sqlalchemy import select

from auditor import report, schema
from auditor.store import Store


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
        r["idle_now"] = bool(running and sm and sm[-1] < idle_sm)
        r["checked_at"] = report._when(now_ts, tz)
        r["release_hint"] = release_hint(a.source, a.external_id, a.account, a.name) if a is not None else ""


def nudge_subject(audience: str, who: str, n: int, totals: dict[str, Any], currency: str, running: int) -> str:
    """A subject that starts with a short ASCII tag (never folded right after ``Subject:``), names shortened."""
    from auditor.render import shorten

    lead = f"[gpu-audit] {running} still running with idle GPUs; " if running else "[gpu-audit] "
    return (f"{lead}{audience} {shorten(who, 40)}: {n} allocation{'' if n == 1 else 's'} held GPUs idle, "
            f"{totals['idle_gpu_hours']:,.1f} GPU-hours, {currency} {totals['cost']:,.2f}")
