"""CLI commands for enforcement: ``enforce`` (dry-run unless --apply), ``exempt CLUSTER:ID`` and
``enforce-log``. Registered by :mod:`auditor.cli` through ``register(group)``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from auditor.logs import log_safe as t  # the one escaping of user text for the terminal


def _when(ts: int | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC") if ts else "-"


def _decisions_text(res: dict[str, Any]) -> str:
    mode = "DRY RUN (nothing changed; --apply acts)" if res["dry_run"] else "APPLIED"
    lines = [f"enforcement {t(res.get('run_key', ''))} by {t(res.get('actor', ''))}: {mode}"]
    if res.get("note"):
        lines.append(t(res["note"]))
    for d in res["decisions"]:
        lines.append(f"  {t(d.get('stage', '')):8} {t(d.get('decision', '')):8} {t(d.get('action', '-')):14} "
                     f"{t(d['target'])}: {t(d.get('reason', ''))}"
                     + (f" -> {t(d['result'])}" if d.get("result") else ""))
    for n in res.get("not_idle", []):
        lines.append(f"  {'-':8} {'none':8} {'-':14} {t(n['target'])}: not idle (policy {t(n['policy'])})")
    lines.append(f"actions this run: {res.get('acted', 0)}")
    return "\n".join(lines)


def register(group: click.Group) -> None:
    from auditor.cli.app import App, pass_app

    @group.command()
    @click.option("--apply", "apply", is_flag=True, help="Act for real (default: dry-run; or enforce.apply).")
    @pass_app
    def enforce(app: App, apply: bool) -> None:
        """Apply the [[policies]]: warn, escalate, act on idle allocations; log every decision."""
        from auditor.enforce.policy import enforce as run

        res = run(app.store(), app.cfg, apply=apply, base_dir=app.base_dir)
        app.emit(res, lambda: _decisions_text(res))

    @group.command()
    @click.argument("target", metavar="CLUSTER:ID")
    @click.option("--until", "until", required=True, help="Expiry: 2026-12-24, 2026-12-24T18:00, now+3days.")
    @click.option("--reason", required=True, help="Why the allocation must not be stopped.")
    @click.option("--by", "by", default=None, help="Who asked (default: the user running this); stored beside "
                  "who ran the command (login@host).")
    @click.option("--future", is_flag=True, help="Record it for a job the store has not seen yet (otherwise an id "
                  "that matches no allocation is refused, with the ids that look like it).")
    @pass_app
    def exempt(app: App, target: str, until: str, reason: str, by: str | None, future: bool) -> None:
        """Exempt one allocation (Slurm job id, pod UID or namespace/pod) from enforcement until a time; a
        Slurm array job id covers its tasks."""
        from auditor.audit import exempt as ex

        row = ex.add(app.store(), app.cfg, target, until, reason, by=by, future=future)
        cov = row["covers"]
        covers = (f"covers {', '.join(t(c) for c in cov[:ex.SHOW])}" + (f" and {len(cov) - ex.SHOW} more"
                  if len(cov) > ex.SHOW else "")) if cov else "matches nothing in the store yet (--future)"
        app.emit(row, f"exempt {t(row['cluster'])}:{t(row['external_id'])} until {_when(row['until_ts'])}, "
                      f"{covers} (asked by {t(row['requested_by'])}, recorded by {t(row['actor'])}): "
                      f"{t(row['reason'])}")

    @group.command("enforce-log")
    @click.option("--limit", default=50, show_default=True, help="Newest rows to show.")
    @pass_app
    def enforce_log(app: App, limit: int) -> None:
        """Show the enforcement audit log (what, who, why, result), newest first."""
        from auditor.enforce.policy import log_rows

        rows = log_rows(app.store(), limit=limit)
        app.emit(rows, lambda: "\n".join(
            f"{_when(r['decided_ts'])} {t(r['actor'])} {'dry-run' if r['dry_run'] else 'apply'} {t(r['stage'])} "
            f"{t(r['action'])} {t(r['decision'])} {t(r['target'])}: {t(r['reason'])}"
            + (f" -> {t(r['result'])}" if r["result"] else "") for r in rows) or "(empty)")
