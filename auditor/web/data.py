"""What each web page shows, as plain JSON-serialisable dicts: the page renders it and ``/api/...`` returns
it unchanged, so the numbers cannot disagree. Read-only SELECTs over one audit run.

``user`` is the viewer's scope: None for an admin (everything), else a user name, and every query then
keeps only that user's allocations (usage, findings, allocation pages, chargeback).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, text

from auditor.audit import kinds
from auditor.config import Config
from auditor.errors import GpuAuditError
from auditor.intparse import INT32_MAX, parse_uint, uint_or_none
from auditor.report import context as report
from auditor.report.chargeback import chargeback, totals
from auditor.report.context import USAGE_SUMS, _usage_row
from auditor.store.engine import Store

GROUPS = {"teams": ("u.team", "Team"), "users": ("a.user_name", "User"), "clusters": ("a.cluster", "Cluster"),
          "accounts": ("a.account", "Account / namespace")}
SORTS = {"cost": "f.cost", "idle": "f.idle_gpu_hours", "gpu_hours": "f.gpu_hours", "start": "f.start_ts",
         "kind": "f.kind", "user": "f.user_name"}
FILTERS = ("kind", "cluster", "team", "user", "account")
ALL_KINDS = kinds.NAMES  # every finding kind (the registry)


def pick_run(store: Store, run: str | int | None) -> int:
    """``?run=`` or the latest official ok run; a bad value is a one-line error (HTTP 404)."""
    if run in (None, ""):
        return report.latest_ok_run(store)
    try:
        return parse_uint(run, hi=INT32_MAX, what="run")
    except ValueError:
        raise GpuAuditError(f"run {str(run)[:20]!r} is not a run id") from None


def _scoped(user: str | None, alias: str = "a") -> tuple[str, dict[str, Any]]:
    return ("", {}) if user is None else (f" AND {alias}.user_name = :viewer", {"viewer": user})


def run_info(conn: Connection, run_id: int, cfg: Config) -> dict[str, Any]:
    run = report.load_run(conn, run_id)
    tz = report._tz(cfg)
    return {"id": run_id, "since": report._when(run["since_ts"], tz), "until": report._when(run["until_ts"], tz),
            "since_ts": run["since_ts"], "until_ts": run["until_ts"]}, run


def overview(store: Store, cfg: Config, run_id: int, user: str | None) -> dict[str, Any]:
    """Headline, week-over-week trend and coverage per cluster (of the viewer's allocations if scoped)."""
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
    head["findings"] = kinds
    return {"schema": "gpu-audit.web.overview/1", "run": info, "scope": user, "currency": cfg.prices.currency,
            "headline": head, "trend": trend, "coverage": clusters}


RAW = ("allocations", "reserved_s", "observed_s", "idle_s", "mirage_s", "effective_s", "unknown_s", "gpu_util_s",
       "util_observed_s", "sm_s", "sm_observed_s", "reserved_cost", "idle_cost")


def groups(store: Store, cfg: Config, run_id: int, kind: str, user: str | None, *, page: int = 1
           ) -> dict[str, Any]:
    """Usage by team, user, cluster or account, worst idle cost first, paged by ``web.page_rows``.

    One grouped scan: rows, their count and the totals all come from it (groups are few next to rows)."""
    col, label = GROUPS[kind]
    w, p = _scoped(user)
    n = cfg.web.page_rows
    off = max(0, page - 1) * n
    with store.engine.connect() as conn:
        info, _ = run_info(conn, run_id, cfg)
        raw = [dict(r._mapping) for r in conn.execute(text(
            f"SELECT {col} AS name, {USAGE_SUMS} FROM usage_allocation u JOIN allocations a ON a.id = "
            f"u.allocation_id WHERE u.run_id = :run{w} GROUP BY {col}"), {"run": run_id, **p})]
    raw.sort(key=lambda r: (-(r["idle_cost"] or 0.0), -(r["reserved_s"] or 0.0), r["name"] or ""))
    tot = {k: sum((r[k] or 0) for r in raw) for k in RAW}
    rows = [{"name": r["name"] or "", **_usage_row(r)} for r in raw[off:off + n]]
    return {"schema": "gpu-audit.web.groups/1", "run": info, "scope": user, "currency": cfg.prices.currency,
            "kind": kind, "label": label, "rows": rows, "total": len(raw), "page": page, "page_rows": n,
            "totals": _usage_row(tot)}


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
    n = cfg.web.page_rows
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
    return {"schema": "gpu-audit.web.findings/1", "run": info, "scope": user, "currency": cfg.prices.currency,
            "filters": chosen, "sort": sort, "order": order.lower(), "page": page, "page_rows": n,
            "total": t["findings"], "totals": {k: v for k, v in t.items() if k != "by_allocation"},
            "rows": rows, "options": options}


def chargeback_rows(store: Store, cfg: Config, run_id: int, user: str | None, by: str, *, page: int | None = None
                    ) -> dict[str, Any]:
    """Chargeback of the run's window (no new audit); a scoped viewer gets their own user row only.
    ``page`` cuts the rows to one page of ``web.page_rows`` (totals still cover all; the CSV takes all)."""
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
    n = cfg.web.page_rows
    shown = rows if page is None else rows[(page - 1) * n:page * n]
    return {"schema": "gpu-audit.web.chargeback/1", "run": info, "scope": user, "by": by,
            "currency": cfg.prices.currency, "rows": shown, "total": len(rows), "page": page or 1,
            "page_rows": n if page is not None else len(rows), "totals": totals(rows), "since": since, "until": until}
