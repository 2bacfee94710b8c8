"""CLI commands for money: ``chargeback`` (files for finance) and ``what-if`` (re-judge with other
thresholds). Registered by :mod:`auditor.cli` through ``register(group)``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from auditor.errors import GpuAuditError


def register(group: click.Group) -> None:
    from auditor.cli.app import App, pass_app, time_option, window

    @group.command()
    @click.option("--period", default=None, metavar="YYYY-MM",
                  help="Calendar month in report.timezone, e.g. 2026-11 (instead of --since/--until).")
    @time_option("--since", "Window start (default: report.days ago).")
    @time_option("--until", "Window end (default: now).")
    @click.option("--by", type=click.Choice(["account", "namespace", "team", "user", "cluster", "qos", "state"]),
                  default="account", show_default=True, help="Owner column of each row (qos: Slurm QOS or "
                  "Kubernetes priority class; state: scheduler state such as COMPLETED or RUNNING).")
    @click.option("--format", "fmt", type=click.Choice(["csv", "json"]), default="csv", show_default=True,
                  help="File format.")
    @click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
                  help="Write to this file (atomically) instead of standard output.")
    @pass_app
    def chargeback(app: App, period: str | None, since: str | None, until: str | None, by: str, fmt: str,
                   out: str | None) -> None:
        """One row per period x cluster x owner: reserved, effective, idle, mirage, low, working and unknown
        GPU-hours and their cost, reconciled with an audit of the same window."""
        from auditor.report import chargeback as cb

        if period and (since or until):
            raise GpuAuditError("--period and --since/--until exclude each other")
        if period:
            s, u = cb.month_window(period, cb.report_tz(app.cfg))
        else:
            s, u = window(app, since, until)
        rows = cb.chargeback(app.store(), app.cfg, s, u, by, period=period)
        kw = {"since": s, "until": u, "by": by, "period": period, "currency": app.cfg.prices.currency}
        if out:
            path = cb.write(rows, Path(out), fmt, **kw)
            app.emit({"file": str(path), "rows": len(rows)}, f"wrote {len(rows)} rows to {path}")
        else:
            sys.stdout.write(cb.to_csv(rows) if fmt == "csv" else cb.to_json(rows, **kw))

    @group.command("what-if")
    @click.argument("overrides", metavar="K=V,...")
    @time_option("--since", "Window start (default: report.days ago).")
    @time_option("--until", "Window end (default: now).")
    @pass_app
    def what_if_cmd(app: App, overrides: str, since: str | None, until: str | None) -> None:
        """Re-judge stored history with other thresholds (e.g. idle_sm=0.1,episode=1h) and print what would
        change: flagged allocations and GPU-hours per finding kind. Nothing is collected."""
        from auditor.audit.whatif import format_diff, what_if

        s, u = window(app, since, until)
        diff = what_if(app.store(), app.cfg, s, u, overrides)
        app.emit(diff, lambda: format_diff(diff))
