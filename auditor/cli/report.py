"""`gpu-audit report` and `gpu-audit notify`: render an audit run, and send it (or nudges) by email."""

from __future__ import annotations

from pathlib import Path

import click

from auditor.cli.app import App, pass_app, time_option, window
from auditor.errors import GpuAuditError


def _run_id(app: App, run: int | None, since: str | None, until: str | None) -> int:
    """--run, else the newest ok run inside --since/--until, else the run the web pages show (the latest
    weekly audit: a chargeback run made since does not take its place)."""
    from auditor.report import context as report

    if run is not None:
        return run
    if since or until:
        s, u = window(app, since, until)
        return report.run_for_window(app.store(), s, u)
    return int(report.shown_run(app.store(), app.cfg)["id"])


def register(group: click.Group) -> None:
    @group.command("report")
    @click.option("--format", "formats", multiple=True, type=click.Choice(["html", "text", "md", "json"]),
                  help="Output format (repeatable; default: all four). A findings CSV is always written.")
    @click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                  help="Directory for the files (default: report.out_dir).")
    @click.option("--run", "run", type=int, default=None,
                  help="Audit run id (default: the latest weekly audit, as the web UI shows).")
    @time_option("--since", "Use the newest ok audit run whose window starts at or after this.")
    @time_option("--until", "...and ends at or before this (default now).")
    @pass_app
    def report_cmd(app: App, formats: tuple[str, ...], out_dir: Path | None, run: int | None,
                   since: str | None, until: str | None) -> None:
        """Write the weekly report of an audit run as HTML, text, Markdown and JSON (+ findings CSV)."""
        from auditor.report.render import FORMATS, write_reports

        run_id = _run_id(app, run, since, until)
        out = out_dir or app.cfg.report.out_dir
        paths = write_reports(app.store(), app.cfg, run_id, out, list(formats) or list(FORMATS))
        app.emit({"run_id": run_id, "files": [str(p) for p in paths]},
                 lambda: f"report of audit run {run_id}:\n" + "\n".join(f"  {p}" for p in paths))

    @group.command("notify")
    @click.option("--dry-run", is_flag=True, help="Write each message as an .eml file instead of sending.")
    @click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                  help="Where --dry-run writes .eml files (default: <report.out_dir>/outbox).")
    @click.option("--run", "run", type=int, default=None,
                  help="Audit run id (default: the latest weekly audit, as the web UI shows).")
    @click.option("--admin/--no-admin", default=True, show_default=True,
                  help="Send the weekly report to email.admin_to.")
    @click.option("--teams/--no-teams", default=True, show_default=True,
                  help="Nudge each team (teams[].emails) about its idle allocations.")
    @click.option("--users/--no-users", default=True, show_default=True,
                  help="Nudge each user (user@email.user_domain) about their idle allocations.")
    @pass_app
    def notify_cmd(app: App, dry_run: bool, out_dir: Path | None, run: int | None, admin: bool, teams: bool,
                   users: bool) -> None:
        """Email the admin report and per-team / per-user nudges (throttled; see docs/reports.md)."""
        from auditor.report.notify import notify

        run_id = _run_id(app, run, None, None)
        if not (admin or teams or users):
            raise GpuAuditError("nothing to send: --no-admin, --no-teams and --no-users all given")
        out = out_dir or Path(app.cfg.report.out_dir) / "outbox"
        res = notify(app.store(), app.cfg, run_id, dry_run=dry_run, out_dir=out, admin=admin, teams=teams,
                     users=users)

        def human() -> str:
            verb = "wrote" if dry_run else "sent"
            lines = [f"audit run {run_id}: {verb} {len(res['sent'])} message(s), skipped {len(res['skipped'])}"]
            lines += [f"  {verb} {m['kind']} to {m['to']}" + (f" -> {m['file']}" if m.get("file") else "")
                      for m in res["sent"]]
            lines += [f"  skipped {m['kind']} to {m['to'] or '-'}: {m['reason']}" for m in res["skipped"]]
            return "\n".join(lines)

        app.emit({"run_id": run_id, "dry_run": dry_run, **res}, human)
