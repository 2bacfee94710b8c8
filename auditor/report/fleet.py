"""The fleet export: one audit window of a store as versioned Parquet files, partitioned by cluster and week,
for the data tools sites already run (DuckDB on one machine; Spark, Trino or a warehouse past it).

Past one store the audit scales by partition, shared-nothing (docs/scale-out.md): one store per cluster or
node group, each exporting into one shared root. The fleet view is then a query over
``ROOT/<table>/cluster=<c>/week=<YYYY-Www>/data.parquet``, e.g. in DuckDB
``SELECT ... FROM read_parquet('ROOT/chargeback/*/*/*.parquet', hive_partitioning = true)``.

Three tables (columns: :data:`TABLES`, documented in docs/fleet-export.md and checked by a docs test):

- ``chargeback``: the chargeback rows of the window (:func:`auditor.report.chargeback.chargeback`, by account),
  exact decimals, so the fleet chargeback summed over N partition exports equals one store's over the same data;
- ``usage``: one row per allocation with the FinOps FOCUS columns where they apply (BilledCost, ResourceId,
  ChargePeriodStart/End, Tags, ...) beside gpu-audit's own (``x_`` columns, as FOCUS names custom columns):
  idle, mirage, unknown GPU-hours and the tier of evidence that judged them;
- ``allocations``: who held which GPUs when.

A partition file is the tool's own (written atomically, replaced by a re-export of the same cluster and week);
nothing else under the root is touched. pyarrow is an optional dependency (``pip install 'gpu-audit[parquet]'``).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import text

from auditor import owned
from auditor.config import Config
from auditor.errors import GpuAuditError
from auditor.report import chargeback as cb
from auditor.store.engine import Store

SCHEMA = "gpu-audit.fleet/1"
MANIFEST = "_gpu_audit_export.json"
H = 3600.0


@dataclass(frozen=True)
class Col:
    """One exported column: name, Arrow type name (``string``, ``int64``, ``double``, ``bool``,
    ``timestamp``, ``decimal(P,S)``) and what it holds (docs/fleet-export.md is checked against these)."""

    name: str
    type: str
    doc: str


_DEC_H, _DEC_C = "decimal(20,6)", "decimal(20,4)"

CHARGEBACK: tuple[Col, ...] = (
    *(Col(c, "string", f"As in the chargeback file: {c}.") for c in ("period", "period_start", "period_end")),
    Col("owner_type", "string", "What owner is: account (a Slurm account or Kubernetes namespace)."),
    Col("owner", "string", "The account or namespace."),
    Col("allocations", "int64", "Allocations of the owner in the window."),
    *(Col(f"{h}_gpu_hours", _DEC_H, f"Chargeback column {h}_gpu_hours (exact, 6 decimals).")
      for h in (*cb.HOURS, *cb.TIERS)),
    Col("reserved_cost", _DEC_C, "Reserved GPU-hours x price (exact, 4 decimals)."),
    Col("idle_cost", _DEC_C, "(idle + mirage) GPU-hours x price (exact, 4 decimals)."),
    Col("lost_gpu_hours", _DEC_H, "GPU-hours lost to failed and restarted runs (goodput)."),
    Col("currency", "string", "Price card currency."),
    Col("audit_run_id", "int64", "The store's audit run the figures come from (ids are per store)."),
)

USAGE: tuple[Col, ...] = (
    Col("BilledCost", _DEC_C, "FOCUS: reserved GPU-hours x the price card rate (internal showback: the charge)."),
    Col("EffectiveCost", _DEC_C, "FOCUS: equal to BilledCost (no discounts or commitments in a price card)."),
    Col("ListCost", _DEC_C, "FOCUS: equal to BilledCost."),
    Col("ListUnitPrice", "double", "FOCUS: the price card rate per GPU-hour applied."),
    Col("BillingCurrency", "string", "FOCUS: the price card currency."),
    Col("ChargePeriodStart", "timestamp", "FOCUS: the audit window start (UTC)."),
    Col("ChargePeriodEnd", "timestamp", "FOCUS: the audit window end, exclusive (UTC)."),
    Col("ChargeCategory", "string", "FOCUS: always Usage."),
    Col("ChargeDescription", "string", "FOCUS: what was charged, in words."),
    Col("ConsumedQuantity", "double", "FOCUS: reserved GPU-hours (times the GPU share of fractional GPUs)."),
    Col("ConsumedUnit", "string", "FOCUS: GPU-Hour."),
    Col("PricingQuantity", "double", "FOCUS: equal to ConsumedQuantity."),
    Col("PricingUnit", "string", "FOCUS: GPU-Hour."),
    Col("ProviderName", "string", "FOCUS: the cluster that provided the GPUs."),
    Col("ResourceId", "string", "FOCUS: the allocation: CLUSTER:JOBID or CLUSTER:NAMESPACE/POD (gpu-audit job REF)."),
    Col("ResourceName", "string", "FOCUS: job or pod name (user text)."),
    Col("ResourceType", "string", "FOCUS: Slurm job, Kubernetes pod or file allocation."),
    Col("ServiceCategory", "string", "FOCUS: Compute."),
    Col("ServiceName", "string", "FOCUS: GPU compute."),
    Col("SubAccountId", "string", "FOCUS: the Slurm account or Kubernetes namespace."),
    Col("SubAccountName", "string", "FOCUS: equal to SubAccountId."),
    Col("Tags", "string", "FOCUS: a JSON object: team, user, partition, qos, gpu_model."),
    Col("x_Cluster", "string", "gpu-audit: cluster (also the partition key)."),
    Col("x_Team", "string", "gpu-audit: team from the mapping."),
    Col("x_User", "string", "gpu-audit: user."),
    Col("x_Gpus", "int64", "gpu-audit: allocated GPU rows."),
    Col("x_GpuModel", "string", "gpu-audit: GPU model (first GPU)."),
    *(Col(f"x_{name}GpuHours", "double", f"gpu-audit: {doc}") for name, doc in (
        ("Reserved", "reserved GPU-hours (= ConsumedQuantity)."),
        ("Effective", "SM-activity-weighted GPU-hours: the work done."),
        ("Idle", "idle GPU-hours, mirage included (the report's idle figure)."),
        ("Mirage", "the mirage part of x_IdleGpuHours: idle by SM activity while GPU-Util read busy."),
        ("Unknown", "reserved GPU-hours no telemetry covered (never idle)."),
        ("Infra", "infrastructure-affected GPU-hours (faults, drains: never idle)."),
        ("Verified", "tier of evidence: GPU-hours judged on SM activity."),
        ("UtilOnly", "tier of evidence: GPU-hours judged on GPU-Util alone (low confidence)."),
        ("Counters", "tier of evidence: GPU-hours judged on the stock counters (GR engine, Tensor, DRAM; no SM "
                     "activity)."))),
    Col("x_IdleCost", "double", "gpu-audit: cost of the idle (and mirage) GPU-hours."),
    Col("x_AuditRunId", "int64", "gpu-audit: the store's audit run."),
)

ALLOCATIONS: tuple[Col, ...] = (
    Col("cluster", "string", "Cluster (also the partition key)."),
    Col("source", "string", "slurm, kubernetes or file."),
    Col("external_id", "string", "Job id (with array/het parts) or pod UID."),
    Col("ref", "string", "The gpu-audit job REF (= usage.ResourceId)."),
    *(Col(c, "string", f"Scheduler field {c} (user text where the user chose it).")
      for c in ("name", "user_name", "account", "partition", "qos", "state", "reservation")),
    Col("team", "string", "Team from the mapping."),
    Col("gpu_count", "double", "GPUs held (fractional GPUs count their share)."),
    *(Col(c, "timestamp", f"{c.removesuffix('_ts')} time (UTC); NULL where unknown")
      for c in ("submit_ts", "start_ts", "end_ts")),
    Col("audit_run_id", "int64", "The store's audit run of the export."),
)

TABLES: dict[str, tuple[Col, ...]] = {"chargeback": CHARGEBACK, "usage": USAGE, "allocations": ALLOCATIONS}

_RESOURCE_TYPE = {"slurm": "Slurm job", "kubernetes": "Kubernetes pod", "file": "file allocation"}


def _arrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise GpuAuditError("the Parquet export needs pyarrow: pip install 'gpu-audit[parquet]'") from None
    return pa, pq


def _arrow_type(pa: Any, name: str) -> Any:
    if name.startswith("decimal("):
        p, s = (int(x) for x in name[8:-1].split(","))
        return pa.decimal128(p, s)
    return {"string": pa.string(), "int64": pa.int64(), "double": pa.float64(), "bool": pa.bool_(),
            "timestamp": pa.timestamp("s", tz="UTC")}[name]


def week_of(ts: datetime) -> str:
    """The ISO week a window starts in, e.g. 2026-W48: the partition key."""
    y, w, _ = ts.astimezone(UTC).isocalendar()
    return f"{y}-W{w:02d}"


def _ts(v: int | None) -> datetime | None:
    return None if v is None else datetime.fromtimestamp(int(v), UTC)


def usage_rows(store: Store, cfg: Config, run_id: int, since: datetime, until: datetime
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(usage, allocations) rows of one audit run, one per allocation, ordered by cluster and id."""
    from auditor.report.context import job_ref

    cur = cfg.prices.currency
    sql = ("SELECT a.id, a.cluster, a.source, a.external_id, a.name, a.user_name, a.account, a.partition, a.qos, "
           "a.state, a.reservation, a.gpu_count, a.submit_ts, a.start_ts, a.end_ts, u.team, u.gpu_model, "
           "u.price_per_gpu_hour, u.gpus, u.reserved_s, u.effective_s, u.idle_s, u.mirage_s, u.unknown_s, "
           "u.infra_s, u.sm_observed_s, u.idle_by_util_s, u.busy_unverified_s, u.reserved_cost, u.idle_cost, "
           "u.idle_by_counters_s + u.busy_by_counters_s + u.engine_spin_s AS counters_s "
           "FROM usage_allocation u JOIN allocations a ON a.id = u.allocation_id WHERE u.run_id = :run "
           "ORDER BY a.cluster, a.id")
    usage, allocs = [], []
    with store.engine.connect() as conn:
        for r in conn.execute(text(sql), {"run": run_id}):
            ref = job_ref(r.source, r.cluster, r.external_id, r.account, r.name)
            cost = cb._q(r.reserved_cost, cb.C4)
            tags = {"team": r.team or "", "user": r.user_name or "", "partition": r.partition or "",
                    "qos": r.qos or "", "gpu_model": r.gpu_model or ""}
            usage.append({
                "BilledCost": cost, "EffectiveCost": cost, "ListCost": cost, "ListUnitPrice": r.price_per_gpu_hour,
                "BillingCurrency": cur, "ChargePeriodStart": since, "ChargePeriodEnd": until,
                "ChargeCategory": "Usage", "ChargeDescription": f"GPU time reserved by {ref}",
                "ConsumedQuantity": r.reserved_s / H, "ConsumedUnit": "GPU-Hour",
                "PricingQuantity": r.reserved_s / H, "PricingUnit": "GPU-Hour", "ProviderName": r.cluster,
                "ResourceId": ref, "ResourceName": r.name or "", "ResourceType": _RESOURCE_TYPE.get(r.source, r.source),
                "ServiceCategory": "Compute", "ServiceName": "GPU compute", "SubAccountId": r.account or "",
                "SubAccountName": r.account or "", "Tags": json.dumps(tags, sort_keys=True),
                "x_Cluster": r.cluster, "x_Team": r.team or "", "x_User": r.user_name or "", "x_Gpus": int(r.gpus),
                "x_GpuModel": r.gpu_model or "", "x_ReservedGpuHours": r.reserved_s / H,
                "x_EffectiveGpuHours": r.effective_s / H, "x_IdleGpuHours": (r.idle_s + r.mirage_s) / H,
                "x_MirageGpuHours": r.mirage_s / H, "x_UnknownGpuHours": r.unknown_s / H,
                "x_InfraGpuHours": r.infra_s / H, "x_VerifiedGpuHours": r.sm_observed_s / H,
                "x_UtilOnlyGpuHours": (r.idle_by_util_s + r.busy_unverified_s) / H,
                "x_CountersGpuHours": r.counters_s / H, "x_IdleCost": r.idle_cost,
                "x_AuditRunId": run_id})
            allocs.append({
                "cluster": r.cluster, "source": r.source, "external_id": r.external_id, "ref": ref,
                "name": r.name or "", "user_name": r.user_name or "", "account": r.account or "",
                "partition": r.partition or "", "qos": r.qos or "", "state": r.state or "",
                "reservation": r.reservation or "", "team": r.team or "", "gpu_count": float(r.gpu_count or 0),
                "submit_ts": _ts(r.submit_ts), "start_ts": _ts(r.start_ts), "end_ts": _ts(r.end_ts),
                "audit_run_id": run_id})
    return usage, allocs


def _write_table(pa: Any, pq: Any, cols: tuple[Col, ...], rows: list[dict[str, Any]], path: Path,
                 meta: dict[str, str]) -> None:
    schema = pa.schema([pa.field(c.name, _arrow_type(pa, c.type)) for c in cols],
                       metadata={k.encode(): v.encode() for k, v in meta.items()})
    table = pa.Table.from_pylist([{c.name: r.get(c.name) for c in cols} for r in rows], schema=schema)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".data-", suffix=".parquet.tmp", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)  # our own partition file (replaced by a re-export of the same cluster and week)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export(store: Store, cfg: Config, out: Path, since: datetime, until: datetime, *,
           period: str | None = None) -> dict[str, Any]:
    """Write the window [since, until) of ``store`` under ``out``: per cluster, the three tables of
    :data:`TABLES` in ``out/<table>/cluster=<c>/week=<w>/data.parquet``, plus a manifest. Runs the window's
    chargeback audit (the figures equal ``gpu-audit chargeback`` of the same window). Returns what it wrote."""
    pa, pq = _arrow()
    if out.exists() and not out.is_dir():
        raise GpuAuditError(f"{out}: exists and is not a directory")
    rows = cb.chargeback(store, cfg, since, until, "account", period=period)
    run_ids = {r["audit_run_id"] for r in rows}
    if len(run_ids) > 1:
        raise GpuAuditError("chargeback rows of several audit runs in one export")
    written: list[str] = []
    week = week_of(since)
    meta = {"gpu_audit.schema": SCHEMA, "gpu_audit.since": since.astimezone(UTC).isoformat(),
            "gpu_audit.until": until.astimezone(UTC).isoformat()}
    usage: list[dict[str, Any]] = []
    allocs: list[dict[str, Any]] = []
    if run_ids:
        usage, allocs = usage_rows(store, cfg, run_ids.pop(), since, until)
    clusters = sorted({r["cluster"] for r in rows} | {r["x_Cluster"] for r in usage})
    manifest = out / MANIFEST
    # only over partition files (and the manifest) an earlier export wrote, checked before the first is written
    owned.check(out, [manifest, *(out / table / f"cluster={_safe(c)}" / f"week={week}" / "data.parquet"
                                  for c in clusters for table in TABLES)])
    for cluster in clusters:
        parts = {"chargeback": [r for r in rows if r["cluster"] == cluster],
                 "usage": [r for r in usage if r["x_Cluster"] == cluster],
                 "allocations": [r for r in allocs if r["cluster"] == cluster]}
        for table, cols in TABLES.items():
            path = out / table / f"cluster={_safe(cluster)}" / f"week={week}" / "data.parquet"
            _write_table(pa, pq, cols, parts[table], path, {**meta, "gpu_audit.cluster": cluster})
            owned.record(out, [path])
            written.append(str(path.relative_to(out)))
    doc = {"schema": SCHEMA, "tables": {t: [{"name": c.name, "type": c.type} for c in cols]
                                        for t, cols in TABLES.items()},
           "partitioning": ["cluster", "week"]}
    tmp = manifest.with_name(f".{MANIFEST}.tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, manifest)
    owned.record(out, [manifest])
    totals = cb.totals(rows)
    return {"out": str(out), "week": week, "clusters": clusters, "files": written,
            "rows": {"chargeback": len(rows), "usage": len(usage), "allocations": len(allocs)},
            "reserved_cost": _plain(totals["reserved_cost"]), "reserved_gpu_hours": _plain(
                totals["reserved_gpu_hours"])}


def _plain(v: Any) -> Any:
    return float(v) if isinstance(v, Decimal) else v


def _safe(cluster: str) -> str:
    """A cluster name as a path segment: hive partition values are percent-escaped the way Hive and Spark
    escape them (``/``, ``=``, ``%`` and control characters), so every name maps to one directory."""
    out = []
    for ch in cluster:
        out.append(f"%{ord(ch):02X}" if ch in '/\\=%"#:?*<>|' or ord(ch) < 32 or ch == "\x7f" else ch)
    return "".join(out) or "%00"
