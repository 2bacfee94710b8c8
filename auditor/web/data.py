"""What each web page shows, as plain JSON-serialisable dicts: the page renders it and ``/api/...`` returns
it unchanged, so the numbers cannot disagree. Read-only SELECTs over one audit run.

``user`` is the viewer's scope: None for an admin (everything), else a user name, and every query then
keeps only that user's allocations (usage, findings, allocation pages, chargeback).
"""

from __future__ import annotations

import copy
import threading
from typing import Any

from sqlalchemy import Connection, bindparam, text

from auditor.audit import kinds
from auditor.config import Config
from auditor.intparse import INT32_MAX, uint_or_none
from auditor.report import context as report
from auditor.report.chargeback import chargeback, totals
from auditor.report.context import USAGE_SUMS, _usage_row
from auditor.report.inference import inference_section
from auditor.report.words import ADVICE
from auditor.store.engine import Store

#: Rows per page in the web UI's lists (the CSV takes all; a `web` setting until issue 45)
PAGE_ROWS = 100

GROUPS = {"teams": ("u.team", "Team"), "users": ("a.user_name", "User"), "clusters": ("a.cluster", "Cluster"),
          "accounts": ("a.account", "Account / namespace")}
SORTS = {"cost": "f.cost", "idle": "f.idle_gpu_hours", "gpu_hours": "f.gpu_hours", "start": "f.start_ts",
         "kind": "f.kind", "user": "f.user_name"}
FILTERS = ("kind", "cluster", "team", "user", "account")
ALL_KINDS = kinds.NAMES  # every finding kind (the registry)


TOP = 5  # rows of each "who" table on the front page
WHO_CACHED = 8  # runs whose who tables an app keeps (they scan every allocation of the run)
_WHO_LOCK = threading.Lock()  # uvicorn answers sync pages from a thread pool


run_kind = report.run_kind
runs = report.runs


def pick_run(store: Store, cfg: Config, run: str | int | None) -> dict[str, Any]:
    """Which run a page shows (:func:`auditor.report.context.shown_run`, the rule every surface uses):
    ``?run=`` when given; a bad or unknown ``?run=`` is a one-line error (HTTP 404)."""
    return report.shown_run(store, cfg, run)


def _scoped(user: str | None, alias: str = "a") -> tuple[str, dict[str, Any]]:
    return ("", {}) if user is None else (f" AND {alias}.user_name = :viewer", {"viewer": user})


def run_info(conn: Connection, run_id: int, cfg: Config) -> dict[str, Any]:
    run = report.load_run(conn, run_id)
    tz = report._tz(cfg)
    return {"id": run_id, "since": report._when(run["since_ts"], tz), "until": report._when(run["until_ts"], tz),
            "since_ts": run["since_ts"], "until_ts": run["until_ts"],
            "kind": run_kind(run["since_ts"], run["until_ts"], (run["summary"] or {}).get("purpose"), cfg)}, run


def say_run(data: dict[str, Any], choice: dict[str, Any], cfg: Config) -> None:
    """Add to a page's data which run it shows and why (chosen, or the latest weekly audit), and the runs
    the picker offers: every page says which run its figures come from."""
    data["run"] = {**data["run"], "chosen": choice["chosen"], "why": choice["why"]}
    data["runs"] = choice["runs"]


def overview(store: Store, cfg: Config, run_id: int, user: str | None, *, mine: str | None = None,
             cache: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Headline, who (top teams, users and allocations by idle cost), week-over-week trend, coverage per
    cluster and one user's allocations ("my jobs": the viewer's own when scoped, else ``mine``). ``cache``
    (the app's) keeps the whole fleet's who tables per run: an ok run's usage rows are never rewritten.

    The teams and users are the report's own group rows (:func:`auditor.report.context.usage_group_rows`)
    cut at :data:`TOP`; the allocations are ranked by their own idle cost (each allocation once)."""
    tz = report._tz(cfg)
    w, p = _scoped(user)
    with store.engine.connect() as conn:
        info, run = run_info(conn, run_id, cfg)
        if user is None:
            head = report.headline(dict(run["summary"] or {}))
            trend = report.trend(conn, run, tz)
        else:
            u = report.usage_of(conn, run_id, user=user)
            head = {**u, "dashboard_busy": u["mean_gpu_util"], "sm_active": u["mean_sm_active"],
                    "idle_share": report._ratio(u["idle_gpu_hours"], u["reserved_gpu_hours"]), "findings": {}}
            trend = []
            for pt in report.trend(conn, run, tz):
                x = report.usage_of(conn, pt["run_id"], user=user)
                trend.append({**pt, "idle_gpu_hours": x["idle_gpu_hours"], "idle_cost": x["idle_cost"],
                              "reserved_gpu_hours": x["reserved_gpu_hours"],
                              "effective_gpu_hours": x["effective_gpu_hours"],
                              "cost_per_effective_gpu_hour": x["cost_per_effective_gpu_hour"]})
            prev = None
            for pt in trend:
                pt["idle_change"] = pt["idle_gpu_hours"] - prev["idle_gpu_hours"] if prev else None
                prev = pt
        clusters = [{"cluster": r.cluster, **_usage_row(dict(r._mapping))} for r in conn.execute(text(
            f"SELECT a.cluster, {USAGE_SUMS} FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id "
            f"WHERE u.run_id = :run{w} GROUP BY a.cluster ORDER BY a.cluster"), {"run": run_id, **p})]
        kinds = dict(head.get("findings") or {}) if user is None else {r.kind: int(r.n) for r in conn.execute(text(
            f"SELECT f.kind, COUNT(*) AS n FROM findings f LEFT JOIN allocations a ON a.id = f.allocation_id "
            f"WHERE f.run_id = :run{w} GROUP BY f.kind ORDER BY f.kind"), {"run": run_id, **p})}
        if user is None and cache is not None:  # an ok run's usage never changes: rank it once per app
            with _WHO_LOCK:
                if run_id not in cache:
                    while len(cache) >= WHO_CACHED:
                        cache.pop(next(iter(cache)))
                    cache[run_id] = top_who(conn, cfg, run_id, None, tz)
                who = copy.deepcopy(cache[run_id])
        else:
            who = top_who(conn, cfg, run_id, user, tz)
        me = user if user is not None else ((mine or "").strip() or None)
        jobs = allocation_rows(conn, run_id, tz, user=me, limit=PAGE_ROWS) if me is not None else None
        # this week's actions: the email's and the report's own computation (one function ranks them), a
        # scoped viewer's own among them
        acts = report.actions_section(conn, cfg, run_id, tz, report.headline(dict(run["summary"] or {})))
        if user is not None:
            acts = {**acts, "rows": [r for r in acts["rows"] if r["user"] == user and r["scope"] != "reservation"]}
    head["findings"] = kinds
    # where the waiting goes: the run summary's one computation, as the report shows it (the fleet's only: the
    # summary is not kept per user)
    waiting = report.waiting_section(dict(run["summary"] or {}), full=False, top_n=TOP) if user is None else None
    return {"schema": "gpu-audit.web.overview/2", "run": info, "scope": user, "currency": cfg.prices.currency,
            "headline": head, "who": who, "trend": trend, "earlier": earlier_window(info, len(trend)),
            "coverage": clusters, "mine": jobs, "waiting": waiting, "actions": acts}


def top_who(conn: Connection, cfg: Config, run_id: int, user: str | None, tz: Any) -> dict[str, Any]:
    """Who idled the most: teams and users (the report's group rows; a scoped viewer gets none, only their
    own allocations) and the allocations of the most idle cost (each once, as the users page sums them).
    ``user_names``: every user of the run (the user picker)."""
    jobs = allocation_rows(conn, run_id, tz, user=user, limit=TOP, idle_only=True)
    if user is not None:
        return {"teams": None, "users": None, "jobs": jobs, "user_names": [user]}
    totals = report.usage_totals(conn, run_id)
    users = report.usage_group_rows(conn, run_id, ["a.user_name"])
    return {"teams": report.group_table(report.usage_group_rows(conn, run_id, ["u.team"]), totals, full=False,
                                        top_n=TOP),
            "users": report.group_table(users, totals, full=False, top_n=TOP), "jobs": jobs,
            "user_names": sorted({r["user_name"] or "" for r in users} - {""})[:USER_NAMES]}


USER_NAMES = 2000  # names the user picker suggests


def earlier_window(info: dict[str, Any], points: int) -> dict[str, str] | None:
    """With a single window in the trend, the window before it (what to audit for a second bar)."""
    if points > 1:
        return None
    from datetime import UTC, datetime

    length = info["until_ts"] - info["since_ts"]
    return {k: datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%MZ")
            for k, ts in (("since", info["since_ts"] - length), ("until", info["since_ts"]))}


ALLOCATION_COLS = ("a.id, a.cluster, a.source, a.external_id, a.name, a.user_name, a.account, a.state, "
                   "a.start_ts, a.end_ts, a.gpu_count, u.team")


def allocation_rows(conn: Connection, run_id: int, tz: Any, *, user: str | None, limit: int,
                    idle_only: bool = False) -> dict[str, Any]:
    """Allocations the run judged (``user``'s only when given; with idle cost only if ``idle_only``), worst
    idle cost first, cut at ``limit``: each with its usage (the users page's sums, per allocation, so a
    user's rows add up to that user's row), its findings' kinds and the advice of its costliest finding;
    ``totals`` over all of them (:func:`auditor.report.context.usage_of` for a user)."""
    where, p = "", {"run": run_id}
    join = ""
    if user is not None:
        where, p["who"], join = " AND a.user_name = :who", user, " JOIN allocations a ON a.id = u.allocation_id"
    if idle_only:
        where += " AND u.idle_cost > 0"
    # the page's allocations first (one usage row each: no grouping over the whole run), then their rows
    ids = [int(r[0]) for r in conn.execute(text(
        f"SELECT u.allocation_id FROM usage_allocation u{join} WHERE u.run_id = :run{where} "
        f"ORDER BY u.idle_cost DESC, u.reserved_s DESC, u.allocation_id DESC LIMIT {int(limit)}"), p)]
    raw = [dict(r._mapping) for r in conn.execute(text(
        f"SELECT {ALLOCATION_COLS}, {USAGE_SUMS} FROM usage_allocation u JOIN allocations a ON a.id = "
        f"u.allocation_id WHERE u.run_id = :run AND u.allocation_id IN ({', '.join(str(i) for i in ids)}) "
        f"GROUP BY {ALLOCATION_COLS}"), {"run": run_id})] if ids else []
    raw.sort(key=lambda r: (-(r["idle_cost"] or 0.0), -(r["reserved_s"] or 0.0), -int(r["id"])))
    found: dict[int, list[tuple[float, str]]] = {}
    if ids:
        for r in conn.execute(text("SELECT f.allocation_id, f.kind, f.cost FROM findings f WHERE f.run_id = :run "
                                   f"AND f.allocation_id IN ({', '.join(str(i) for i in ids)})"), {"run": run_id}):
            found.setdefault(int(r.allocation_id), []).append((float(r.cost or 0.0), r.kind))
    rows = []
    for r in raw:
        fs = sorted(found.get(int(r["id"]), []), key=lambda x: (-x[0], x[1]))
        rows.append({"allocation_id": int(r["id"]), "cluster": r["cluster"], "source": r["source"],
                     "job_id": r["external_id"], "job_name": r["name"] or "", "user": r["user_name"] or "",
                     "account": r["account"] or "", "team": r["team"] or "", "state": r["state"] or "",
                     "gpus": r["gpu_count"], "start": report._when(r["start_ts"], tz),
                     "end": report._when(r["end_ts"], tz), "kinds": sorted({k for _, k in fs}),
                     "advice": ADVICE.get(fs[0][1], "") if fs else "", **_usage_row(r)})
    out: dict[str, Any] = {"user": user, "rows": rows, "shown": len(rows)}
    if user is not None:
        out["totals"] = report.usage_of(conn, run_id, user=user)
        out["total"] = out["totals"]["allocations"]
    return out


RAW = ("allocations", "reserved_s", "observed_s", "idle_s", "mirage_s", "effective_s", "unknown_s", "gpu_util_s",
       "util_observed_s", "sm_s", "sm_observed_s", "reserved_cost", "idle_cost")


def groups(store: Store, cfg: Config, run_id: int, kind: str, user: str | None, *, page: int = 1
           ) -> dict[str, Any]:
    """Usage by team, user, cluster or account, worst idle cost first, paged by ``PAGE_ROWS``.

    One grouped scan: rows, their count and the totals all come from it (groups are few next to rows)."""
    col, label = GROUPS[kind]
    w, p = _scoped(user)
    n = PAGE_ROWS
    off = max(0, page - 1) * n
    with store.engine.connect() as conn:
        info, _ = run_info(conn, run_id, cfg)
        raw = [dict(r._mapping) for r in conn.execute(text(
            f"SELECT {col} AS name, {USAGE_SUMS} FROM usage_allocation u JOIN allocations a ON a.id = "
            f"u.allocation_id WHERE u.run_id = :run{w} GROUP BY {col}"), {"run": run_id, **p})]
        back = recovery(conn, cfg, run_id) if kind == "teams" and user is None else None
    raw.sort(key=lambda r: (-(r["idle_cost"] or 0.0), -(r["reserved_s"] or 0.0), r["name"] or ""))
    tot = {k: sum((r[k] or 0) for r in raw) for k in RAW}
    rows = [{"name": r["name"] or "", **_usage_row(r)} for r in raw[off:off + n]]
    return {"schema": "gpu-audit.web.groups/1", "run": info, "scope": user, "currency": cfg.prices.currency,
            "kind": kind, "label": label, "rows": rows, "total": len(raw), "page": page, "page_rows": n,
            "totals": _usage_row(tot), "recovery": back}


def recovery(conn: Connection, cfg: Config, run_id: int) -> dict[str, Any]:
    """How fast training comes back, per team and job (the teams page, unscoped): the report's computation
    (:func:`auditor.audit.goodput.recovery` beside :func:`auditor.audit.goodput.by_team`'s useful-time
    share), under the run's thresholds."""
    from auditor.audit import goodput

    run = conn.execute(text("SELECT since_ts, until_ts, thresholds FROM audit_runs WHERE id = :run"),
                       {"run": run_id}).one()
    stored = run.thresholds if isinstance(run.thresholds, dict) else goodput.json_object(run.thresholds)
    th = goodput.run_thresholds(stored or {}, cfg.thresholds)
    teams = goodput.by_team(conn, run_id, goodput.lost_runs(conn, run_id, th))
    return goodput.recovery(conn, run_id, th, int(run.since_ts), int(run.until_ts),
                            {t["team"]: t["useful_share"] for t in teams})


def services(store: Store, cfg: Config, run_id: int, user: str | None, *, page: int = 1) -> dict[str, Any]:
    """The run's inference services, dearest per million generated tokens first: the report's section
    (:func:`auditor.report.inference.inference_section` over the run summary auditor/audit/inference.py wrote,
    so the figures are the report's), uncut and paged by ``PAGE_ROWS``. A scoped viewer sees the
    services with a pod of theirs: the run's pods with inference figures (summary ``inference_tokens``) that are
    the viewer's, grouped into services by the audit's own key (cluster, namespace, workload:
    :func:`auditor.audit.inference.service_key`), so a same-named workload of another namespace never shows."""
    from auditor.audit.inference import LOW_CACHE_HIT_RATE, service_key, service_of

    n = PAGE_ROWS
    with store.engine.connect() as conn:
        info, run = run_info(conn, run_id, cfg)
        summary = run["summary"] or {}
        every = list(summary.get("inference") or [])
        if user is not None and every:
            ids = sorted(uint_or_none(k) or 0 for k in summary.get("inference_tokens") or {})
            mine = {service_key(r.cluster, r.account, service_of(r.owner_workload, r.name)) for r in conn.execute(
                text("SELECT cluster, account, owner_workload, name FROM allocations WHERE user_name = :viewer AND "
                     "id IN :ids").bindparams(bindparam("ids", expanding=True)), {"viewer": user, "ids": ids or [0]})}
            every = [s for s in every if service_key(s["cluster"], s.get("namespace"), s["service"]) in mine]
    sec = inference_section({"inference": every}, full=True, top_n=0) or {
        "rows": [], "total": 0, "totals": {"tokens": 0.0, "tokens_text": "0", "cost": 0.0, "gpu_hours": 0.0,
                                           "cost_per_million": None, "headroom": 0, "low_cache": 0,
                                           "left_of_knee": 0}}
    off = max(0, page - 1) * n
    return {"schema": "gpu-audit.web.services/1", "run": info, "scope": user, "currency": cfg.prices.currency,
            "rows": sec["rows"][off:off + n], "total": sec["total"], "page": page, "page_rows": n,
            "totals": sec["totals"], "low_cache_hit_rate": LOW_CACHE_HIT_RATE}


def fabric(store: Store, cfg: Config, run_id: int, user: str | None) -> dict[str, Any]:
    """Fabric fit and the congested ports of the run: the report's two sections (auditor/audit/fabric.py, one
    computation), uncut. A scoped viewer sees them over their own allocations only (the fabric nodes and the
    ports measured are counts of the fleet's)."""
    from auditor.audit import fabric as fab

    with store.engine.connect() as conn:
        info, _run = run_info(conn, run_id, cfg)
        fit = fab.section(conn, run_id, full=True, top_n=0, user=user, fabric_nodes=report.fabric_named(cfg))
        ports = fab.ports_section(conn, run_id, full=True, top_n=0, user=user)
    return {"schema": "gpu-audit.web.fabric/1", "run": info, "scope": user, "currency": cfg.prices.currency,
            "fit": fit, "ports": ports}


def findings(store: Store, cfg: Config, run_id: int, user: str | None, args: dict[str, str]) -> dict[str, Any]:
    """Findings with filters (kind, cluster, team, user, account, q = name contains) and sorting."""
    tz = report._tz(cfg)
    w, p = _scoped(user)
    where = w
    chosen = {}
    for k in FILTERS:
        v = (args.get(k) or "").strip()
        if v:
            col = {"user": "f.user_name"}.get(k, f"f.{k}")
            where += f" AND {col} = :f_{k}"
            p[f"f_{k}"] = v
            chosen[k] = v
    q = (args.get("q") or "").strip()
    if q:
        where += " AND (LOWER(a.name) LIKE :q ESCAPE '!' OR LOWER(a.external_id) LIKE :q ESCAPE '!')"
        p["q"] = "%" + q.lower().replace("!", "!!").replace("%", "!%").replace("_", "!_") + "%"
        chosen["q"] = q
    sort = args.get("sort") if args.get("sort") in SORTS else "cost"
    order = "ASC" if args.get("order") == "asc" else "DESC"
    n = PAGE_ROWS
    page = max(1, uint_or_none(args.get("page") or "1", hi=INT32_MAX) or 1)
    kinds_in = ", ".join(f"'{k}'" for k in ALL_KINDS)
    join = " LEFT JOIN allocations a ON a.id = f.allocation_id" if (user is not None or q) else ""
    base = f"FROM findings f{join} WHERE f.run_id = :run AND f.kind IN ({kinds_in}){where}"
    with store.engine.connect() as conn:
        info, _ = run_info(conn, run_id, cfg)
        # page ids first (no evidence read while sorting), then the page's full rows
        ids = [r[0] for r in conn.execute(text(
            f"SELECT f.id {base} ORDER BY {SORTS[sort]} {order}, f.id LIMIT {int(n)} OFFSET {(page - 1) * int(n)}"),
            {"run": run_id, **p})]
        rows = []
        if ids:
            got = {r.id: report.finding_row(dict(r._mapping), tz) for r in conn.execute(text(
                report.FINDING_SQL.format(kinds=kinds_in) + f" AND f.id IN ({', '.join(str(int(i)) for i in ids)})"),
                {"run": run_id})}
            rows = [got[i] for i in ids]
        # one grouped pass gives the filter options
        sj = " LEFT JOIN allocations a ON a.id = f.allocation_id" if user is not None else ""
        grouped = [tuple(r) for r in conn.execute(text(
            f"SELECT DISTINCT f.kind, f.cluster, f.team FROM findings f{sj} "
            f"WHERE f.run_id = :run AND f.kind IN ({kinds_in}){w}"), {"run": run_id, **_scoped(user)[1]})]
        # the totals: the one computation of findings totals (no GPU-hour added twice)
        t = report.finding_totals(conn, run_id, ALL_KINDS, where=where, params=p, join=join)
    options = {k: sorted({g[i] or "" for g in grouped})[:200] for i, k in enumerate(("kind", "cluster", "team"))}
    for r in rows:
        r.pop("sparkline", None)
        # each money column holds one thing: idle cost, or another kind of money named for what it is
        idle = r["kind"] in kinds.ADDS_TO_IDLE
        r["idle_cost"], r["other_cost"] = (r["cost"], None) if idle else (None, r["cost"])
        r["money_is"] = kinds.money_of(r["kind"])
    return {"schema": "gpu-audit.web.findings/1", "run": info, "scope": user, "currency": cfg.prices.currency,
            "filters": chosen, "sort": sort, "order": order.lower(), "page": page, "page_rows": n,
            "total": t["findings"], "totals": {k: v for k, v in t.items() if k != "by_allocation"},
            "rows": rows, "options": options}


def chargeback_rows(store: Store, cfg: Config, run_id: int, user: str | None, by: str, *, page: int | None = None
                    ) -> dict[str, Any]:
    """Chargeback of the run's window (no new audit); a scoped viewer gets their own user row only.
    ``page`` cuts the rows to one page of ``PAGE_ROWS`` (totals still cover all; the CSV takes all)."""
    from datetime import UTC, datetime

    with store.engine.connect() as conn:
        info, _ = run_info(conn, run_id, cfg)
    since = datetime.fromtimestamp(info["since_ts"], UTC)
    until = datetime.fromtimestamp(info["until_ts"], UTC)
    if user is not None:
        by = "user"
    rows = chargeback(store, cfg, since, until, by, run_id=run_id)
    if user is not None:
        rows = [r for r in rows if r["owner"] == user]
    n = PAGE_ROWS
    shown = rows if page is None else rows[(page - 1) * n:page * n]
    return {"schema": "gpu-audit.web.chargeback/1", "run": info, "scope": user, "by": by,
            "currency": cfg.prices.currency, "rows": shown, "total": len(rows), "page": page or 1,
            "page_rows": n if page is not None else len(rows), "totals": totals(rows), "since": since, "until": until}
