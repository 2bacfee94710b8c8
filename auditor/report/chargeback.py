"""Chargeback: one row per period x cluster x owner, rolled up from one audit run of exactly that window.

The schema is stable and documented in docs/chargeback.md (``SCHEMA`` names its version). Hours are
rounded to 6 decimals and costs to 4 with decimal arithmetic; unknown GPU-hours take the rounding residue,
so ``reserved = idle + mirage + low + working + busy_unverified + busy_by_counters + engine_spin + unknown +
infra + input_wait`` holds exactly in every row and in the totals (``infra``: infrastructure-affected GPU-hours,
a drained node or a GPU fault: its own column, never idle; ``input_wait``: a GPU its own job's input starved,
never idle either). The evidence-tier columns (docs/definitions.md "Evidence tiers") split the observed hours
exactly: ``verified + counters + util_only = reserved - unknown - infra``.
Reservation GPU-hours no job used are not charged here (they belong to no allocation); the audit reports
them as ``idle_reservation`` findings.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from datetime import UTC, date, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sqlalchemy import bindparam, text

from auditor import energy, jsonsafe
from auditor.config import Config
from auditor.errors import GpuAuditError
from auditor.report.outfile import write_text
from auditor.store.engine import Store

SCHEMA = "gpu-audit.chargeback/3"
BY = ("account", "namespace", "team", "user", "cluster", "qos", "state")
#: the stock-counter verdicts' GPU-hours (schema 3; docs/definitions.md "Evidence tiers")
COUNTER_HOURS = ("idle_by_counters", "busy_by_counters", "engine_spin")
HOURS = ("reserved", "effective", "idle", "idle_by_util", "mirage", "low", "working", "busy_unverified",
         "unknown", "infra", "input_wait", *COUNTER_HOURS)
#: GPU-hours judged on each evidence tier: SM activity, the stock counters, GPU-Util (derived from HOURS)
TIERS = ("verified", "counters", "util_only")
COLUMNS = ("period", "period_start", "period_end", "cluster", "owner_type", "owner", "allocations",
           *(f"{h}_gpu_hours" for h in HOURS[:-len(COUNTER_HOURS)]), "reserved_cost", "idle_cost",
           "cost_per_effective_gpu_hour", "currency", *energy.KEYS, "audit_run_id", "lost_gpu_hours", "tokens",
           *(f"{h}_gpu_hours" for h in COUNTER_HOURS), *(f"{t}_gpu_hours" for t in TIERS))
TEXT_COLUMNS = ("period", "period_start", "period_end", "cluster", "owner_type", "owner", "currency")
_OWNER = {"account": "a.account", "namespace": "a.account", "team": "u.team", "user": "a.user_name",
          "cluster": "a.cluster", "qos": "a.qos", "state": "a.state"}
#: usage_allocation sums the energy figures read (auditor/energy.py)
ENERGY_SUMS = ("reserved_s", "idle_s", "mirage_s", "energy_s", "power_observed_s", "idle_energy_s",
               "idle_power_observed_s")
H6, C4 = Decimal("0.000001"), Decimal("0.0001")
INJECTION_START = ("=", "+", "-", "@", "\t", "\r")


def report_tz(cfg: Config) -> Any:
    try:
        return ZoneInfo(cfg.report.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise GpuAuditError(f"report.timezone: unknown timezone {cfg.report.timezone!r}") from None


def month_window(period: str, tz: Any) -> tuple[datetime, datetime]:
    """``YYYY-MM`` -> [first midnight of the month, first midnight of the next) in ``tz``, as UTC."""
    try:
        y, m = (int(x) for x in period.split("-"))
        start = date(y, m, 1)
    except ValueError:
        raise GpuAuditError(f"--period {period!r}: expected a month as YYYY-MM") from None
    end = date(y + 1, 1, 1) if m == 12 else date(y, m + 1, 1)
    return (datetime(start.year, start.month, 1, tzinfo=tz).astimezone(UTC),
            datetime(end.year, end.month, 1, tzinfo=tz).astimezone(UTC))


def previous_month(now: datetime, tz: Any) -> str:
    local = now.astimezone(tz)
    return f"{local.year - 1}-12" if local.month == 1 else f"{local.year}-{local.month - 1:02d}"


def _q(x: float | None, unit: Decimal) -> Decimal:
    """Exact decimal of a stored sum; the audit refuses allocations whose numbers are not finite, so a
    non-finite value here is a corrupt store: a clear error, never a NaN in a finance file."""
    v = float(x or 0.0)
    if not math.isfinite(v):
        raise GpuAuditError(f"chargeback: a stored sum is {v!r}; re-run the audit (it refuses such rows)")
    return Decimal(repr(v)).quantize(unit, rounding=ROUND_HALF_EVEN)


def chargeback(store: Store, cfg: Config, since: datetime, until: datetime, by: str = "account", *,
               period: str | None = None, run_id: int | None = None) -> list[dict[str, Any]]:
    """Rows for [since, until), grouped by ``by``; runs an audit of that window unless ``run_id`` names
    one. Numbers are Decimals (exact sums); :func:`to_json` / :func:`to_csv` write them."""
    if by not in BY:
        raise GpuAuditError(f"--by {by!r}: expected one of {', '.join(BY)}")
    if run_id is None:
        from auditor.audit.run import run_audit

        run_id = run_audit(store, cfg, since, until, purpose="chargeback").run_id
    owner = _OWNER[by]
    sums = ", ".join(f"SUM(u.{c}_s) AS {c}_s" for c in HOURS)
    sql = (f"SELECT a.cluster AS cluster, {owner} AS owner, COUNT(*) AS allocations, {sums}, "
           "SUM(u.reserved_cost) AS reserved_cost, SUM(u.idle_cost) AS idle_cost "
           "FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id WHERE u.run_id = :run "
           f"GROUP BY a.cluster, {owner} ORDER BY a.cluster, {owner}")
    esql = (f"SELECT a.cluster AS cluster, {owner} AS owner, u.gpu_model AS gpu_model, "
            + ", ".join(f"SUM(u.{c}) AS {c}" for c in ENERGY_SUMS)
            + " FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id WHERE u.run_id = :run "
            f"GROUP BY a.cluster, {owner}, u.gpu_model")
    label = period or f"{since.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}/{until.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
    rows = []
    kwh: dict[tuple[str, str], dict[str, float | None]] = {}
    with store.engine.connect() as conn:
        for r in conn.execute(text(esql), {"run": run_id}):  # per model: the idle power of each
            energy.add(kwh.setdefault((r.cluster, r.owner or ""), {}),
                       energy.energy(r._mapping, cfg.energy, r.gpu_model, r.cluster))
        for r in conn.execute(text(sql), {"run": run_id}):
            hours = {h: _q(getattr(r, f"{h}_s") / 3600.0, H6) for h in HOURS}
            hours["unknown"] = hours["reserved"] - (hours["idle"] + hours["mirage"] + hours["low"]
                                                    + hours["working"] + hours["busy_unverified"]
                                                    + hours["busy_by_counters"] + hours["engine_spin"]
                                                    + hours["infra"] + hours["input_wait"])
            hours.update(tiers(hours))
            rows.append(_row(label, since, until, r.cluster, by, r.owner or "", int(r.allocations), hours,
                             _q(r.reserved_cost, C4), _q(r.idle_cost, C4), cfg.prices.currency, run_id))
            e = kwh.get((r.cluster, r.owner or ""), {})
            rows[-1].update({k: None if e.get(k) is None else _q(e[k], H6) for k in energy.KEYS})
        lost = lost_by_owner(conn, cfg, run_id, owner)
        add_tokens(conn, rows, run_id, owner)
    for r in rows:
        r["lost_gpu_hours"] = _q(lost.get((r["cluster"], r["owner"]), 0.0) / 3600.0, H6)
    return rows


def lost_by_owner(conn: Any, cfg: Config, run_id: int, owner: str) -> dict[tuple[str, str], float]:
    """(cluster, owner) -> seconds lost to failed and restarted runs: the report's Goodput figure
    (:func:`auditor.audit.goodput.lost_runs`, under the run's thresholds), grouped by the chargeback owner."""
    from auditor.audit import goodput

    stored = conn.execute(text("SELECT thresholds FROM audit_runs WHERE id = :run"), {"run": run_id}).scalar()
    if isinstance(stored, str):
        stored = json.loads(stored)
    lost = goodput.lost_by_allocation(conn, run_id, goodput.run_thresholds(stored or {}, cfg.thresholds))
    out: dict[tuple[str, str], float] = {}
    if not lost:
        return out
    q = text(f"SELECT a.id AS id, a.cluster AS cluster, {owner} AS owner FROM usage_allocation u JOIN allocations a "
             "ON a.id = u.allocation_id WHERE u.run_id = :run AND a.id IN :ids").bindparams(
        bindparam("ids", expanding=True))
    for r in conn.execute(q, {"run": run_id, "ids": sorted(lost)}):
        key = (r.cluster, r.owner or "")
        out[key] = out.get(key, 0.0) + lost[r.id]
    return out


def add_tokens(conn: Any, rows: list[dict[str, Any]], run_id: int, owner: str) -> None:
    """Each row's ``tokens``: the generated tokens of its allocations as the audit run computed them
    (summary ``inference_tokens``, auditor/audit/inference.py), None where no inference service reported any."""
    summary = conn.execute(text("SELECT summary FROM audit_runs WHERE id = :run"), {"run": run_id}).scalar()
    if isinstance(summary, str):
        summary = json.loads(summary)
    per_alloc = (summary or {}).get("inference_tokens") or {}
    got: dict[tuple[str, str], Decimal] = {}
    if per_alloc:
        ids = {int(k) for k in per_alloc}
        sql = (f"SELECT a.id AS id, a.cluster AS cluster, {owner} AS owner FROM usage_allocation u "
               "JOIN allocations a ON a.id = u.allocation_id WHERE u.run_id = :run")
        for r in conn.execute(text(sql), {"run": run_id}):
            if r.id in ids:
                key = (r.cluster, r.owner or "")
                got[key] = got.get(key, Decimal(0)) + _q(per_alloc[str(r.id)], Decimal(1))
    for row in rows:
        row["tokens"] = got.get((row["cluster"], row["owner"]))


def tiers(hours: dict[str, Decimal]) -> dict[str, Decimal]:
    """The evidence-tier hours of a row's rounded hours (docs/definitions.md "Evidence tiers"): the stock
    counters (idle-by-counters + busy-by-counters + engine spin), GPU-Util only (idle-by-util +
    busy-unverified), and verified by SM activity (the rest of the observed hours), so the three add up to
    reserved - unknown - infra exactly."""
    counters = hours["idle_by_counters"] + hours["busy_by_counters"] + hours["engine_spin"]
    util_only = hours["idle_by_util"] + hours["busy_unverified"]
    observed = hours["reserved"] - hours["unknown"] - hours["infra"]
    return {"verified": observed - counters - util_only, "counters": counters, "util_only": util_only}


def _row(period: str, since: datetime, until: datetime, cluster: str, by: str, owner: str, n: int,
         hours: dict[str, Decimal], reserved_cost: Decimal, idle_cost: Decimal, currency: str,
         run_id: int | None) -> dict[str, Any]:
    eff = hours["effective"]
    cpe = (reserved_cost / eff).quantize(C4) if eff > 0 else None
    return {"period": period, "period_start": since.astimezone(UTC).isoformat(),
            "period_end": until.astimezone(UTC).isoformat(), "cluster": cluster, "owner_type": by,
            "owner": owner, "allocations": n, **{f"{h}_gpu_hours": hours[h] for h in (*HOURS, *TIERS)},
            "reserved_cost": reserved_cost, "idle_cost": idle_cost, "cost_per_effective_gpu_hour": cpe,
            "currency": currency, "audit_run_id": run_id}


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Column sums of ``rows`` (exact: Decimal); cost per effective GPU-hour recomputed from them."""
    out: dict[str, Any] = {"allocations": sum(r["allocations"] for r in rows)}
    for h in (*HOURS, *TIERS):
        out[f"{h}_gpu_hours"] = sum((r[f"{h}_gpu_hours"] for r in rows), Decimal(0))
    out["lost_gpu_hours"] = sum((r["lost_gpu_hours"] for r in rows), Decimal(0))
    for c in ("reserved_cost", "idle_cost"):
        out[c] = sum((r[c] for r in rows), Decimal(0))
    for c in energy.KEYS:  # a carbon figure missing in any row (no intensity for its cluster): no total
        vals = [r.get(c) for r in rows]
        out[c] = None if any(v is None for v in vals) else sum(vals, Decimal(0))
    toks = [r["tokens"] for r in rows if r.get("tokens") is not None]
    out["tokens"] = sum(toks, Decimal(0)) if toks else None
    eff = out["effective_gpu_hours"]
    out["cost_per_effective_gpu_hour"] = (out["reserved_cost"] / eff).quantize(C4) if eff > 0 else None
    return out


def _plain(v: Any) -> Any:
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() and v.as_tuple().exponent >= 0 else float(v)
    return v


def to_json(rows: list[dict[str, Any]], *, since: datetime, until: datetime, by: str, period: str | None,
            currency: str) -> str:
    doc = {"schema": SCHEMA, "period": period, "period_start": since.astimezone(UTC).isoformat(),
           "period_end": until.astimezone(UTC).isoformat(), "by": by, "currency": currency,
           "columns": list(COLUMNS), "rows": [{k: _plain(r[k]) for k in COLUMNS} for r in rows],
           "totals": {k: _plain(v) for k, v in totals(rows).items()}}
    return jsonsafe.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def safe_cell(value: Any) -> str:
    """A CSV cell a spreadsheet will not evaluate: text starting with = + - @ TAB or CR gets a leading '."""
    s = "" if value is None else str(value)
    return "'" + s if s.startswith(INJECTION_START) else s


def to_csv(rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(COLUMNS)
    for r in rows:
        w.writerow([safe_cell(r[k]) if k in TEXT_COLUMNS else ("" if r[k] is None else str(r[k]))
                    for k in COLUMNS])
    return buf.getvalue()


def write(rows: list[dict[str, Any]], path: Path, fmt: str, *, since: datetime, until: datetime, by: str,
          period: str | None, currency: str, named: bool = True) -> Path:
    """Write through :mod:`auditor.report.outfile`: a regular file is replaced atomically (finance never picks
    up half a file); a device, FIFO or symlink target is written, never replaced. ``named=False``: a name
    gpu-audit chose in a directory (the monthly job), written only where no file or its own one is."""
    body = to_csv(rows) if fmt == "csv" else to_json(rows, since=since, until=until, by=by, period=period,
                                                      currency=currency)
    if not os.path.lexists(path):
        path.parent.mkdir(parents=True, exist_ok=True)
    return write_text(path, body, named=named)


def write_previous_month(store: Store, cfg: Config, out_dir: Path, now: datetime,
                         by: tuple[str, ...] = ("team", "account")) -> dict[str, Any]:
    """The monthly job: the last full month in report.timezone, CSV and JSON per ``by``, one audit run."""
    tz = report_tz(cfg)
    period = previous_month(now, tz)
    since, until = month_window(period, tz)
    from auditor.audit.run import run_audit

    run_id = run_audit(store, cfg, since, until, purpose="chargeback").run_id
    files = []
    for b in by:
        rows = chargeback(store, cfg, since, until, b, period=period, run_id=run_id)
        for fmt in ("csv", "json"):
            files.append(str(write(rows, out_dir / f"chargeback-{period}-by-{b}.{fmt}", fmt, since=since,
                                   until=until, by=b, period=period, currency=cfg.prices.currency, named=False)))
    return {"period": period, "audit_run_id": run_id, "files": files}
