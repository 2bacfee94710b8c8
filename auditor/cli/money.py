"""CLI commands for money: ``chargeback`` (files for finance) and ``what-if`` (re-judge with other
thresholds). Registered by :mod:`auditor.cli` through ``register(group)``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from auditor.errors import GpuAuditError


def money_window(app: Any, period: str | None, since: str | None, until: str | None,
                 long_window: bool | None = None) -> tuple[Any, Any]:
    """The window of a money command: ``--period`` (a calendar month in report.timezone) or
    ``--since/--until``, never both."""
    from auditor.cli.app import window
    from auditor.report import chargeback as cb

    if period and (since or until):
        raise GpuAuditError("--period and --since/--until exclude each other")
    if period:
        return cb.month_window(period, cb.report_tz(app.cfg))
    return window(app, since, until, long_window=long_window)


def report_window(app: Any) -> tuple[Any, Any, int, str] | None:
    """The window of the run the report shows (:func:`auditor.report.context.shown_run`, the one rule):
    (since, until, run id, its kind), or None when the store holds no audit run yet. A money command given
    no window takes this one, so its totals are the report's (a window ending "now" was another figure)."""
    from datetime import UTC, datetime

    from auditor.report.context import load_run, run_kind, shown_run

    store = app.store()
    try:
        rid = shown_run(store, app.cfg)["id"]
    except GpuAuditError:
        return None
    with store.engine.connect() as conn:
        run = load_run(conn, rid)
    kind = run_kind(run["since_ts"], run["until_ts"], (run["summary"] or {}).get("purpose"), app.cfg)
    return (datetime.fromtimestamp(run["since_ts"], UTC), datetime.fromtimestamp(run["until_ts"], UTC), int(rid),
            kind)


def register(group: click.Group) -> None:
    from auditor.cli.app import App, long_window_option, pass_app, time_option, window

    @group.command()
    @click.option("--period", default=None, metavar="YYYY-MM",
                  help="Calendar month in report.timezone, e.g. 2026-11 (instead of --since/--until).")
    @time_option("--since", "Window start (default: the window of the run the report shows, else report.days "
                 "ago).")
    @time_option("--until", "Window end (default: the report's run's end, else now).")
    @click.option("--by", type=click.Choice(["account", "namespace", "team", "user", "cluster", "qos", "state"]),
                  default="account", show_default=True, help="Owner column of each row (qos: Slurm QOS or "
                  "Kubernetes priority class; state: scheduler state such as COMPLETED or RUNNING).")
    @click.option("--format", "fmt", type=click.Choice(["csv", "json"]), default="csv", show_default=True,
                  help="File format.")
    @click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
                  help="Write to this file (atomically) instead of standard output.")
    @long_window_option
    @pass_app
    def chargeback(app: App, period: str | None, since: str | None, until: str | None, by: str, fmt: str,
                   out: str | None, long_window: bool) -> None:
        """One row per period x cluster x owner: reserved, effective, idle, mirage, low, working and unknown
        GPU-hours and their cost, reconciled with an audit of the same window."""
        from auditor.report import chargeback as cb

        shown = None if (period or since or until) else report_window(app)
        if shown is not None:  # the report's window and its run: the report's figures, never a new "now"
            s, u, rid, kind = shown
            rows = cb.chargeback(app.store(), app.cfg, s, u, by, run_id=rid)
            click.echo(f"chargeback window: {s.isoformat()} to {u.isoformat()} (audit run {rid}, {kind}, the "
                       "report's; --since/--until or --period for another)", err=True)
        else:
            s, u = money_window(app, period, since, until, long_window)
            rows = cb.chargeback(app.store(), app.cfg, s, u, by, period=period)
            if not (period or since or until):
                click.echo(f"chargeback window: {s.isoformat()} to {u.isoformat()} (report.days to now: no audit "
                           "run in the store yet)", err=True)
        kw = {"since": s, "until": u, "by": by, "period": period, "currency": app.cfg.prices.currency}
        if out:
            path = cb.write(rows, Path(out), fmt, **kw)
            app.emit({"file": str(path), "rows": len(rows)}, f"wrote {len(rows)} rows to {path}")
        else:
            sys.stdout.write(cb.to_csv(rows) if fmt == "csv" else cb.to_json(rows, **kw))

    @group.command("export")
    @click.option("--out", "out", type=click.Path(file_okay=False), required=True,
                  help="Root directory of the fleet export (created; several stores may export into one root).")
    @click.option("--period", default=None, metavar="YYYY-MM",
                  help="Calendar month in report.timezone, e.g. 2026-11 (instead of --since/--until).")
    @time_option("--since", "Window start (default: report.days ago).")
    @time_option("--until", "Window end (default: now).")
    @long_window_option
    @pass_app
    def export_cmd(app: App, out: str, period: str | None, since: str | None, until: str | None,
                   long_window: bool) -> None:
        """Write the window as Parquet for the data tools (chargeback, per-allocation usage with FinOps FOCUS
        columns, allocations), partitioned by cluster and week under OUT (docs/fleet-export.md)."""
        from auditor.report import fleet

        s, u = money_window(app, period, since, until, long_window)
        res = fleet.export(app.store(), app.cfg, Path(out), s, u, period=period)
        app.emit(res, f"wrote {len(res['files'])} Parquet files for {len(res['clusters'])} cluster(s), week "
                      f"{res['week']}, under {res['out']} ({res['rows']['usage']} allocations)")

    @group.command("what-if")
    @click.argument("overrides", metavar="K=V,...")
    @time_option("--since", "Window start (default: report.days ago).")
    @time_option("--until", "Window end (default: now).")
    @long_window_option
    @pass_app
    def what_if_cmd(app: App, overrides: str, since: str | None, until: str | None, long_window: bool) -> None:
        """Re-judge stored history with other thresholds (e.g. idle_sm=0.1,episode=1h) and print what would
        change: flagged allocations and GPU-hours per finding kind. Nothing is collected."""
        from auditor.audit.whatif import format_diff, what_if

        s, u = window(app, since, until, long_window=long_window)
        diff = what_if(app.store(), app.cfg, s, u, overrides)
        app.emit(diff, lambda: format_diff(diff))
