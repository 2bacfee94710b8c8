"""One allocation, the way a user looks up their own job (like jobstats at Slurm sites): per-GPU verdict
time line, metric means and peaks, coverage, findings with why and what to do, reserved and idle cost.

Read-only. Hours and money come from the latest official audit run that judged the allocation
(``usage_allocation``/``usage_gpu``); the time line and the metrics are read from ``gpu_buckets`` so the
page also works before an audit. Used by ``gpu-audit job``, ``gpu-audit jobs`` and the web UI.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from auditor.audit import kinds, verdict
from auditor.config import Config, Thresholds
from auditor.errors import GpuAuditError
from auditor.report.context import (
    ADVICE,
    USAGE_SUMS,
    _tz,
    _usage_row,
    _when,
    job_ref,
    load_run,
    run_kind,
    run_rank,
    shown_run,
)
from auditor.report.render import fmt_hours, fmt_money, fmt_pct
from auditor.store.engine import Store
from auditor.timeutil import H, utcnow

BINS = 48
#: per time bin, the mean of these metrics (the SM bars and the GPU-Util line of the charts)
BIN_METRICS = {"sm": "sm_active", "util": "gpu_util"}
METRICS = ("sm_active", "tensor_active", "dram_active", "gpu_util", "fb_used_mib", "power_w")
# verdict codes as the one verdict definition numbers them (auditor.audit.verdict), and how a terminal draws them
VERDICTS = verdict.NAMES
GLYPH = {"working": "\u2588", "low": "\u2584", "idle": "_", "mirage": "!", "idle_by_util": "f",
         "busy_unverified": "~", "unknown": "?", None: "?",
         # the stock-counter tier (no SM activity): busy, idle, an engine spin
         "busy_by_counters": "\u2592", "idle_by_counters": "c", "engine_spin": "s"}
NO_DATA = "?"  # a time bin without samples, in the verdict strip and the sparklines (as the legend says)
SPARK = "\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"


def parse_ref(ref: str) -> dict[str, str | None]:
    """``CLUSTER:ID``, ``k8s:NAMESPACE/POD``, ``CLUSTER:NAMESPACE/POD`` or a bare ``ID`` -> a match."""
    ref = (ref or "").strip()
    cluster, ident = (ref.split(":", 1) if ":" in ref else (None, ref))
    source = None
    if cluster in ("k8s", "kubernetes"):
        cluster, source = None, "kubernetes"
    if not ident or (cluster is not None and not cluster):
        raise GpuAuditError(f"job {ref!r}: expected CLUSTER:ID, k8s:NAMESPACE/POD or CLUSTER:NAMESPACE/POD")
    if "/" in ident:
        ns, pod = ident.split("/", 1)
        if not ns or not pod:
            raise GpuAuditError(f"job {ref!r}: expected NAMESPACE/POD after the colon")
        return {"cluster": cluster, "source": "kubernetes", "namespace": ns, "pod": pod, "id": None}
    return {"cluster": cluster, "source": source, "namespace": None, "pod": None, "id": ident}


def find_allocation(conn: Connection, ref: str, user: str | None = None) -> tuple[int, list[int]]:
    """The allocation ``ref`` names (the newest when a pod name was reused), and any others it matched.
    ``user`` restricts the match to that user's allocations (the web UI's per-user scope)."""
    m = parse_ref(ref)
    where, p = [], {}
    for key, col in (("cluster", "cluster"), ("source", "source"), ("namespace", "account"), ("pod", "name")):
        if m[key] is not None:
            where.append(f"{col} = :{key}")
            p[key] = m[key]
    if m["id"] is not None:
        where.append("external_id = :id")
        p["id"] = m["id"]
    if user is not None:
        where.append("user_name = :user")
        p["user"] = user
    ids = [r[0] for r in conn.execute(text(
        "SELECT id FROM allocations WHERE " + " AND ".join(where)
        + " ORDER BY COALESCE(start_ts, submit_ts, 0) DESC, id DESC LIMIT 20"), p)]
    if not ids:
        raise GpuAuditError(f"no allocation matches {ref!r} (see `gpu-audit jobs --user NAME`)")
    return ids[0], ids[1:]


def _gpus(conn: Connection, a: dict[str, Any], run_id: int | None) -> list[dict[str, Any]]:
    cols = ("reserved_s", "observed_s", "idle_s", "idle_by_util_s", "mirage_s", "low_s", "working_s", "unknown_s",
            "effective_s")
    if run_id is not None:
        rows = conn.execute(text(
            "SELECT ag.node, ag.gpu_index AS sched_index, ag.share, ag.model, ag.mig_profile, u.gpu_index, u.gpu_id, "
            "u.attribution, u.signal, " + ", ".join(f"u.{c}" for c in cols) + " FROM allocated_gpus ag "
            "LEFT JOIN usage_gpu u ON u.allocated_gpu_id = ag.id AND u.run_id = :r WHERE ag.allocation_id = :a "
            "ORDER BY ag.node, ag.slot"), {"r": run_id, "a": a["id"]})
    else:
        rows = conn.execute(text(
            "SELECT ag.node, ag.gpu_index AS sched_index, ag.share, ag.model, ag.mig_profile, ag.gpu_index, "
            "tg.id AS gpu_id, CASE WHEN tg.id IS NULL THEN 'unattributed' ELSE 'index' END AS attribution, "
            "NULL AS signal FROM allocated_gpus ag LEFT JOIN telemetry_gpus tg ON tg.cluster = :c AND tg.host = "
            "ag.node AND tg.gpu_index = ag.gpu_index AND tg.gpu_instance = '' WHERE ag.allocation_id = :a "
            "ORDER BY ag.node, ag.slot"), {"c": a["cluster"], "a": a["id"]})
    out = []
    for r in rows:
        g = dict(r._mapping)
        g["gpu_index"] = g["gpu_index"] if g["gpu_index"] is not None else g.pop("sched_index", None)
        g.pop("sched_index", None)
        g["seconds"] = {c: g.pop(c, None) for c in cols}
        out.append(g)
    return out


def gpu_series(conn: Connection, gpu_ids: list[int], s: int, e: int, th: Thresholds, bucket_s: int,
               jkey: str | None = None) -> dict[int, dict[str, Any]]:
    """Per telemetry GPU over the allocation's [s, e): the time line (verdict seconds per time bin) and the mean
    and peak of each metric, from the audit's own judged rows (:func:`auditor.audit.judging.rows_of`: the rows
    that apply to the job ``jkey``, each row's observed seconds clipped to [s, e)), means weighted by those
    seconds. So a free GPU's readings before the job started or after it ended (a bucket the allocation only
    touches) never enter its header, its GPU row or its last bin (issue 44). Two grouped queries for all GPUs
    at once, so a 64-GPU job stays fast."""
    from auditor.audit import judging
    from auditor.store.sqlfuncs import sql_names

    ids = sorted({int(g) for g in gpu_ids})
    if not ids or e <= s:
        return {}
    bins = max(1, min(BINS, -(-(e - s) // max(1, bucket_s))))
    fn = sql_names(conn.dialect.name)
    p = {"s": s, "e": e, "bins": bins, "jkey": jkey if jkey is not None else ""}
    marks = ", ".join(str(i) for i in ids)
    cands = (f"(SELECT tg.id AS gpu_id, :s AS a_s, :e AS a_e, CAST(:jkey AS TEXT) AS jkey, tg.has_jobs AS lab "
             f"FROM telemetry_gpus tg WHERE tg.id IN ({marks}))")
    rows = judging.rows_of(conn.dialect.name, th, cands, "cc", ["gpu_id"])
    binx = f"CAST(({fn['GREATEST']}(j.bucket_ts, :s) - :s) * :bins / (:e - :s) AS INTEGER)"
    out: dict[int, dict[str, Any]] = {i: {"per_bin": [{} for _ in range(bins)], "seconds": {}, "metrics": {},
                                          **{k: [[0.0, 0] for _ in range(bins)] for k in BIN_METRICS}} for i in ids}
    mcols = ", ".join(f"SUM(j.obs * j.{m}), SUM(CASE WHEN j.{m} IS NOT NULL THEN j.obs END), MAX(j.{m})"
                      for m in METRICS)
    sql = (f"SELECT j.gpu_id, {binx} AS bin, j.v AS v, SUM(j.obs) AS sec, {mcols} "
           f"FROM {rows} WHERE j.obs > 0 GROUP BY j.gpu_id, {binx}, j.v")
    acc: dict[int, list[list[float]]] = {i: [[0.0, 0, None] for _ in METRICS] for i in ids}
    per_bin = {METRICS.index(m): k for k, m in BIN_METRICS.items()}
    for r in conn.execute(text(sql), p):
        gid, k, v, sec = r[0], r[1], r[2], r[3]
        g = out[gid]
        k = min(bins - 1, max(0, int(k)))
        name = VERDICTS.get(int(v), "unknown")
        g["per_bin"][k][name] = g["per_bin"][k].get(name, 0.0) + float(sec or 0)
        g["seconds"][name] = g["seconds"].get(name, 0.0) + float(sec or 0)
        for i in range(len(METRICS)):
            total, count, peak = r[4 + 3 * i], r[5 + 3 * i], r[6 + 3 * i]
            a = acc[gid][i]
            a[0] += float(total or 0)
            a[1] += float(count or 0)
            if peak is not None and (a[2] is None or peak > a[2]):
                a[2] = peak
            if i in per_bin:
                g[per_bin[i]][k][0] += float(total or 0)
                g[per_bin[i]][k][1] += float(count or 0)
    for gid, a in acc.items():
        out[gid]["metrics"] = {m: {"mean": a[i][0] / a[i][1] if a[i][1] else None, "peak": a[i][2]}
                               for i, m in enumerate(METRICS)}
    for g in out.values():
        codes = [max(d, key=lambda x: d[x]) if d else None for d in g["per_bin"]]
        means = {k: [a / n if n else None for a, n in g.pop(k)] for k in BIN_METRICS}
        g.pop("per_bin")
        g["timeline"] = {"bins": bins, "bin_s": (e - s) / bins, "verdicts": codes, **means,
                         "seconds": g.pop("seconds"), "line": "".join(GLYPH[c] for c in codes),
                         "spark": spark(means["sm"])}
    return out


EMPTY_METRICS = {m: {"mean": None, "peak": None} for m in METRICS}


def spark(values: list[float | None]) -> str:
    """A 0-1 series as eight-level block characters, ``?`` where a bin has no data."""
    return "".join(NO_DATA if v is None else SPARK[max(0, min(7, int(v * 8)))] for v in values)


def axis(s: int, e: int, tz: Any, ticks: int = 4) -> list[dict[str, Any]]:
    """Time-axis ticks of the per-GPU charts: ``ticks`` + 1 evenly spaced labels from start to end (the
    local time the report uses), as fractions of the width."""
    if e <= s:
        return []
    return [{"frac": i / ticks, "ts": s + (e - s) * i // ticks, "label": _when(s + (e - s) * i // ticks, tz)}
            for i in range(ticks + 1)]


def cpu_efficiency(cpu_time_s: float | None, cpus: int | None, held_s: int | None, running: bool
                   ) -> float | None:
    """seff's CPU efficiency: CPU seconds used over CPU seconds held (cpus x wall time); None while running or
    when the store lacks either (Slurm's TotalCPU is only final once the job ended)."""
    if running or not cpu_time_s or not cpus or not held_s or held_s <= 0:
        return None
    return cpu_time_s / (cpus * held_s)


def summary_of(conn: Connection, run_id: int, allocation_id: int) -> dict[str, Any]:
    """The allocation's usage as the report sums it (:data:`auditor.report.context.USAGE_SUMS`, read by
    :func:`auditor.report.context._usage_row`): one computation of idle hours, coverage and mean GPU-Util
    and SM activity for the report, the job view and the web page."""
    row = conn.execute(text(f"SELECT {USAGE_SUMS} FROM usage_allocation u WHERE u.run_id = :r "
                            "AND u.allocation_id = :a"), {"r": run_id, "a": allocation_id}).one()
    return _usage_row(dict(row._mapping))


def verdict_line(summary: dict[str, Any] | None, findings: list[dict[str, Any]], currency: str,
                 running: bool, *, stopped: dict[str, Any] | None = None,
                 waiting: dict[str, Any] | None = None) -> dict[str, str]:
    """The job's one-line verdict (the first line of ``gpu-audit job`` and of the web page). It follows the
    verdict of its hours and what gpu-audit did, never only the findings list: a job idle (or a mirage) for
    most of its reserved time is called so even when no finding is listed (under the hours a finding needs),
    a job gpu-audit stopped says so, and a job its own input starved (input/storage wait) says that it
    waited, not idled. Then the findings by cost, else how much of the reserved time did work. Idle hours are
    the audit's (findings about the same hours overlap, so they are never summed here)."""
    acted = (f"; stopped by gpu-audit {stopped['when']} ({stopped['action']})" if stopped else "")
    if summary is None:
        return {"level": "stopped" if stopped else "unaudited",
                "text": ("STOPPED by gpu-audit: " if stopped else "")
                + "not audited yet: no hours or cost (run `gpu-audit audit`); the time line comes straight "
                  "from telemetry" + acted}
    res, idle = summary["reserved_gpu_hours"], summary["idle_gpu_hours"]
    mirage = summary.get("mirage_gpu_hours") or 0.0
    waited = summary.get("input_wait_gpu_hours") or 0.0
    share = idle / res if res else None
    tail = (", still running" if running else "") + acted
    mostly_mirage = idle > 0 and mirage > idle - mirage
    if share is not None and share >= 0.5:  # the verdict of most of its hours, findings or not
        level = "idle"  # a mirage is idle by SM activity; the text names it
        what = (f"{fmt_hours(idle)} of its {fmt_hours(res)} GPU-h idle ({fmt_pct(share)}, "
                f"{fmt_money(summary['idle_cost'], currency)})")
    elif res and waited / res >= 0.5:
        level = "input wait"
        what = (f"{fmt_hours(waited)} of its {fmt_hours(res)} GPU-h the GPU waited on the job's own input "
                "(input/storage wait, GPU starved: not idle)")
    elif findings:
        level = "partly idle" if idle > 0 else "check"
        what = (f"{fmt_hours(idle)} of its {fmt_hours(res)} GPU-h idle ({fmt_pct(share)}, "
                f"{fmt_money(summary['idle_cost'], currency)})" if idle > 0 else f"{fmt_hours(res)} GPU-h")
    else:
        level = ""
        what = ""
    if findings:
        names: list[str] = []
        for f in findings:
            if kinds.label(f["kind"]) not in names:
                names.append(kinds.label(f["kind"]))
        fs = f"{len(findings)} finding{'s' if len(findings) > 1 else ''}: " + ", ".join(names)
    else:
        fs = "no finding listed" if level else "no findings"
    if mostly_mirage and level in ("idle", "partly idle"):
        fs += f"; {fmt_hours(mirage)} GPU-h of it a mirage (GPU-Util read busy while no work ran)"
    if level:
        return {"level": level, "text": f"{level.upper()}: {what}{tail}; {fs}"}
    eff = summary["effective_gpu_hours"] / res if res else None
    if summary["coverage"] is not None and summary["coverage"] < 0.5:
        return {"level": "unknown", "text": f"UNKNOWN: only {fmt_pct(summary['coverage'])} of its "
                f"{fmt_hours(res)} GPU-h had samples; no findings{acted}"}
    main = (waiting or {}).get("main")
    wait = f"; it waited mostly on {main['label'].lower()} ({fmt_hours(main['gpu_hours'])} GPU-h)" if main else ""
    return {"level": "ok", "text": f"OK: no findings; {fmt_pct(eff)} of its {fmt_hours(res)} reserved GPU-h "
            f"was effective work (mean SM activity {fmt_pct(summary['mean_sm_active'])}, GPU-Util "
            f"{fmt_pct(summary['mean_gpu_util'])}){wait}{acted}"}


def waiting_of(conn: Connection, run: dict[str, Any], allocation_id: int, th: Thresholds) -> dict[str, Any] | None:
    """The job's waiting classes (docs/definitions.md "Where the waiting goes") in the audit run ``run``:
    the run summary's figures where the job is among the allocations it lists, else computed for this job
    alone the same way (:func:`auditor.audit.waiting.class_seconds` and the host split of
    :mod:`auditor.audit.hostwait`). ``main``: the class it waited on most (of :data:`WAIT_CLASSES`, the
    input/storage wait of a starved GPU included), None when it did not wait."""
    from auditor.audit import hostwait, waiting

    listed = next((a for a in ((run.get("summary") or {}).get("waiting") or {}).get("allocations") or []
                   if a.get("allocation_id") == allocation_id), None)
    if listed is not None:
        hours = dict(listed["gpu_hours"])
    else:
        seconds = waiting.class_seconds(conn, run["id"], allocation_id)
        if allocation_id not in seconds:
            return None
        p = {"since": run["since_ts"], "horizon": min(run["until_ts"], run.get("started_ts") or run["until_ts"])}
        hostwait.refine(conn, run["id"], th, p, seconds, allocation_id)
        row = conn.execute(text("SELECT reserved_s, infra_s FROM usage_allocation WHERE run_id = :r AND "
                                "allocation_id = :a"), {"r": run["id"], "a": allocation_id}).one()
        b = waiting.breakdown([{"allocation_id": allocation_id, "reserved_s": row.reserved_s,
                                "infra_s": row.infra_s, "cluster": "", "team": "", "external_id": "",
                                "name": ""}], seconds)
        hours = b["allocations"][0]["gpu_hours"]
    waits = [(hours.get(k) or 0.0, k) for k in waiting.WAIT_CLASSES]
    h, k = max(waits)
    main = {"class": k, "label": waiting.CLASSES[k], "gpu_hours": h} if h > 1e-9 else None
    return {"gpu_hours": {k: hours.get(k) or 0.0 for k in waiting.CLASSES},
            "labels": dict(waiting.CLASSES), "main": main}


def job_view(store: Store, cfg: Config, ref: str | int, *, user: str | None = None,
             run_id: str | int | None = None, now: datetime | None = None) -> dict[str, Any]:
    """Everything about one allocation (``ref`` as for :func:`parse_ref`, or an allocations.id), from the run
    the one rule picks (:func:`auditor.report.context.shown_run`: ``run_id`` from ``--run``/``?run=``, else
    the report's run among those that judged it); an unknown run is a one-line error."""
    tz = _tz(cfg)
    now_ts = int((now or utcnow()).timestamp())
    with store.engine.connect() as conn:
        if isinstance(ref, int):
            aid, others = ref, []
        else:
            aid, others = find_allocation(conn, ref, user)
        row = conn.execute(text("SELECT * FROM allocations WHERE id = :a" + (" AND user_name = :u" if user else "")),
                           {"a": aid, "u": user}).first()
        if row is None:
            raise GpuAuditError(f"no allocation {ref}")
        a = dict(row._mapping)
        choice = shown_run(store, cfg, run_id, allocation_id=aid)
        rid = choice["id"]
        run = load_run(conn, rid) if rid is not None else None
        th = Thresholds.of_run(run["thresholds"]) if run and run.get("thresholds") else cfg.thresholds
        usage = conn.execute(text("SELECT * FROM usage_allocation WHERE run_id = :r AND allocation_id = :a"),
                             {"r": rid, "a": aid}).first() if rid is not None else None
        usage = dict(usage._mapping) if usage is not None else None
        summary = summary_of(conn, rid, aid) if usage is not None else None
        waits = waiting_of(conn, run, aid, th) if usage is not None and run else None
        s = a["start_ts"] or 0
        e = a["end_ts"] if a["end_ts"] is not None else now_ts
        gpus = _gpus(conn, a, rid if usage else None)
        series = gpu_series(conn, [g["gpu_id"] for g in gpus if g["gpu_id"] is not None], s, e, th,
                            cfg.store.bucket_seconds,
                            a["external_id"] if a["source"] == "slurm" else f"{a['account']}/{a['name']}")
        bins = max(1, min(BINS, -(-(e - s) // max(1, cfg.store.bucket_seconds)))) if e > s else 1
        blank = {"bins": bins, "bin_s": (e - s) / bins, "verdicts": [None] * bins,
                 **{k: [None] * bins for k in BIN_METRICS}, "seconds": {}, "line": NO_DATA * bins,
                 "spark": NO_DATA * bins}
        for g in gpus:
            got = series.get(g["gpu_id"]) if g["gpu_id"] is not None else None
            g["timeline"] = got["timeline"] if got else blank
            g["metrics"] = (got or {}).get("metrics") or EMPTY_METRICS
            sec = g["seconds"]
            g["coverage"] = (sec["observed_s"] / sec["reserved_s"]) if sec.get("reserved_s") else None
        findings = [{"id": f.id, "kind": f.kind, "gpu_hours": f.gpu_hours, "idle_gpu_hours": f.idle_gpu_hours,
                     "cost": f.cost, "rule": str((_ev(f.evidence)).get("rule") or ""),
                     "hint": ": ".join(str(x) for x in (_ev(f.evidence).get("hint"), _ev(f.evidence).get("hint_reason"))
                                       if x), "advice": ADVICE.get(f.kind, "")}
                    for f in conn.execute(text(
                        "SELECT id, kind, gpu_hours, idle_gpu_hours, cost, evidence FROM findings WHERE run_id = :r "
                        "AND allocation_id = :a ORDER BY cost DESC, id"), {"r": rid, "a": aid})] if rid else []
        acts = [{"when": _when(r.decided_ts, tz), "decided_ts": r.decided_ts, "stage": r.stage, "action": r.action,
                 "decision": r.decision, "target": r.target, "reason": r.reason, "result": r.result or "",
                 "dry_run": bool(r.dry_run)}
                for r in conn.execute(text(
                    "SELECT decided_ts, stage, action, decision, target, reason, result, dry_run FROM enforcement_log "
                    "WHERE allocation_id = :a AND action <> 'none' ORDER BY id DESC LIMIT 20"), {"a": aid})]
    # an action gpu-audit took ends the allocation's hold even before a collection sees it end
    stopped = next((x for x in acts if x["stage"] == "act" and x["decision"] == "done" and not x["dry_run"]
                    and (a["start_ts"] is None or x["decided_ts"] >= a["start_ts"])), None)
    running = a["start_ts"] is not None and (a["end_ts"] is None or a["end_ts"] > now_ts) and not stopped
    held_s = e - s if a["start_ts"] is not None else None
    limit_s = a.get("time_limit_s")
    nodes = sorted({g["node"] for g in gpus if g["node"]})
    hours = None
    if usage:
        hours = {k[:-2] + "_gpu_hours": (usage[k] or 0.0) / H for k in usage if k.endswith("_s")}
        hours["coverage"] = usage["observed_s"] / usage["reserved_s"] if usage["reserved_s"] else None
    with store.engine.connect() as conn:
        requeues = job_runs(conn, a, rid, tz)
    return {"schema": "gpu-audit.job/1", "allocation_id": aid, "job_runs": requeues, "cluster": a["cluster"],
            "source": a["source"],
            "id": a["external_id"], "name": a["name"], "user": a["user_name"], "account": a["account"],
            "team": usage["team"] if usage else "", "state": a["state"], "start": _when(a["start_ts"], tz),
            "end": _when(a["end_ts"], tz), "start_ts": a["start_ts"], "end_ts": a["end_ts"],
            "running": running, "actions": acts, "stopped": stopped,
            "verdict": verdict_line(summary, findings, cfg.prices.currency, running, stopped=stopped,
                                    waiting=waits), "summary": summary, "waiting": waits,
            "partition": a.get("partition") or "", "qos": a.get("qos") or "", "time_limit_s": limit_s,
            "time_limit_used": held_s / limit_s if held_s is not None and limit_s else None, "nodes": nodes,
            "exit_code": a.get("exit_code"), "cpus": a.get("cpus"), "cpu_time_s": a.get("cpu_time_s"),
            "cpu_efficiency": cpu_efficiency(a.get("cpu_time_s"), a.get("cpus"), held_s, running),
            "host_memory_bytes": None,
            "axis": axis(s, e, tz) if a["start_ts"] is not None else [],
            "hours_held": held_s / H if held_s is not None else None, "gpu_count": a["gpu_count"],
            "run_id": rid, "run": {"id": rid, "since": _when(run["since_ts"], tz), "until": _when(run["until_ts"], tz),
                                   "since_ts": run["since_ts"], "until_ts": run["until_ts"],
                                   "kind": run_kind(run["since_ts"], run["until_ts"],
                                                    (run["summary"] or {}).get("purpose"), cfg),
                                   "chosen": choice["chosen"], "why": choice["why"]} if run else None,
            "runs": choice["runs"], "usage": hours, "currency": cfg.prices.currency,
            "price_per_gpu_hour": usage["price_per_gpu_hour"] if usage else None,
            "reserved_cost": usage["reserved_cost"] if usage else None,
            "idle_cost": usage["idle_cost"] if usage else None, "gpus": gpus, "findings": findings,
            "other_matches": others}


def job_runs(conn: Connection, a: dict[str, Any], run_id: int | None, tz: Any) -> list[dict[str, Any]]:
    """Every run of the job ``a`` is one of (issue 44: ``job CLUSTER:ID`` of a requeued job showed only the
    last): the allocations of its cluster, source and id of the same user and account (a requeue keeps the id
    and gets a new submit time; a reused id of another user is another job, never listed), oldest first, each
    with its state, times and, where audit run ``run_id`` judged it, its reserved and idle GPU-hours."""
    rows = conn.execute(text(
        "SELECT a.id, a.state, a.start_ts, a.end_ts, a.instance_ts, u.reserved_s, u.idle_s, u.mirage_s FROM "
        "allocations a LEFT JOIN usage_allocation u ON u.allocation_id = a.id AND u.run_id = :r WHERE a.cluster = "
        ":c AND a.source = :s AND a.external_id = :e AND COALESCE(a.user_name, '') = :u AND COALESCE(a.account, "
        "'') = :acct ORDER BY COALESCE(a.start_ts, a.submit_ts, a.instance_ts), a.id"),
        {"r": run_id if run_id is not None else -1, "c": a["cluster"], "s": a["source"], "e": a["external_id"],
         "u": a["user_name"] or "", "acct": a["account"] or ""})
    return [{"allocation_id": r.id, "state": r.state or "", "start": _when(r.start_ts, tz), "end": _when(r.end_ts, tz),
             "shown": r.id == a["id"], "judged": r.reserved_s is not None,
             "reserved_gpu_hours": (r.reserved_s or 0.0) / H,
             "idle_gpu_hours": ((r.idle_s or 0.0) + (r.mirage_s or 0.0)) / H} for r in rows]


def _ev(v: Any) -> dict[str, Any]:
    if isinstance(v, str):
        import json

        return json.loads(v)
    return v or {}


def known_cluster(conn: Connection, cluster: str) -> None:
    """Refuse a cluster the store has never heard of, naming the ones it has (a typo must not read as "no
    allocations")."""
    names = sorted({r[0] for r in conn.execute(text("SELECT name FROM clusters UNION SELECT DISTINCT cluster "
                                                    "FROM allocations"))})
    if cluster not in names:
        from auditor.logs import log_safe

        shown = ", ".join(log_safe(n) for n in names) if names else "none"
        raise GpuAuditError(f"no cluster named {log_safe(cluster)!r} in the store; known: {shown}")


class _Row:
    """An allocation row with its chosen usage row's columns (None where no run judged it)."""

    def __init__(self, a: Any, u: Any) -> None:
        self.__dict__.update(a._mapping)
        for k in ("run_id", "team", "reserved_s", "idle_s", "mirage_s", "observed_s", "reserved_cost", "idle_cost"):
            setattr(self, k, getattr(u, k) if u is not None else None)


def jobs_list(store: Store, cfg: Config, *, user: str | None, since: datetime, until: datetime,
              cluster: str | None = None, limit: int = 500) -> list[dict[str, Any]]:
    """A user's allocations that overlap [since, until), newest first, with the audited numbers of the run the
    one rule picks for each (:func:`auditor.report.context.run_rank`)."""
    tz = _tz(cfg)
    p: dict[str, Any] = {"s": int(since.timestamp()), "u": int(until.timestamp())}
    where = "a.start_ts IS NOT NULL AND a.start_ts < :u AND COALESCE(a.end_ts, :u) > :s"
    if user is not None:
        where += " AND a.user_name = :user"
        p["user"] = user
    if cluster:
        where += " AND a.cluster = :cluster"
        p["cluster"] = cluster
    sql = ("SELECT a.id, a.cluster, a.source, a.external_id, a.name, a.user_name, a.account, a.state, a.start_ts, "
           f"a.end_ts, a.gpu_count FROM allocations a WHERE {where} ORDER BY a.start_ts DESC, a.id DESC "
           f"LIMIT {int(limit)}")
    out = []
    with store.engine.connect() as conn:
        if cluster:
            known_cluster(conn, cluster)
        got = conn.execute(text(sql), p).all()
        # each allocation's figures from the run the one rule picks among those that judged it (run_rank)
        rank = run_rank(conn, cfg)
        best: dict[int, Any] = {}
        for i in range(0, len(got), 500):
            ids = ", ".join(str(int(r.id)) for r in got[i:i + 500])
            for u in conn.execute(text(
                    "SELECT allocation_id, run_id, team, reserved_s, idle_s, mirage_s, observed_s, reserved_cost, "
                    f"idle_cost FROM usage_allocation WHERE allocation_id IN ({ids})")) if ids else ():
                if u.run_id in rank and (u.allocation_id not in best or
                                         rank[u.run_id] < rank[best[u.allocation_id].run_id]):
                    best[u.allocation_id] = u
        for a in got:
            u = best.get(a.id)
            r = _Row(a, u)
            ref = job_ref(r.source, r.cluster, r.external_id, r.account, r.name)
            out.append({"allocation_id": r.id, "ref": ref, "cluster": r.cluster, "source": r.source,
                        "id": r.external_id, "name": r.name, "user": r.user_name, "account": r.account,
                        "team": r.team or "", "state": r.state, "start": _when(r.start_ts, tz),
                        "end": _when(r.end_ts, tz), "gpus": r.gpu_count, "run_id": r.run_id,
                        "reserved_gpu_hours": (r.reserved_s or 0) / H if r.run_id else None,
                        "idle_gpu_hours": ((r.idle_s or 0) + (r.mirage_s or 0)) / H if r.run_id else None,
                        "coverage": r.observed_s / r.reserved_s if r.run_id and r.reserved_s else None,
                        "idle_cost": r.idle_cost if r.run_id else None})
    return out
