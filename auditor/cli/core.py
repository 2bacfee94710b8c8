"""Core commands: collect, audit, run, demo."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from auditor.cli.app import App, check_time, long_window_option, pass_app, time_option, window
from auditor.cli.progress import audit_progress, collect_progress
from auditor.errors import EXIT_ERROR, EXIT_PARTIAL, GpuAuditError


def source_line(r: Any) -> str:
    """One collected source in one line (an ok one's notes below it): what the daemon logs, the command
    prints."""
    if not r.ok:
        return f"{r.cluster} {r.source}: FAILED: {r.error}"
    if r.warning:
        line = f"{r.cluster} {r.source}: WARNING: {r.warning}"
    else:
        other = ", ".join(f"{k} {v}" for k, v in r.stats.items() if v and k not in ("allocations", "buckets"))
        line = (f"{r.cluster} {r.source}: ok ({r.stats.get('allocations', 0)} allocations, "
                f"{r.stats.get('buckets', 0)} buckets, {r.skipped} bad records skipped{'; ' + other if other else ''};"
                f" {r.seconds:.1f} s)")
    return line + "".join(f"\n  note: {n}" for n in r.notes)


def _sources(clusters: list[Any]) -> int:
    return sum(len(c.allocations) + len(c.telemetry) for c in clusters)


def _hours(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.1f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.0f}%"


def headline(summary: dict[str, Any]) -> str:
    """The demo/audit headline: reserved vs effective vs idle, GPU-Util vs SM activity, findings."""
    cur = summary.get("currency", "")
    cpe = summary.get("cost_per_effective_gpu_hour")
    lines = [
        f"Reserved GPU-hours:   {_hours(summary['reserved_gpu_hours'])}  (cost {summary['reserved_cost']:,.2f} {cur})",
        f"Effective GPU-hours:  {_hours(summary['effective_gpu_hours'])}  (SM-activity weighted; cost per effective"
        f" GPU-hour {'n/a' if cpe is None else f'{cpe:,.2f}'} {cur})",
        f"Idle GPU-hours:       {_hours(summary['idle_gpu_hours'])}  (of which mirage "
        f"{_hours(summary['mirage_gpu_hours'])}; cost {summary['idle_cost']:,.2f} {cur})",
        *([f"Idle reservations:    {_hours(summary['idle_reservation_gpu_hours'])}  (GPU-hours no job used; cost "
           f"{summary.get('idle_reservation_cost', 0.0):,.2f} {cur}; not in the idle GPU-hours above)"]
          if summary.get("idle_reservation_gpu_hours") else []),
        f"Unknown GPU-hours:    {_hours(summary['unknown_gpu_hours'])}  (no telemetry: never counted as idle)",
        *([f"Infrastructure GPU-hours: {_hours(summary['infra_gpu_hours'])}  (faulty or drained nodes: never idle, "
           f"cost {summary.get('infra_cost', 0.0):,.2f} {cur})"] if summary.get("infra_gpu_hours") else []),
        f"Verified by SM activity: {_hours(summary.get('verified_gpu_hours'))} GPU-h; stock counters: "
        f"{_hours(summary.get('counters_gpu_hours'))} GPU-h (busy-by-counters "
        f"{_hours(summary.get('busy_by_counters_gpu_hours'))}, engine spin "
        f"{_hours(summary.get('engine_spin_gpu_hours'))}, idle-by-counters "
        f"{_hours(summary.get('idle_by_counters_gpu_hours'))}); GPU-Util only: "
        f"{_hours(summary.get('util_only_gpu_hours'))} GPU-h (busy-unverified "
        f"{_hours(summary.get('busy_unverified_gpu_hours'))}, idle-by-util "
        f"{_hours(summary.get('idle_by_util_gpu_hours'))}); coverage {_pct(summary.get('coverage'))}",
        *([f"Advice: {summary['advice']}."] if summary.get("advice") else []),
        f"The dashboard said {_pct(summary['mean_gpu_util'])} busy (GPU-Util); SM activity says "
        f"{_pct(summary['mean_sm_active'])}.",
        *_queue_line(summary),
        "Findings: " + (", ".join(f"{k} {v}" for k, v in summary.get("findings", {}).items()) or "none"),
    ]
    return "\n".join(lines)


def _queue_line(summary: dict[str, Any]) -> list[str]:
    """Opportunity cost: idle GPU-hours while GPU jobs of the same partition waited (when any waited)."""
    q = (summary.get("opportunity") or {}).get("idle_while_queued") or {}
    rows = q.get("by_cluster") or []
    if not q.get("waiting_jobs"):
        return []
    idle = sum(r["idle_gpu_hours"] for r in rows)
    jobs, waited = sum(r["waiting_jobs"] for r in rows), sum(r["waiting_gpu_hours"] for r in rows)
    n = q["waiting_jobs"]
    return [f"Idle while GPU jobs waited: {_hours(idle)} GPU-h while {_jobs(jobs)} waited for {_hours(waited)} GPU-h "
            f"({_jobs(n, 'GPU job')} waited in all, for {_hours(q.get('waiting_gpu_hours'))} GPU-h)"]


def _jobs(n: int, word: str = "job") -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def register(main: click.Group) -> None:
    @main.command()
    @click.option("--cluster", "clusters", multiple=True, help="Only this cluster (repeatable).")
    @time_option("--since", "Re-read from this time instead of the watermark (backfill).")
    @time_option("--until", "Read up to this time (default now).")
    @click.option("--parallel", type=click.IntRange(0, 256), default=None, metavar="N",
                  help="Collect N clusters at once, each in a worker process (0: one per cluster up to the CPU "
                       "count; 1: one after another; default: collect.parallel).")
    @pass_app
    def collect(app: App, clusters: tuple[str, ...], since: str | None, until: str | None,
                parallel: int | None) -> None:
        """Read allocations and telemetry from every configured source into the store. Exit 0 ok, 1 every
        source failed, 3 partial (some failed, the others were stored)."""
        from auditor.collect import chosen_clusters, has_sources
        from auditor.collect import collect as do_collect
        from auditor.timeutil import parse_time

        try:
            s = check_time(parse_time(since), "--since") if since else None
            u = check_time(parse_time(until), "--until") if until else None
        except ValueError as exc:
            raise GpuAuditError(str(exc)) from None
        chosen = chosen_clusters(app.cfg, list(clusters) or None)
        if not has_sources(chosen):  # before the store is created
            raise GpuAuditError(f"nothing to collect: no sources configured ({app.origin})")
        store = app.store(create=True)
        with collect_progress(app.as_json, _sources(chosen)) as progress:
            summary = do_collect(store, app.cfg, base_dir=app.base_dir, clusters=list(clusters) or None,
                                 since=s, until=u, progress=progress, parallel=parallel)
        app.emit(summary.as_dict(), lambda: "\n".join(source_line(r) for r in summary.results))
        if not summary.ok:
            raise click.exceptions.Exit(EXIT_ERROR if not any(r.ok for r in summary.results) else EXIT_PARTIAL)

    @main.command()
    @time_option("--since", "Audit window start (default: report.days ago).")
    @time_option("--until", "Audit window end (default: now).")
    @click.option("--cluster", "clusters", multiple=True, help="Only this cluster (repeatable).")
    @long_window_option
    @pass_app
    def audit(app: App, since: str | None, until: str | None, clusters: tuple[str, ...], long_window: bool) -> None:
        """Judge every reserved GPU-interval in the window and store usage and findings."""
        s, u = window(app, since, until, long_window=long_window)
        from auditor.audit.run import run_audit

        store = app.store()
        with audit_progress(app.as_json):
            result = run_audit(store, app.cfg, s, u, clusters=list(clusters) or None)
        app.emit({"run_id": result.run_id, "since": s.isoformat(), "until": u.isoformat(), **result.summary},
                 lambda: f"audit run {result.run_id}: {s:%Y-%m-%d %H:%M} .. {u:%Y-%m-%d %H:%M} UTC\n"
                 + headline(result.summary))

    from auditor.daemon.steps import STEPS

    @main.command()
    @click.option("--steps", default="collect,audit,report", show_default=True,
                  help=f"Comma-separated steps, run in this order: {', '.join(STEPS)}.")
    @time_option("--since", "Audit window start (default: report.days ago).")
    @time_option("--until", "Audit window end (default: now).")
    @click.option("--dry-run", is_flag=True, help="notify writes .eml files instead of sending.")
    @click.option("--out", type=click.Path(file_okay=False), help="Output directory (default report.out_dir).")
    @long_window_option
    @pass_app
    def run(app: App, steps: str, since: str | None, until: str | None, dry_run: bool, out: str | None,
            long_window: bool) -> None:
        """Run the steps once (for system cron or a Kubernetes CronJob). Exit 0 ok, 1 a step failed,
        3 partial (some cluster sources failed)."""
        from auditor.daemon.pipeline import parse_steps, run_steps

        s, u = window(app, since, until, long_window=long_window)
        summary = run_steps(app.store(), app.cfg, parse_steps(steps), base_dir=app.base_dir, since=s, until=u,
                            dry_run=dry_run, out_dir=Path(out) if out else None)
        app.emit(summary.as_dict(), lambda: "\n".join(
            f"{st.name}: {'ok' if st.ok else 'FAILED: ' + st.error} ({st.seconds:.1f}s)" for st in summary.steps))
        if summary.exit_code:
            raise click.exceptions.Exit(summary.exit_code)

    @main.command()
    @click.option("--out", default="gpu-audit-demo", show_default=True, type=click.Path(file_okay=False),
                  help="Directory for the demo's input files, store and reports.")
    @click.option("--store", "store_url", default=None, help="Store URL (default: SQLite file in --out).")
    @time_option("--now", "Pretend it is this time (the week ends here).")
    @click.option("--seed", default=7, show_default=True, help="Random seed of the simulated telemetry.")
    @click.option("--telemetry", default="dcgm", show_default=True, type=click.Choice(["dcgm", "util-only"]),
                  help="dcgm: profiling fields on; util-only: the same week as a site whose exporter has only "
                       "GPU-Util, memory and power (busy time then shows as busy-unverified).")
    @click.option("--fresh", is_flag=True, help="Start over when --out already holds a demo store: delete it "
                  "and its reports (without it, such a directory is refused).")
    @pass_app
    def demo(app: App, out: str, store_url: str | None, now: str | None, seed: int, telemetry: str,
             fresh: bool) -> None:
        """Simulate a week of a small mixed fleet, collect it through the file connectors, audit, report."""
        from auditor.demo import fleet_line
        from auditor.demo_run import run_demo
        from auditor.timeutil import parse_time

        try:
            when = check_time(parse_time(now), "--now") if now else None
        except ValueError as exc:
            raise GpuAuditError(str(exc)) from None
        run = run_demo(Path(out), now=when, seed=seed, store_url=store_url, telemetry=telemetry, fresh=fresh,
                       collecting=lambda cfg: collect_progress(app.as_json, _sources(cfg.clusters)),
                       auditing=lambda: audit_progress(app.as_json))
        data, start, end, files, cfg_path, seconds = (run.as_dict(), run.start, run.end, run.reports, run.config,
                                                      run.seconds)
        app.emit(data, lambda: f"gpu-audit demo: a simulated week ({start:%Y-%m-%d} .. {end:%Y-%m-%d}) of "
                 f"{fleet_line()}\n\n" + headline(run.summary)
                 + ("\n\nReports: " + ", ".join(files) if files else "")
                 + f"\nConfig for further commands: gpu-audit -c {cfg_path} report ...   ({seconds:.1f}s)")
