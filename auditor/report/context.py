"""The report context: everything the weekly report shows, read from one audit run in the store.

One plain, JSON-serialisable dict feeds every format (HTML, text, Markdown, JSON) and the emails, so the
numbers cannot disagree between them. Long tables are cut at ``report.top_n`` with totals over all rows;
``full=True`` (the JSON report) keeps every row.
"""

from __future__ import annotations

import shlex
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import Connection, select, text

from auditor.audit import goodput, kinds
from auditor.config import Config
from auditor.errors import GpuAuditError
from auditor.intparse import INT32_MAX, parse_uint
from auditor.report import sizing
from auditor.report.budgets import team_budgets
from auditor.report.inference import inference_section
from auditor.report.nodes import nodes_section
from auditor.report.words import ADVICE, DEFINITIONS, judged_in_words
from auditor.store import schema
from auditor.store.engine import Store
from auditor.timeutil import H, utcnow

SCHEMA = "gpu-audit.report/1"
IDLE_KINDS = kinds.of_section("top_idle")
#: the findings tables of the report besides the top idle allocations (and the ghosts: top_idle's kinds
#: without an allocation), each listing the registry's kinds of its section
SECTION_KINDS = {s: kinds.of_section(s) for s in ("episodes", "reservations", "low_efficiency", "unmonitored",
                                                   "queue_findings", "stragglers")}
TREND_WEEKS = 5

def _tz(cfg: Config) -> Any:
    try:
        return ZoneInfo(cfg.report.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        return UTC


def _when(ts: int | None, tz: Any) -> str | None:
    """``ts`` as local time text to the minute."""
    if ts is None:
        return None
    return _minute(int(ts // 60), tz)


@lru_cache(maxsize=1 << 16)
def _minute(minute: int, tz: Any) -> str:
    """The text of one minute (cached: a week of findings falls into ~10,000 minutes; time zones change
    offset on whole minutes, so every second of a minute reads the same)."""
    return datetime.fromtimestamp(minute * 60, UTC).astimezone(tz).strftime("%Y-%m-%d %H:%M %Z")


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _table(rows: list[dict[str, Any]], total: int, totals: dict[str, Any]) -> dict[str, Any]:
    return {"rows": rows, "total": total, "shown": len(rows), "cut": total > len(rows), "totals": totals}


def _limit(full: bool, top_n: int) -> str:
    return "" if full else f" LIMIT {int(top_n)}"


USAGE_SUMS = ("COUNT(*) AS allocations, SUM(u.reserved_s) AS reserved_s, SUM(u.observed_s) AS observed_s, "
              "SUM(u.idle_s + u.mirage_s) AS idle_s, SUM(u.mirage_s) AS mirage_s, "
              "SUM(u.effective_s) AS effective_s, SUM(u.unknown_s) AS unknown_s, "
              "SUM(u.gpu_util_s) AS gpu_util_s, SUM(u.util_observed_s) AS util_observed_s, "
              "SUM(u.sm_s) AS sm_s, SUM(u.sm_observed_s) AS sm_observed_s, "
              "SUM(u.reserved_cost) AS reserved_cost, SUM(u.idle_cost) AS idle_cost, "
              "SUM(u.input_wait_s) AS input_wait_s")


def _usage_row(r: dict[str, Any]) -> dict[str, Any]:
    """Seconds -> GPU-hours, plus the ratios a reader wants next to them."""
    reserved = (r.get("reserved_s") or 0.0) / H
    effective = (r.get("effective_s") or 0.0) / H
    reserved_cost = r.get("reserved_cost") or 0.0
    return {"allocations": int(r.get("allocations") or 0), "reserved_gpu_hours": reserved,
            "idle_gpu_hours": (r.get("idle_s") or 0.0) / H, "mirage_gpu_hours": (r.get("mirage_s") or 0.0) / H,
            "effective_gpu_hours": effective, "unknown_gpu_hours": (r.get("unknown_s") or 0.0) / H,
            "coverage": _ratio(r.get("observed_s"), r.get("reserved_s")),
            "mean_gpu_util": _ratio(r.get("gpu_util_s"), r.get("util_observed_s")),
            "mean_sm_active": _ratio(r.get("sm_s"), r.get("sm_observed_s")),
            "reserved_cost": reserved_cost, "idle_cost": r.get("idle_cost") or 0.0,
            # a GPU its own job's input starved (auditor.audit.starved): not idle
            "input_wait_gpu_hours": (r.get("input_wait_s") or 0.0) / H,
            "cost_per_effective_gpu_hour": reserved_cost / effective if effective > 0 else None}


def usage_totals(conn: Connection, run_id: int) -> dict[str, Any]:
    """The run's usage summed over every allocation (the totals row of the team and account tables)."""
    tot = conn.execute(text(f"SELECT {USAGE_SUMS} FROM usage_allocation u WHERE u.run_id = :run"),
                       {"run": run_id}).one()._mapping
    return _usage_row(dict(tot))


def usage_of(conn: Connection, run_id: int, *, user: str | None = None, team: str | None = None
             ) -> dict[str, Any]:
    """The run's usage of one user's (or one team's) allocations: what the web overview shows a scoped
    viewer and what a nudge compares the idle hours with (one computation for both)."""
    where, p = "", {"run": run_id}
    if user is not None:
        where, p["who"] = " AND a.user_name = :who", user
    elif team is not None:
        where, p["who"] = " AND u.team = :who", team
    row = conn.execute(text(f"SELECT {USAGE_SUMS} FROM usage_allocation u JOIN allocations a ON a.id = "
                            f"u.allocation_id WHERE u.run_id = :run{where}"), p).one()
    return _usage_row(dict(row._mapping))


def usage_group_rows(conn: Connection, run_id: int, keys: list[str]) -> list[dict[str, Any]]:
    """Usage summed by ``keys`` (columns of usage_allocation ``u`` or allocations ``a``), worst first: every
    group (groups are teams and accounts, not allocations, so the list stays short). Every usage row has
    its allocation (nothing deletes allocations; :mod:`auditor.store.cascade`), so grouping by usage columns
    alone needs no join."""
    names = [k.split(".")[1] for k in keys]
    cols = ", ".join(f"{k} AS {n}" for k, n in zip(keys, names, strict=True))
    join = "" if all(k.startswith("u.") for k in keys) else " JOIN allocations a ON a.id = u.allocation_id"
    sql = (f"SELECT {cols}, {USAGE_SUMS} FROM usage_allocation u{join} WHERE u.run_id = :run "
           f"GROUP BY {', '.join(keys)}"
           " ORDER BY idle_cost DESC, reserved_s DESC, " + ", ".join(names))
    rows = []
    for r in conn.execute(text(sql), {"run": run_id}):
        m = r._mapping
        rows.append({**{n: m[n] for n in names}, **_usage_row(dict(m))})
    return rows


def group_table(rows: list[dict[str, Any]], totals: dict[str, Any], *, full: bool, top_n: int
                ) -> dict[str, Any]:
    """A usage table of ``rows`` (from :func:`usage_group_rows`), cut at ``top_n`` unless ``full``, with
    bars relative to the rows shown."""
    shown = [dict(r) for r in (rows if full else rows[:top_n])]
    peak = max((r["idle_gpu_hours"] for r in shown), default=0.0)
    for r in shown:
        r["bar"] = r["idle_gpu_hours"] / peak if peak > 0 else 0.0
        # what the report draws: idle GPU-hours as a share of the group's own reserved ones (0-100 %)
        r["idle_share"] = _ratio(r["idle_gpu_hours"], r["reserved_gpu_hours"])
        r["reserved_bar"] = r["reserved_gpu_hours"] / totals["reserved_gpu_hours"] \
            if totals["reserved_gpu_hours"] else 0.0
    return _table(shown, len(rows), totals)


FINDING_SQL = ("SELECT f.id, f.kind, f.cluster, f.allocation_id, f.reservation_id, f.account, f.user_name, "
               "f.team, f.start_ts, f.end_ts, f.gpu_hours, f.idle_gpu_hours, f.cost, f.evidence, "
               "r.name AS reservation_name FROM findings f LEFT JOIN reservations r ON r.id = f.reservation_id "
               "WHERE f.run_id = :run AND f.kind IN ({kinds})")


def finding_row(m: dict[str, Any], tz: Any) -> dict[str, Any]:
    """A finding flattened for tables: who, what, how much, why (the rule) and the sparkline data."""
    ev = _evidence(m["evidence"])
    job = ev.get("job") or {}
    return {"id": m["id"], "kind": m["kind"], "cluster": m["cluster"], "allocation_id": m["allocation_id"],
            "job_id": str(job.get("id") or ""), "job_name": str(job.get("name") or ""),
            "source": job.get("source") or "",
            "reservation": m.get("reservation_name") or str(ev.get("reservation") or ""),
            "user": m["user_name"] or "", "account": m["account"] or "", "team": m["team"] or "",
            "start": _when(m["start_ts"], tz), "end": _when(m["end_ts"], tz),
            "start_ts": m["start_ts"], "end_ts": m["end_ts"],
            "hours": ((m["end_ts"] or 0) - (m["start_ts"] or 0)) / H if m["start_ts"] is not None else None,
            "gpus": ev.get("gpus"), "gpu_hours": m["gpu_hours"], "idle_gpu_hours": m["idle_gpu_hours"],
            "cost": m["cost"], "mean_gpu_util": ev.get("mean_gpu_util"),
            "mean_sm_active": ev.get("mean_sm_active"), "coverage": ev.get("coverage"),
            "low_confidence": bool(ev.get("low_confidence")), "rule": str(ev.get("rule") or ""),
            "hint": ": ".join(str(x) for x in (ev.get("hint"), ev.get("hint_reason")) if x),
            "advice": ADVICE.get(m["kind"], ""),
            # the allocation's reserved GPU-hours (a finding's own gpu_hours may be a part: an episode's)
            "reserved_gpu_hours": ev.get("reserved_gpu_hours", m["gpu_hours"]),
            # an idle episode's job: its means and sparkline are the whole job's, not the episode's
            "job_start": _when(ev.get("job_start_ts"), tz), "job_end": _when(ev.get("job_end_ts"), tz),
            "about": _about(m, ev),
            "sparkline": ev.get("sparkline")}  # last: the JSON export splices the stored text in here


def _about(m: dict[str, Any], ev: dict[str, Any]) -> str:
    """What a finding about no allocation is about: a reservation, a user, a quota's account, a node (GPU)."""
    if m.get("reservation_name") or ev.get("reservation"):
        return f"reservation {m.get('reservation_name') or ev.get('reservation')}"
    if ev.get("node"):
        return f"node {ev['node']}" + (f" GPU {ev['gpu_index']}" if ev.get("gpu_index") is not None else "")
    if m["kind"] == "idle_quota":
        quota = ev.get("quota") or {}
        if quota.get("kind") == "queue":
            return f"quota of queue {quota.get('name', '')}"
        return f"quota of {m['account'] or ''}"
    return f"user {m['user_name'] or ''}"


def findings_table(conn: Connection, run_id: int, kinds: tuple[str, ...], tz: Any, *, full: bool,
                   top_n: int, where: str = "", params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Findings of ``kinds``, costliest first, cut at top_n, with totals over all of them."""
    marks = ", ".join(f":k{i}" for i in range(len(kinds)))
    p = {"run": run_id, **{f"k{i}": k for i, k in enumerate(kinds)}, **(params or {})}
    sql = FINDING_SQL.format(kinds=marks) + where
    rows = [finding_row(dict(r._mapping), tz) for r in conn.execute(
        text(sql + " ORDER BY f.cost DESC, f.idle_gpu_hours DESC, f.gpu_hours DESC, f.id"
             + _limit(full, top_n)), p)]
    t = finding_totals(conn, run_id, kinds, where=where, params=params)
    return _table(rows, t["findings"], {k: t[k] for k in ("gpu_hours", "reserved_gpu_hours", "idle_gpu_hours",
                                                          "cost")})


TOTALS_SQL = ("SELECT f.kind, COALESCE(f.allocation_id, -f.id) AS g, MIN(f.allocation_id) AS aid, COUNT(*) AS n, "
              "SUM(f.idle_gpu_hours) AS ih, SUM(f.cost) AS c, MAX(f.gpu_hours) AS gh, "
              "MAX(u.idle_s + u.mirage_s) AS a_idle_s, MAX(u.idle_cost) AS a_idle_cost, "
              "MAX(u.reserved_s) AS a_reserved_s, MIN(f.id) AS fid FROM findings f "
              "LEFT JOIN usage_allocation u ON u.run_id = f.run_id AND u.allocation_id = f.allocation_id{join} "
              "WHERE f.run_id = :run AND f.kind IN ({kinds}){where} GROUP BY f.kind, COALESCE(f.allocation_id, -f.id)")


def finding_totals(conn: Connection, run_id: int, names: tuple[str, ...], *, where: str = "",
                   params: dict[str, Any] | None = None, join: str = "") -> dict[str, Any]:
    """The totals of a set of findings (``names`` kinds, narrowed by ``where`` over ``f``, and ``a`` when
    ``join`` adds allocations): the one computation behind every findings total (report sections, the web
    findings page, nudges), so that no total adds the same GPU-hours twice.

    Only kinds whose hours add to the idle total (:mod:`auditor.audit.kinds`) are added when the set has
    any; the findings about one allocation add up to at most that allocation's idle hours (its findings
    overlap: a mirage finding holds all of them, idle GPUs and episodes parts); an idle reservation adds the
    hours no job used (its jobs' idle hours are counted with the jobs). A set of restating kinds only
    (idle_while_queued, request_hygiene, ...) totals the largest of its kinds' own totals.
    ``gpu_hours`` sums each finding group's own GPU-hours, ``reserved_gpu_hours`` the reserved GPU-hours of
    the allocations concerned (plus the GPU-hours of findings about no allocation); ``by_allocation`` the
    counted idle GPU-hours and cost of each allocation (a nudge's rows)."""
    marks = ", ".join(f":k{i}" for i in range(len(names)))
    p = {"run": run_id, **{f"k{i}": k for i, k in enumerate(names)}, **(params or {})}
    groups = [dict(r._mapping) for r in conn.execute(text(TOTALS_SQL.format(kinds=marks, where=where,
                                                                            join=join)), p)] if names else []
    present = {g["kind"] for g in groups}
    adds = present & kinds.ADDS_TO_IDLE
    unused: dict[int, tuple[float, float]] = {}
    if adds:  # what of an idle reservation no job used (the evidence says)
        ids = [int(g["fid"]) for g in groups if g["kind"] in adds and g["aid"] is None
               and kinds.BY_NAME[g["kind"]].family == "reservation"]
        for i in range(0, len(ids), 500):
            for r in conn.execute(text("SELECT f.id, f.evidence FROM findings f WHERE f.id IN ("
                                       + ", ".join(str(x) for x in ids[i:i + 500]) + ")")):
                unused[int(r.id)] = reservation_unused(_evidence(r.evidence))
    choices = [adds] if adds else [{k} for k in sorted(present)]
    best: dict[str, Any] = {"idle_gpu_hours": 0.0, "cost": 0.0, "gpu_hours": 0.0, "reserved_gpu_hours": 0.0,
                            "allocations": 0, "counted_kinds": [], "by_allocation": {}}
    for chosen in choices:
        per: dict[Any, dict[str, Any]] = {}
        for g in groups:
            if g["kind"] not in chosen:
                continue
            x = per.setdefault(g["g"], {"aid": g["aid"], "ih": 0.0, "c": 0.0, "gh": 0.0, "cap": g["a_idle_s"],
                                        "cap_cost": g["a_idle_cost"], "res": g["a_reserved_s"]})
            ih, c = float(g["ih"] or 0.0), float(g["c"] or 0.0)
            if g["aid"] is None and int(g["fid"]) in unused:
                ih, c = unused[int(g["fid"])]
            x["ih"] += ih
            x["c"] += c
            x["gh"] = max(x["gh"], float(g["gh"] or 0.0))
        t = {"idle_gpu_hours": 0.0, "cost": 0.0, "gpu_hours": 0.0, "reserved_gpu_hours": 0.0,
             "allocations": 0, "counted_kinds": sorted(chosen), "by_allocation": {}}
        for x in per.values():
            ih, c = x["ih"], x["c"]
            if x["aid"] is not None and x["cap"] is not None:
                ih, c = min(ih, float(x["cap"]) / H), min(c, float(x["cap_cost"] or 0.0))
            if x["aid"] is not None:
                t["by_allocation"][int(x["aid"])] = {"idle_gpu_hours": ih, "cost": c}
            t["idle_gpu_hours"] += ih
            t["cost"] += c
            t["gpu_hours"] += x["gh"]
            t["reserved_gpu_hours"] += float(x["res"]) / H if x["aid"] is not None and x["res"] is not None \
                else x["gh"]
            t["allocations"] += x["aid"] is not None
        if not best["counted_kinds"] or t["idle_gpu_hours"] > best["idle_gpu_hours"]:
            best = t
    return {"findings": int(sum(g["n"] for g in groups)), **best}


def reservation_unused(ev: dict[str, Any]) -> tuple[float, float]:
    """(GPU-hours, cost) of an idle reservation that no job used: what it adds to idle totals."""
    h = float(ev.get("unused_gpu_hours") or 0.0)
    return h, h * float(ev.get("price_per_gpu_hour") or 0.0)


def _evidence(ev: Any) -> dict[str, Any]:
    """A finding's evidence as a dict (SQLite hands back its JSON text)."""
    if isinstance(ev, str):
        import json

        return json.loads(ev)
    return ev or {}


SILENT_SQL = ("FROM gpu_inventory i WHERE NOT EXISTS (SELECT 1 FROM telemetry_gpus t JOIN gpu_buckets b "
              "ON b.gpu_id = t.id WHERE t.cluster = i.cluster AND t.host = i.host AND t.gpu_index = "
              "i.gpu_index AND b.bucket_ts >= :s AND b.bucket_ts < :u AND b.samples > 0)")
SILENT_ROWS = ("SELECT i.cluster, i.host, i.gpu_index, i.model " + SILENT_SQL
               + " ORDER BY i.cluster, i.host, i.gpu_index")


def coverage_section(conn: Connection, run: dict[str, Any], cfg: Config, *, full: bool) -> dict[str, Any]:
    """Where telemetry is missing: per cluster coverage, unmonitored GPUs, inventory GPUs never heard of."""
    p = {"run": run["id"], "s": run["since_ts"], "u": run["until_ts"],
         "cov": (run["thresholds"] or {}).get("unmonitored_coverage", cfg.thresholds.unmonitored_coverage)}
    clusters = [{"cluster": r.cluster, **_usage_row(dict(r._mapping))} for r in conn.execute(text(
        f"SELECT a.cluster, {USAGE_SUMS} FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id "
        "WHERE u.run_id = :run GROUP BY a.cluster ORDER BY a.cluster"), p)]
    g = conn.execute(text(
        "SELECT COUNT(*) AS n, SUM(CASE WHEN observed_s < :cov * reserved_s THEN 1 ELSE 0 END) AS unmon, "
        "SUM(CASE WHEN attribution = 'unattributed' THEN 1 ELSE 0 END) AS unattr, "
        "SUM(CASE WHEN observed_s < :cov * reserved_s THEN reserved_s ELSE 0 END) AS unmon_s "
        "FROM usage_gpu WHERE run_id = :run AND reserved_s > 0"), p).one()
    silent = [dict(r._mapping) for r in conn.execute(text(SILENT_ROWS + _limit(full, cfg.report.top_n)), p)]
    silent_total = conn.execute(text("SELECT COUNT(*) " + SILENT_SQL), p).scalar() or 0
    inventory = conn.execute(text("SELECT COUNT(*) FROM gpu_inventory")).scalar() or 0
    return {"clusters": clusters, "allocated_gpus": int(g.n or 0), "unmonitored_gpus": int(g.unmon or 0),
            "unattributed_gpus": int(g.unattr or 0), "unmonitored_gpu_hours": (g.unmon_s or 0.0) / H,
            "inventory_gpus": int(inventory), "silent": _table(silent, int(silent_total), {})}


def trend(conn: Connection, run: dict[str, Any], tz: Any) -> list[dict[str, Any]]:
    """This run and the latest ok runs of about the same window length 1..TREND_WEEKS windows earlier."""
    t = schema.audit_runs
    length = run["until_ts"] - run["since_ts"]
    tol = max(3600, length // 7)
    q = select(t.c.id, t.c.since_ts, t.c.until_ts, t.c.summary).where(
        t.c.status == "ok", t.c.what_if.is_(False), t.c.id != run["id"],
        t.c.until_ts >= run["until_ts"] - TREND_WEEKS * length - tol, t.c.until_ts <= run["until_ts"] - length
        + tol).order_by(t.c.id.desc())
    candidates = [dict(r._mapping) for r in conn.execute(q)]
    points = [_trend_point(run, tz, current=True)]
    for k in range(1, TREND_WEEKS + 1):
        target = run["until_ts"] - k * length
        for c in candidates:
            if (c.get("summary") or {}).get("purpose") == "chargeback":
                continue  # a chargeback run's window is no week of the trend (:func:`shown_run`)
            if abs(c["until_ts"] - target) <= tol and abs(c["until_ts"] - c["since_ts"] - length) <= tol:
                points.append(_trend_point(c, tz))
                break
    points.reverse()
    prev = None
    for p in points:
        p["idle_change"] = (p["idle_gpu_hours"] - prev["idle_gpu_hours"]) if prev else None
        prev = p
    return points


def _trend_point(r: dict[str, Any], tz: Any, current: bool = False) -> dict[str, Any]:
    s = r.get("summary") or {}
    return {"run_id": r["id"], "since": _when(r["since_ts"], tz), "until": _when(r["until_ts"], tz),
            "current": current, "idle_gpu_hours": s.get("idle_gpu_hours") or 0.0,
            "idle_cost": s.get("idle_cost") or 0.0, "reserved_gpu_hours": s.get("reserved_gpu_hours") or 0.0,
            "effective_gpu_hours": s.get("effective_gpu_hours") or 0.0,
            "cost_per_effective_gpu_hour": s.get("cost_per_effective_gpu_hour")}


def load_run(conn: Connection, run_id: int) -> dict[str, Any]:
    t = schema.audit_runs
    row = conn.execute(select(t).where(t.c.id == run_id)).first()
    if row is None:
        raise GpuAuditError(f"no audit run {run_id} in the store (see `gpu-audit audit`)")
    run = dict(row._mapping)
    if run["status"] != "ok":
        raise GpuAuditError(f"audit run {run_id} is {run['status']}, not ok; run `gpu-audit audit` again")
    return run


RUNS_LISTED = 40  # audit runs the run picker offers (latest window first)


def run_kind(since_ts: int, until_ts: int, purpose: str | None, cfg: Config) -> str:
    """What a run is, in words: a weekly audit (a window of ``report.days``), a chargeback run or an audit
    of some other window. Weekly allows the trend's tolerance (a seventh of the window, at least an hour)."""
    if purpose == "chargeback":
        return "chargeback"
    want = cfg.report.days * 86400
    if abs((until_ts - since_ts) - want) <= max(3600, want // 7):
        return "weekly audit"
    days = (until_ts - since_ts) / 86400
    return f"audit of {days:.3g} day{'' if days == 1 else 's'}"


def runs(conn: Connection, cfg: Config, limit: int = RUNS_LISTED) -> list[dict[str, Any]]:
    """The official ok runs, the latest window first (a week audited afterwards for the trend is not the
    newest week), with their kind (the run picker's options)."""
    t = schema.audit_runs
    tz = _tz(cfg)
    q = select(t.c.id, t.c.since_ts, t.c.until_ts, t.c.summary["purpose"].as_string().label("purpose")).where(
        t.c.status == "ok", t.c.what_if.is_(False)).order_by(t.c.until_ts.desc(), t.c.id.desc()).limit(limit)
    return [{"id": int(r.id), "since": _when(r.since_ts, tz), "until": _when(r.until_ts, tz),
             "kind": run_kind(r.since_ts, r.until_ts, r.purpose, cfg)} for r in conn.execute(q)]


def shown_run(store: Store, cfg: Config, run: str | int | None = None, *,
              allocation_id: int | None = None) -> dict[str, Any]:
    """Which run every page and command shows (the one rule: the report, the nudges, the web pages, the
    overview, the findings, ``gpu-audit job`` and the allocation page): ``run`` (``--run``, ``?run=``) when
    given, else the weekly audit run of the latest window (a chargeback run or an ad-hoc audit of another
    window never silently replaces it), else the latest audit that is no chargeback run, else the latest run.
    With ``allocation_id`` (one allocation's view) the same order over the runs that judged it, so its page
    shows the report's figures. Returns ``{"id", "chosen", "why", "runs"}`` (``id`` None: no run judged the
    allocation yet); a bad or unknown ``run`` is a one-line error (the web answers 404)."""
    if run not in (None, ""):
        try:
            rid = parse_uint(run, hi=INT32_MAX, what="run")
        except ValueError:
            raise GpuAuditError(f"run {str(run)[:20]!r} is not a run id") from None
        with store.engine.connect() as conn:
            load_run(conn, rid)  # no such run, or not ok: one line
            listed = runs(conn, cfg)
        return {"id": rid, "chosen": True, "why": "chosen", "runs": listed}
    of = ""
    with store.engine.connect() as conn:
        listed = runs(conn, cfg)
        pool = listed
        if allocation_id is not None:
            judged = {int(r[0]) for r in conn.execute(text(
                "SELECT run_id FROM usage_allocation WHERE allocation_id = :a"), {"a": allocation_id})}
            pool = [r for r in runs(conn, cfg, limit=100_000) if r["id"] in judged]
            of = " that judged this allocation"
            if not pool:
                return {"id": None, "chosen": False, "why": "no audit run judged it yet", "runs": listed}
        elif len(listed) == RUNS_LISTED and not any(r["kind"] == "weekly audit" for r in listed):
            pool = runs(conn, cfg, limit=100_000)  # a long tail of other runs: look further back
    for want, why in (("weekly audit", f"the latest weekly audit{of}"),
                      (None, f"the latest audit{of} that is no chargeback run: none covers report.days "
                             f"({cfg.report.days:g} days)")):
        for r in pool:
            if r["kind"] == want or (want is None and r["kind"] != "chargeback"):
                return {"id": r["id"], "chosen": False, "why": why, "runs": listed}
    if pool:
        return {"id": pool[0]["id"], "chosen": False, "why": f"the latest run{of} (only chargeback runs are stored)",
                "runs": listed}
    return {"id": latest_ok_run(store), "chosen": False, "why": "the latest run", "runs": listed}


def run_rank(conn: Connection, cfg: Config) -> dict[int, int]:
    """Every official ok run's place in :func:`shown_run`'s order (0 first): weekly audits, the latest window
    first; then other audits that are no chargeback run; then chargeback runs. A list of allocations
    (``gpu-audit jobs``) takes for each the best-placed run that judged it: the one rule, per allocation."""
    listed = runs(conn, cfg, limit=100_000)
    order = ([r for r in listed if r["kind"] == "weekly audit"]
             + [r for r in listed if r["kind"] not in ("weekly audit", "chargeback")]
             + [r for r in listed if r["kind"] == "chargeback"])
    return {r["id"]: i for i, r in enumerate(order)}


def latest_ok_run(store: Store) -> int:
    """The newest official (not what-if) ok run, or a one-line error telling what to run."""
    from auditor.audit.run import latest_run

    rid = latest_run(store)
    if rid is None:
        raise GpuAuditError("no finished audit run in the store: run `gpu-audit audit` first")
    return int(rid)


def run_for_window(store: Store, since: datetime, until: datetime) -> int:
    """The newest ok run whose window lies inside [since, until]."""
    t = schema.audit_runs
    with store.engine.connect() as conn:
        rid = conn.execute(select(t.c.id).where(
            t.c.status == "ok", t.c.what_if.is_(False), t.c.since_ts >= int(since.timestamp()),
            t.c.until_ts <= int(until.timestamp())).order_by(t.c.id.desc()).limit(1)).scalar()
    if rid is None:
        raise GpuAuditError(f"no ok audit run inside {since.isoformat()} .. {until.isoformat()}: run "
                            "`gpu-audit audit` with that --since/--until first")
    return int(rid)


ACTIONS_N = 5  # actions the weekly email leads with
ACTION_FOLD = 3  # a user with this many idle allocations is one action (talk to them), not several


def job_ref(source: str, cluster: str, external_id: str, account: str | None, name: str | None) -> str:
    """The REF ``gpu-audit job`` takes for an allocation (what ``gpu-audit jobs`` prints): CLUSTER:NAMESPACE/POD
    for a pod, CLUSTER:JOBID otherwise."""
    if source == "kubernetes" and account and name:
        return f"{cluster}:{account}/{name}"
    return f"{cluster}:{external_id}"


def web_link(cfg: Config, path: str, **query: Any) -> str | None:
    """``path`` on the web UI at ``web.base_url`` (None when it is not set: emails then name commands only)."""
    if not cfg.web.base_url:
        return None
    q = urlencode({k: v for k, v in query.items() if v is not None})
    return cfg.web.base_url.rstrip("/") + path + (f"?{q}" if q else "")


def allocation_links(conn: Connection, cfg: Config, ids: list[int]) -> dict[int, dict[str, Any]]:
    """Where to look further at each allocation: its REF, the ``gpu-audit job`` command and its web page
    (the report's actions and the nudges say the same)."""
    t = schema.allocations
    out: dict[int, dict[str, Any]] = {}
    ids = sorted(set(ids))
    for i in range(0, len(ids), 500):
        for a in conn.execute(select(t.c.id, t.c.cluster, t.c.source, t.c.external_id, t.c.account, t.c.name)
                              .where(t.c.id.in_(ids[i:i + 500]))):
            ref = job_ref(a.source, a.cluster, a.external_id, a.account, a.name)
            out[int(a.id)] = {"ref": ref, "command": "gpu-audit job " + shlex.quote(ref),
                              "url": web_link(cfg, f"/allocation/{int(a.id)}")}
    return out


def actions_section(conn: Connection, cfg: Config, run_id: int, tz: Any, h: dict[str, Any]) -> dict[str, Any]:
    """This week's actions: the few allocations, users and idle reservations worth the most idle cost, each
    with who, what, how much, what to do and where to look further.

    An allocation's figures are those its nudge shows (:func:`finding_totals` over the nudged kinds, each
    allocation counted once); a user with ACTION_FOLD or more such allocations is one action, their sum; an
    idle reservation's are the GPU-hours no job used (what idle totals add: :func:`reservation_unused`).
    ``totals.share`` compares the actions with the week's idle cost (allocations plus reservations)."""
    where = " AND f.allocation_id IS NOT NULL"
    counted = finding_totals(conn, run_id, kinds.NUDGED, where=where)["by_allocation"]
    marks = ", ".join(f":k{i}" for i in range(len(kinds.NUDGED)))
    owner: dict[int, str] = {int(r.id): r.user_name or "" for r in conn.execute(text(
        "SELECT a.id, a.user_name FROM allocations a WHERE a.id IN (SELECT f.allocation_id FROM findings f "
        f"WHERE f.run_id = :run AND f.kind IN ({marks}) AND f.allocation_id IS NOT NULL)"),
        {"run": run_id, **{f"k{i}": k for i, k in enumerate(kinds.NUDGED)}})} if counted else {}
    by_user: dict[str, list[int]] = {}
    for aid, c in counted.items():
        if c["cost"] > 0 or c["idle_gpu_hours"] > 0:
            by_user.setdefault(owner.get(aid, ""), []).append(aid)
    cands: list[dict[str, Any]] = []
    for user, ids in by_user.items():
        ids.sort(key=lambda a: (-counted[a]["cost"], -counted[a]["idle_gpu_hours"], a))
        groups = [ids] if user and len(ids) >= ACTION_FOLD else [[a] for a in ids]
        for g in groups:
            cands.append({"scope": "user" if len(g) > 1 else "allocation", "ids": g, "key": str(g[0]),
                          "cost": sum(counted[a]["cost"] for a in g),
                          "idle_gpu_hours": sum(counted[a]["idle_gpu_hours"] for a in g)})
    for r in conn.execute(text(
            "SELECT f.id, f.cluster, f.account, f.team, f.user_name, f.evidence, r.name AS reservation_name "
            "FROM findings f LEFT JOIN reservations r ON r.id = f.reservation_id WHERE f.run_id = :run "
            "AND f.kind = 'idle_reservation'"), {"run": run_id}):
        ev = _evidence(r.evidence)
        ih, c = reservation_unused(ev)
        if ih > 0:
            cands.append({"scope": "reservation", "ids": [], "key": f"r{r.id}", "cost": c, "idle_gpu_hours": ih,
                          "cluster": r.cluster, "account": r.account or "", "team": r.team or "",
                          "user": r.user_name or "",
                          "name": r.reservation_name or str(ev.get("reservation") or "")})
    cands.sort(key=lambda c: (-c["cost"], -c["idle_gpu_hours"], c["scope"], c["key"]))
    chosen = cands[:ACTIONS_N]
    lead = [c["ids"][0] for c in chosen if c["ids"]]
    first: dict[int, dict[str, Any]] = {}
    named: dict[int, list[str]] = {}
    if lead:
        table = findings_table(conn, run_id, kinds.NUDGED, tz, full=True, top_n=0,
                               where=f" AND f.allocation_id IN ({', '.join(str(int(a)) for a in lead)})")
        for f in table["rows"]:  # costliest first: an allocation's first row is its costliest finding
            first.setdefault(f["allocation_id"], f)
            named.setdefault(f["allocation_id"], []).append(f["kind"])
    links = allocation_links(conn, cfg, lead)
    rows = []
    for c in chosen:
        base = {"scope": c["scope"], "cost": c["cost"], "idle_gpu_hours": c["idle_gpu_hours"],
                "allocations": len(c["ids"])}
        if c["scope"] == "reservation":
            rows.append({**base, "user": c["user"], "team": c["team"], "account": c["account"],
                         "cluster": c["cluster"], "name": c["name"], "kind": "idle_reservation", "source": "",
                         "job_id": "", "allocation_id": None, "advice": ADVICE["idle_reservation"], "ref": None,
                         "command": None,
                         "url": web_link(cfg, "/findings", kind="idle_reservation", run=run_id)})
            continue
        aid = c["ids"][0]
        f = first.get(aid) or {}
        kind = f.get("kind", "")
        user = owner.get(aid, f.get("user", ""))
        row = {**base, "user": user, "team": f.get("team", ""), "account": f.get("account", ""),
               "cluster": f.get("cluster", ""), "name": f.get("job_name", ""),
               "kind": ", ".join(named.get(aid, [kind])), "source": f.get("source", ""),
               "job_id": f.get("job_id", ""), "allocation_id": aid, "advice": ADVICE.get(kind, ""),
               **links.get(aid, {"ref": None, "command": None, "url": None})}
        if c["scope"] == "user":
            row.update(command="gpu-audit jobs --user " + shlex.quote(user),
                       url=web_link(cfg, "/findings", user=user, run=run_id))
        rows.append(row)
    week = (h.get("idle_cost") or 0.0) + (h.get("idle_reservation_cost") or 0.0)
    cost = sum(r["cost"] for r in rows)
    return {"rows": rows, "total": len(cands), "shown": len(rows), "cut": len(cands) > len(rows),
            "totals": {"cost": cost, "idle_gpu_hours": sum(r["idle_gpu_hours"] for r in rows),
                       "week_idle_cost": week, "share": cost / week if week > 0 else None}}


def build_context(store: Store, cfg: Config, run_id: int, *, full: bool = False,
                  now: datetime | None = None, keep: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything a report shows about run ``run_id``; ``full`` keeps every table row (JSON export).
    ``keep``, when given, receives the uncut team and account tables (the streamed JSON export uses them
    rather than query them again)."""
    tz = _tz(cfg)
    n = cfg.report.top_n
    with store.engine.connect() as conn:
        run = load_run(conn, run_id)
        totals = usage_totals(conn, run_id)
        groups = {"teams": usage_group_rows(conn, run_id, ["u.team"]),
                  "accounts": usage_group_rows(conn, run_id, ["a.cluster", "a.account", "u.team"])}
        if keep is not None:
            keep.update({k: group_table(v, totals, full=True, top_n=n) for k, v in groups.items()})
        summary = dict(run["summary"] or {})
        th = dict(run["thresholds"] or cfg.thresholds.model_dump())
        ctx: dict[str, Any] = {
            "schema": SCHEMA, "generated": _when(int((now or utcnow()).timestamp()), tz),
            "run": {"id": run["id"], "since": _when(run["since_ts"], tz), "until": _when(run["until_ts"], tz),
                    "since_ts": run["since_ts"], "until_ts": run["until_ts"],
                    "days": (run["until_ts"] - run["since_ts"]) / 86400.0},
            "currency": summary.get("currency") or cfg.prices.currency, "top_n": n, "full": full,
            "headline": headline(summary),
            "actions": actions_section(conn, cfg, run_id, tz, headline(summary)),
            "teams": group_table(groups["teams"], totals, full=full, top_n=n),
            "budgets": team_budgets(cfg, groups["teams"], run["until_ts"] - run["since_ts"]),
            "accounts": group_table(groups["accounts"], totals, full=full, top_n=n),
            "top_idle": findings_table(conn, run_id, IDLE_KINDS, tz, full=full, top_n=n,
                                       where=" AND f.allocation_id IS NOT NULL"),
            # GPUs nobody held that read busy: for operations, no reserved or idle hours
            "ghosts": findings_table(conn, run_id, ("ghost_busy",), tz, full=full, top_n=n,
                                     where=" AND f.allocation_id IS NULL"),
            "coverage": coverage_section(conn, run, cfg, full=full),
            "trend": trend(conn, run, tz), "thresholds": th,
            "capacity": list(summary.get("capacity") or []),
            "energy": summary.get("energy"),
            "judged": judged_in_words(th),
            "verification": verification_section(summary),
            "definitions": {k: v.format(**{**cfg.thresholds.model_dump(), **th}) for k, v in DEFINITIONS.items()},
            "files": {"json": f"report-{run_id}.json", "csv": f"findings-{run_id}.csv"},
            **summary_sections(conn, run_id, summary, th, tz, full=full, top_n=n, fabric_nodes=fabric_named(cfg)),
        }
        for key, names in SECTION_KINDS.items():
            ctx[key] = findings_table(conn, run_id, names, tz, full=full, top_n=n)
        ctx["goodput"] = goodput_section(conn, cfg, run_id, th, tz, full=full, top_n=n)
    from auditor.audit.exempt import report_section  # enforcement: active exemptions and the audit log

    ctx["enforcement"] = report_section(store, cfg, run["since_ts"], int((now or utcnow()).timestamp()),
                                        lambda ts: _when(ts, tz))
    return ctx


def goodput_section(conn: Connection, cfg: Config, run_id: int, th: dict[str, Any], tz: Any, *, full: bool,
                    top_n: int, tensor_rows: bool = True) -> dict[str, Any]:
    """The Goodput section (lost GPU-hours by cause, auditor/audit/goodput.py) with its findings table; the
    report and the streamed JSON export (``full``; ``tensor_rows`` False: it spools the per-allocation Tensor
    rows itself) both build it here."""
    out = goodput.section(conn, run_id, goodput.run_thresholds(th, cfg.thresholds), full=full, top_n=top_n,
                          tensor_rows=tensor_rows)
    out["findings"] = findings_table(conn, run_id, kinds.of_section("goodput"), tz, full=full, top_n=top_n)
    return out


def fabric_named(cfg: Config) -> dict[str, list[str]]:
    """Per cluster, the node patterns its config names fabric nodes (``clusters[].fabric_nodes``)."""
    return {c.name: list(c.fabric_nodes) for c in cfg.clusters if c.fabric_nodes}


def summary_sections(conn: Connection, run_id: int, summary: dict[str, Any], th: dict[str, Any], tz: Any, *,
                     full: bool, top_n: int, fabric_nodes: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """The sections made from the run summary (and small per-user reads), cut at top_n unless ``full``: the
    streamed JSON export (:mod:`auditor.report.export`) rebuilds exactly these uncut."""
    from auditor.audit import fabric

    return {"fabric": fabric.section(conn, run_id, full=full, top_n=top_n, fabric_nodes=fabric_nodes),
            "congested_ports": fabric.ports_section(conn, run_id, full=full, top_n=top_n),
            "right_sizing": sizing.right_sizing(summary, full=full, top_n=top_n),
            "request_hygiene": sizing.request_hygiene(conn, run_id, full=full, top_n=top_n,
                                                      teams=summary.get("request_hygiene_by_team")),
            "nodes": nodes_section(summary, th, lambda ts: _when(ts, tz), full=full, top_n=top_n),
            "opportunity": opportunity_section(summary, full=full, top_n=top_n),
            "inference": inference_section(summary, full=full, top_n=top_n),
            "waiting": waiting_section(summary, full=full, top_n=top_n)}


def opportunity_section(s: dict[str, Any], *, full: bool, top_n: int) -> dict[str, Any] | None:
    """Idle GPU-hours while GPU jobs waited (per cluster, per team) and GPU quotas held versus used; None
    when no job waited and no quota is known (older runs have no such summary)."""
    o = s.get("opportunity") or {}
    q, quotas = o.get("idle_while_queued") or {}, list(o.get("quotas") or [])
    if not q.get("waiting_jobs") and not quotas:
        return None
    teams = sorted(q.get("by_team") or [], key=lambda r: -r["idle_gpu_hours"])
    return {"by_cluster": list(q.get("by_cluster") or []), "by_team": teams if full else teams[:top_n],
            "teams_more": 0 if full else max(0, len(teams) - top_n),
            "waiting_jobs": q.get("waiting_jobs", 0), "waiting_gpu_hours": q.get("waiting_gpu_hours", 0.0),
            "quotas": sorted(quotas, key=lambda r: (not r["reclaim"], -r["unused_gpus"]))}


def verification_section(s: dict[str, Any]) -> dict[str, Any]:
    """Reserved time verified by SM activity vs judged by GPU-Util only, per cluster and node group, with
    the advice to enable the profiling fields where only GPU-Util was there (issue 14)."""
    groups = list(s.get("verification_by_node_group") or [])
    missing = [g for g in groups if g.get("util_only_gpu_hours") or g.get("counters_gpu_hours")]
    return {"clusters": list(s.get("verification_by_cluster") or []), "node_groups": groups,
            "missing": missing, "advice": s.get("advice")}


def headline(s: dict[str, Any]) -> dict[str, Any]:
    """The summary's headline numbers plus the shares a reader compares."""
    reserved = s.get("reserved_gpu_hours") or 0.0
    return {"allocations": s.get("allocations") or 0, "reserved_gpu_hours": reserved,
            "effective_gpu_hours": s.get("effective_gpu_hours") or 0.0,
            "idle_gpu_hours": s.get("idle_gpu_hours") or 0.0, "mirage_gpu_hours": s.get("mirage_gpu_hours") or 0.0,
            # not in idle_gpu_hours (allocations); None on runs from before it was kept
            "idle_reservation_gpu_hours": s.get("idle_reservation_gpu_hours"),
            "idle_reservation_cost": s.get("idle_reservation_cost"),
            "unknown_gpu_hours": s.get("unknown_gpu_hours") or 0.0,
            "infra_gpu_hours": s.get("infra_gpu_hours") or 0.0, "infra_cost": s.get("infra_cost") or 0.0,
            "idle_by_util_gpu_hours": s.get("idle_by_util_gpu_hours") or 0.0,
            "verified_gpu_hours": s.get("verified_gpu_hours") or 0.0,
            "util_only_gpu_hours": s.get("util_only_gpu_hours") or 0.0,
            "busy_unverified_gpu_hours": s.get("busy_unverified_gpu_hours") or 0.0,
            # the stock-counter tier (docs/definitions.md "Evidence tiers"); 0 on runs from before it
            "counters_gpu_hours": s.get("counters_gpu_hours") or 0.0,
            "idle_by_counters_gpu_hours": s.get("idle_by_counters_gpu_hours") or 0.0,
            "busy_by_counters_gpu_hours": s.get("busy_by_counters_gpu_hours") or 0.0,
            "engine_spin_gpu_hours": s.get("engine_spin_gpu_hours") or 0.0,
            "reserved_cost": s.get("reserved_cost") or 0.0, "idle_cost": s.get("idle_cost") or 0.0,
            "cost_per_effective_gpu_hour": s.get("cost_per_effective_gpu_hour"),
            "dashboard_busy": s.get("mean_gpu_util"), "sm_active": s.get("mean_sm_active"),
            "coverage": _ratio(s.get("observed_gpu_hours"), reserved - (s.get("infra_gpu_hours") or 0.0)),
            "idle_share": _ratio(s.get("idle_gpu_hours"), reserved),
            "findings": s.get("findings") or {}}


def findings_csv_rows(store: Store, cfg: Config, run_id: int) -> list[dict[str, Any]]:
    """Every finding of the run, flat, for the CSV the cut tables point to."""
    tz = _tz(cfg)
    with store.engine.connect() as conn:
        table = findings_table(conn, run_id, kinds.NAMES, tz, full=True, top_n=0)
    return [{k: v for k, v in r.items() if k != "sparkline"} for r in table["rows"]]


def waiting_section(s: dict[str, Any], *, full: bool, top_n: int) -> dict[str, Any] | None:
    """Where the reserved time went (auditor/audit/waiting.py), as the audit summed it: fleet, clusters,
    teams, and the jobs that waited most (``jobs``: those with waiting hours, each with its waiting classes,
    largest first). None on runs from before it was kept."""
    from auditor.audit.waiting import CLASSES, TOP_ALLOCATIONS, WAIT_CLASSES, WAIT_LISTED

    w = s.get("waiting")
    if not w:
        return None
    classes = [{"key": k, "label": CLASSES.get(k, k)} for k in w.get("classes") or CLASSES]
    teams = list(w.get("by_team") or [])
    allocs = list(w.get("allocations") or [])
    jobs = []
    for a in allocs:
        h = a.get("gpu_hours") or {}
        waits = sorted(((k, float(h.get(k) or 0.0)) for k in WAIT_CLASSES if (h.get(k) or 0.0) >= WAIT_LISTED),
                       key=lambda kv: -kv[1])
        if waits:
            jobs.append({**{k: a.get(k) for k in ("cluster", "team", "job_id", "name", "reserved_gpu_hours")},
                         "wait_gpu_hours": sum(v for _, v in waits),
                         "waits": [{"key": k, "label": CLASSES.get(k, k), "gpu_hours": v} for k, v in waits]})
    jobs.sort(key=lambda j: -j["wait_gpu_hours"])
    shown = jobs if full else jobs[:top_n]
    # every job that waited (the audit counts them; it keeps the TOP_ALLOCATIONS that waited most), less those
    # listed: "N more" names what was left out, by the report or by the audit (runs from before it counted: 0)
    waited = max(int(w.get("waited_jobs") or 0), len(jobs))
    more_h = max(0.0, float(w.get("waited_gpu_hours") or 0.0) - sum(j["wait_gpu_hours"] for j in shown))
    return {"classes": classes, "total": w.get("total") or {}, "by_cluster": list(w.get("by_cluster") or []),
            "by_team": teams if full else teams[:top_n], "teams_more": 0 if full else max(0, len(teams) - top_n),
            "allocations": allocs if full else allocs[:top_n], "jobs": shown, "jobs_total": waited,
            "jobs_more": waited - len(shown), "jobs_more_gpu_hours": more_h,
            "jobs_more_in_json": len(jobs) - len(shown), "jobs_kept": TOP_ALLOCATIONS}
