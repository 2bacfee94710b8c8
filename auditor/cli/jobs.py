"""``gpu-audit job`` and ``gpu-audit jobs``: one allocation, or a user's allocations (thin over
:mod:`auditor.report.jobview`; ``--json`` prints the library's dict)."""

from __future__ import annotations

from typing import Any

import click

from auditor.cli.app import App, pass_app, time_option, window
from auditor.logs import log_safe


# the report's formatting, imported on first use: `gpu-audit --help` imports this module, not the report
def shorten(value: Any, limit: int = 48) -> str:
    from auditor.report.render import shorten as f

    return f(value, limit)


def fmt_hours(v: float | None) -> str:
    from auditor.report.render import fmt_hours as f

    return f(v)


def fmt_pct(v: float | None) -> str:
    from auditor.report.render import fmt_pct as f

    return f(v)


def fmt_money(v: float | None, currency: str = "") -> str:
    from auditor.report.render import fmt_money as f

    return f(v, currency)


LEGEND = ("\u2588 working  \u2584 low  _ idle  ! mirage (GPU-Util busy, SMs idle)  f idle by GPU-Util  "
          "? no data")
SPARK_SCALE = "\u2581 0% to \u2588 100%, ? no data"


def _s(value: Any, limit: int = 48) -> str:
    """User text for the terminal: escaped by the one function for that (:func:`auditor.logs.log_safe`),
    then shortened to fit the layout."""
    return shorten(None if value is None else log_safe(value), limit)


def stopped_text(x: dict[str, Any]) -> str:
    return f"{x['when']} (stopped by gpu-audit: {x['action']} {_s(x['target'], 60)})"


def _limit(v: dict[str, Any]) -> str:
    """``time limit 144.0 h, used 97 % of it`` (jobstats' "used N% of its time limit")."""
    if not v.get("time_limit_s"):
        return "time limit not known"
    used = v.get("time_limit_used")
    return (f"time limit {fmt_hours(v['time_limit_s'] / 3600)} h"
            + (f", used {fmt_pct(used)} of its time limit" if used is not None else ""))


def _nodes(nodes: list[str], limit: int = 8) -> str:
    if not nodes:
        return "no node known"
    shown = ", ".join(_s(n, 40) for n in nodes[:limit])
    return f"node{'s' if len(nodes) > 1 else ''} {shown}" + (f" and {len(nodes) - limit} more"
                                                             if len(nodes) > limit else "")


def _host(v: dict[str, Any]) -> str:
    """CPU efficiency, host memory and exit code, or "not collected" where the store has none."""
    cpu = (f"{fmt_pct(v['cpu_efficiency'])} of {v['cpus']} CPU(s)" if v.get("cpu_efficiency") is not None
           else "not collected")
    mem = (f"{v['host_memory_bytes'] / 2**30:,.1f} GiB" if v.get("host_memory_bytes") is not None
           else "not collected")
    code = _s(v["exit_code"], 16) if v.get("exit_code") not in (None, "") else "not collected"
    return f"  CPU efficiency {cpu}; host memory {mem}; exit code {code}"


GPU_HEAD = f"  {'GPU':>3} {'NODE':<16} {'IDX':>3} {'UTIL':>5} {'SM':>5} {'TENSOR':>6} {'DRAM':>5} {'MEM GiB':>8} " \
           f"{'COVER':>5} "


def _gib(v: float | None) -> str:
    return "n/a" if v is None else f"{v / 1024:,.1f}"


def gpu_rows(v: dict[str, Any]) -> list[str]:
    """One line per GPU: means of GPU-Util, SM, Tensor and DRAM activity, peak memory, coverage and the
    verdict of each time bin; then the SM activity sparkline of each GPU (jobstats' per-GPU lines)."""
    gpus = v["gpus"]
    if not gpus:
        return ["", "No GPUs recorded for this allocation."]
    t0 = gpus[0]["timeline"]
    out = ["", GPU_HEAD + f" VERDICT PER TIME BIN ({t0['bins']} x {t0['bin_s'] / 60:.0f} min)"]
    for n, g in enumerate(gpus):
        m = g["metrics"]
        idx = g["gpu_index"] if g["gpu_index"] is not None else "?"
        out.append(f"  {n:>3} {_s(g['node'], 16):<16} {idx!s:>3} {fmt_pct(m['gpu_util']['mean']):>5} "
                   f"{fmt_pct(m['sm_active']['mean']):>5} {fmt_pct(m['tensor_active']['mean']):>6} "
                   f"{fmt_pct(m['dram_active']['mean']):>5} {_gib(m['fb_used_mib']['peak']):>8} "
                   f"{fmt_pct(g['coverage']):>5} |{g['timeline']['line']}|")
    pad = len(GPU_HEAD) - 6
    for n, g in enumerate(gpus):
        label = f"SM activity ({SPARK_SCALE})" if n == 0 else ""
        out.append(f"  {n:>3} {label:<{pad}}|{g['timeline']['spark']}|")
    ticks = v.get("axis") or []
    if len(ticks) > 1:
        first, last = ticks[0]["label"] or "", ticks[-1]["label"] or ""
        width = len(t0["line"])
        gap = width - len(first) - len(last)
        out.append(f"  {'':>3} {'time':>{pad - 1}}  " + (first + " " * gap + last if gap >= 1 else first[:width]))
    out += ["", "  " + LEGEND, "  UTIL, SM, TENSOR, DRAM: means over the job; MEM: peak GPU memory used; "
            "COVER: share of the reserved time with samples"]
    return out


def format_job(v: dict[str, Any]) -> str:
    """The job as a terminal page, jobstats-like: the verdict first, a short header, one line per GPU, the
    findings and what to do."""
    cur = v["currency"]
    lines = [f"{_s(v['verdict']['text'], 200)}", "",
             f"{v['source']} job {_s(v['id'], 40)} \"{_s(v['name'])}\" on {_s(v['cluster'], 32)}: user "
             f"{_s(v['user'], 32)}, account {_s(v['account'], 32)}, team {_s(v['team'] or '-', 32)}",
             f"  partition {_s(v['partition'] or '-', 32)}, QOS {_s(v['qos'] or '-', 32)}, "
             f"state {_s(v['state'] or '?', 32)}, {_limit(v)}",
             f"  {v['start'] or 'not started'} to "
             f"{v['end'] or (stopped_text(v['stopped']) if v.get('stopped') else 'now (still running)')}"
             + (f" ({fmt_hours(v['hours_held'])} h)" if v["hours_held"] is not None else "")
             + f", {v['gpu_count']:g} GPU(s) on {_nodes(v['nodes'])}",
             _host(v)]
    u = v["usage"]
    if u:
        lines.append(f"  reserved {fmt_hours(u['reserved_gpu_hours'])} GPU-h ({fmt_money(v['reserved_cost'], cur)}), "
                     f"idle {fmt_hours(u['idle_gpu_hours'] + u['mirage_gpu_hours'])} GPU-h "
                     f"({fmt_money(v['idle_cost'], cur)}), effective {fmt_hours(u['effective_gpu_hours'])} GPU-h, "
                     f"unknown {fmt_hours(u['unknown_gpu_hours'])} GPU-h; coverage {fmt_pct(u['coverage'])}; "
                     f"audit run {v['run_id']} ({v['run']['since']} to {v['run']['until']})")
    w = v.get("waiting")
    if w:  # where the waiting goes (docs/definitions.md): the class it waited on most, then every class
        parts = [f"{w['labels'][k]} {fmt_hours(h)}" for k, h in w["gpu_hours"].items() if h > 5e-7]
        lines.append("  waiting class: " + (f"mostly {w['main']['label'].lower()}" if w["main"] else "none (it did not "
                     "wait)") + (f"; GPU-h: {', '.join(parts)}" if parts else ""))
    r = v.get("run")
    if r:
        lines.append(f"  figures from audit run {r['id']} ({r['kind']}, {r['since']} to {r['until']}): "
                     f"{r['why']}{'' if u else '; it was not judged in that run'}")
    else:
        lines.append("  no audit run has judged it yet")
    if v["running"]:
        lines.append("  STILL RUNNING: it holds its GPUs now.")
    for x in v.get("actions") or []:
        lines.append(f"  gpu-audit {x['when']}: {x['stage']} {x['action']} {x['decision']}"
                     f"{' (dry run)' if x['dry_run'] else ''}: {_s(x['target'], 60)}"
                     + (f" -> {_s(x['result'], 80)}" if x["result"] else ""))
    if not v.get("actions"):
        lines.append("  no action taken by gpu-audit (warnings, cancellations)")
    lines += gpu_rows(v)
    lines += ["", "FINDINGS" if v["findings"] else "No findings."]
    for f in v["findings"]:
        lines += [f"  {f['kind']}: {fmt_hours(f['idle_gpu_hours'])} idle GPU-h of {fmt_hours(f['gpu_hours'])}, "
                  f"{fmt_money(f['cost'], cur)}",
                  f"    why: {f['rule']}" + (f"; {f['hint']}" if f["hint"] else ""),
                  f"    what to do: {f['advice']}"]
    runs = v.get("job_runs") or []
    if len(runs) > 1:  # a requeued job: every run, this one marked (``gpu-audit job`` shows the newest)
        lines += ["", f"RUNS of this job ({len(runs)}, each a requeue or restart under the same id), oldest first:"]
        for i, r in enumerate(runs, 1):
            figs = (f"{fmt_hours(r['reserved_gpu_hours'])} GPU-h reserved, {fmt_hours(r['idle_gpu_hours'])} idle"
                    if r["judged"] else "not judged in this audit run")
            lines.append(f"  {'*' if r['shown'] else ' '}{i}. {r['start'] or 'not started'} to {r['end'] or 'now'} "
                         f"{_s(r['state'] or '?', 16)}: {figs} (allocation {r['allocation_id']}; web "
                         f"/allocation/{r['allocation_id']})")
    if v["other_matches"]:
        lines += ["", f"({len(v['other_matches'])} older allocations match the same name; this is the newest)"]
    return "\n".join(lines)


def format_jobs(rows: list[dict[str, Any]], currency: str) -> str:
    """A user's allocations, one a line. REFs are printed whole (escaped, never shortened): they are meant to
    be pasted into ``gpu-audit job``."""
    if not rows:
        return "No allocations in that window."
    refs = [log_safe(r["ref"]) for r in rows]
    w = max(len("JOB"), *(len(x) for x in refs))
    out = [f"{'JOB':<{w}} {'STATE':<10} {'START':<21} {'GPUS':>5} {'RES GPU-H':>10} {'IDLE GPU-H':>10} "
           f"{'IDLE COST':>12}  NAME"]
    for ref, r in zip(refs, rows, strict=True):
        out.append(f"{ref:<{w}} {_s(r['state'], 10):<10} {r['start'] or '':<21} "
                   f"{r['gpus']:>5g} {fmt_hours(r['reserved_gpu_hours']):>10} {fmt_hours(r['idle_gpu_hours']):>10} "
                   f"{fmt_money(r['idle_cost'], currency):>12}  {_s(r['name'], 40)}")
    return "\n".join(out)


def register(main: click.Group) -> None:
    @main.command()
    @click.argument("ref")
    @click.option("--run", "run_id", type=int, default=None, help="Audit run to take hours and cost from "
                  "[default: the run the report and the web pages show (the latest weekly audit) among those "
                  "that judged the allocation].")
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
