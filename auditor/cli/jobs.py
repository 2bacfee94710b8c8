"""``gpu-audit job`` and ``gpu-audit jobs``: one allocation, or a user's allocations (thin over
:mod:`auditor.report.jobview`; ``--json`` prints the library's dict)."""

from __future__ import annotations

from typing import Any

import click

from auditor.cli.app import App, pass_app, time_option, window
from auditor.logs import log_safe
from auditor.report.render import fmt_hours, fmt_money, fmt_pct, shorten

METRIC_NAMES = {"sm_active": "SM activity", "tensor_active": "Tensor activity", "dram_active": "DRAM activity",
                "gpu_util": "GPU-Util", "fb_used_mib": "Memory used", "power_w": "Power"}
LEGEND = ("\u2588 working  \u2584 low  _ idle  ! mirage (GPU-Util busy, SMs idle)  f idle by GPU-Util  "
          "? no data")


def _s(value: Any, limit: int = 48) -> str:
    """User text for the terminal: escaped by the one function for that (:func:`auditor.logs.log_safe`),
    then shortened to fit the layout."""
    return shorten(None if value is None else log_safe(value), limit)


def _metric(name: str, v: float | None) -> str:
    if v is None:
        return "n/a"
    if name == "fb_used_mib":
        return f"{v / 1024:,.1f} GiB"
    if name == "power_w":
        return f"{v:,.0f} W"
    return fmt_pct(v)


def stopped_text(x: dict[str, Any]) -> str:
    return f"{x['when']} (stopped by gpu-audit: {x['action']} {_s(x['target'], 60)})"


def format_job(v: dict[str, Any]) -> str:
    """The job as a terminal page: header, money, per-GPU time line and metrics, findings."""
    cur = v["currency"]
    lines = [f"{v['source']} job {_s(v['id'], 40)} \"{_s(v['name'])}\" on {_s(v['cluster'], 32)}",
             f"  user {_s(v['user'], 32)}, account {_s(v['account'], 32)}, "
             f"team {_s(v['team'] or '-', 32)}",
             f"  {_s(v['state'] or '?', 32)}: {v['start'] or 'not started'} to "
             f"{v['end'] or (stopped_text(v['stopped']) if v.get('stopped') else 'now (still running)')}"
             + (f" ({fmt_hours(v['hours_held'])} h)" if v["hours_held"] is not None else "")
             + f", {v['gpu_count']:g} GPU(s)"]
    u = v["usage"]
    if u:
        lines.append(f"  reserved {fmt_hours(u['reserved_gpu_hours'])} GPU-h ({fmt_money(v['reserved_cost'], cur)}), "
                     f"idle {fmt_hours(u['idle_gpu_hours'] + u['mirage_gpu_hours'])} GPU-h "
                     f"({fmt_money(v['idle_cost'], cur)}), effective {fmt_hours(u['effective_gpu_hours'])} GPU-h, "
                     f"unknown {fmt_hours(u['unknown_gpu_hours'])} GPU-h; coverage {fmt_pct(u['coverage'])}")
        lines.append(f"  judged by audit run {v['run_id']} ({v['run']['since']} to {v['run']['until']})")
    else:
        lines.append("  not audited yet: no hours or cost (run `gpu-audit audit`); time line from telemetry")
    if v["running"]:
        lines.append("  STILL RUNNING: it holds its GPUs now.")
    for x in v.get("actions") or []:
        lines.append(f"  gpu-audit {x['when']}: {x['stage']} {x['action']} {x['decision']}"
                     f"{' (dry run)' if x['dry_run'] else ''}: {_s(x['target'], 60)}"
                     + (f" -> {_s(x['result'], 80)}" if x["result"] else ""))
    for g in v["gpus"]:
        t = g["timeline"]
        lines += ["", f"GPU {g['gpu_index'] if g['gpu_index'] is not None else '?'} on {_s(g['node'], 40)}"
                  f" ({g['attribution']}{', ' + g['signal'] if g.get('signal') else ''}): coverage "
                  f"{fmt_pct(g['coverage'])}",
                  f"  verdict |{t['line']}|  ({t['bins']} bins of {t['bin_s'] / 60:.0f} min)",
                  f"  SM      |{t['spark']}|"]
        lines.append(f"  {'':<16}{'mean':>10}{'peak':>10}")
        lines += [f"  {METRIC_NAMES[m]:<16}{_metric(m, s['mean']):>10}{_metric(m, s['peak']):>10}"
                  for m, s in g["metrics"].items()]
    if v["gpus"]:
        lines += ["", "  " + LEGEND]
    lines += ["", "FINDINGS" if v["findings"] else "No findings."]
    for f in v["findings"]:
        lines += [f"  {f['kind']}: {fmt_hours(f['idle_gpu_hours'])} idle GPU-h of {fmt_hours(f['gpu_hours'])}, "
                  f"{fmt_money(f['cost'], cur)}",
                  f"    why: {f['rule']}" + (f"; {f['hint']}" if f["hint"] else ""),
                  f"    what to do: {f['advice']}"]
    if v["other_matches"]:
        lines += ["", f"({len(v['other_matches'])} older allocations match the same name; this is the newest)"]
    return "\n".join(lines)


def format_jobs(rows: list[dict[str, Any]], currency: str) -> str:
    if not rows:
        return "No allocations in that window."
    out = [f"{'JOB':<28} {'STATE':<10} {'START':<21} {'GPUS':>5} {'RES GPU-H':>10} {'IDLE GPU-H':>10} "
           f"{'IDLE COST':>12}  NAME"]
    for r in rows:
        out.append(f"{_s(r['ref'], 28):<28} {_s(r['state'], 10):<10} {r['start'] or '':<21} "
                   f"{r['gpus']:>5g} {fmt_hours(r['reserved_gpu_hours']):>10} {fmt_hours(r['idle_gpu_hours']):>10} "
                   f"{fmt_money(r['idle_cost'], currency):>12}  {_s(r['name'], 40)}")
    return "\n".join(out)


def register(main: click.Group) -> None:
    @main.command()
    @click.argument("ref")
    @click.option("--run", "run_id", type=int, default=None, help="Audit run to take hours and cost from "
                  "[default: the newest official run that judged the allocation].")
    @pass_app
    def job(app: App, ref: str, run_id: int | None) -> None:
        """One allocation. REF is a bare job id (1234, an array task 1234_5) or pod UID where one cluster has
        it, CLUSTER:JOBID, CLUSTER:POD-UID, or CLUSTER:NAMESPACE/POD (k8s:NAMESPACE/POD)."""
        from auditor.report.jobview import job_view

        v = job_view(app.store(), app.cfg, ref, run_id=run_id)
        app.emit(v, lambda: format_job(v))

    @main.command()
    @click.option("--user", "user", required=True, help="User whose allocations to list.")
    @time_option("--since", "Start of the window [default: report.days ago].")
    @time_option("--until", "End of the window [default: now].")
    @click.option("--cluster", default=None, help="Only this cluster.")
    @pass_app
    def jobs(app: App, user: str, since: str | None, until: str | None, cluster: str | None) -> None:
        """A user's allocations in a window, newest first, with their audited idle hours and cost."""
        from auditor.report.jobview import jobs_list

        start, end = window(app, since, until)
        rows = jobs_list(app.store(), app.cfg, user=user, since=start, until=end, cluster=cluster)
        app.emit({"user": user, "since": start.isoformat(), "until": end.isoformat(), "jobs": rows},
                 lambda: format_jobs(rows, app.cfg.prices.currency))
