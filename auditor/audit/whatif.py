"""What-if: re-judge stored history with other thresholds and show what would change, collecting nothing.

Both sides are fresh audit runs of the same window marked ``what_if`` (the official run list and the
reports never see them): one with the configured thresholds, one with the overrides. The difference is
per finding kind: findings, flagged allocations (added / removed) and GPU-hours.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import text

from auditor.config import Config, Thresholds, one_line
from auditor.errors import GpuAuditError
from auditor.store.engine import Store

ALIASES = {
    "idle": "idle_sm", "sm": "idle_sm", "dram": "idle_dram", "tensor": "idle_tensor",
    "mirage": "mirage_gpu_util", "mirage_util": "mirage_gpu_util", "mirage_gr": "mirage_gr_engine",
    "working": "working_sm", "fallback": "util_fallback", "power": "idle_power_w", "idle_power": "idle_power_w",
    "idle_fraction": "idle_allocation_fraction", "idle_min": "idle_allocation_min_gpu_hours",
    "idle_gpus": "idle_gpus_fraction", "mirage_min": "mirage_min_minutes", "coverage": "unmonitored_coverage",
    "episode": "episode_hours", "low": "low_efficiency_sm", "low_sm": "low_efficiency_sm",
    "low_hours": "low_efficiency_min_gpu_hours", "low_min": "low_efficiency_min_gpu_hours",
    "worked": "idle_gpus_worked_fraction", "min_finding": "min_finding_gpu_hours",
}
_DUR = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|hours?|d|days?)$")
_DUR_S = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hour": 3600, "hours": 3600, "d": 86400,
          "day": 86400, "days": 86400}
SUMMARY_KEYS = ("reserved_gpu_hours", "effective_gpu_hours", "idle_gpu_hours", "mirage_gpu_hours",
                "low_gpu_hours", "working_gpu_hours", "busy_unverified_gpu_hours", "unknown_gpu_hours", "idle_cost")
LIST_MAX = 50


def _value(field: str, raw: Any) -> Any:
    """One override value: durations for *_hours / *_minutes fields, percentages for ratios, booleans."""
    if not isinstance(raw, str):
        return raw
    s = raw.strip().lower()
    if field == "util_fallback":
        if s in ("1", "true", "yes", "on"):
            return True
        if s in ("0", "false", "no", "off"):
            return False
        raise GpuAuditError(f"what-if {field}={raw}: expected true or false")
    if field == "idle_power_w" and s in ("", "none", "off"):
        return None
    m = _DUR.match(s)
    if m and (field.endswith("_hours") or field.endswith("_minutes")):
        seconds = float(m.group(1)) * _DUR_S[m.group(2)]
        return seconds / (3600 if field.endswith("_hours") else 60)
    try:
        return float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise GpuAuditError(f"what-if {field}={raw}: not a number") from None


def parse_overrides(spec: str | dict[str, Any]) -> dict[str, Any]:
    """``idle_sm=0.1,episode=1h,coverage=30%`` (or a dict) -> {Thresholds field: value}."""
    items: list[tuple[str, Any]]
    if isinstance(spec, dict):
        items = list(spec.items())
    else:
        items = []
        for part in (p.strip() for p in spec.split(",")):
            if not part:
                continue
            if "=" not in part:
                raise GpuAuditError(f"what-if: {part!r} is not KEY=VALUE")
            k, v = part.split("=", 1)
            items.append((k, v))
    fields = set(Thresholds.model_fields)
    out: dict[str, Any] = {}
    for k, v in items:
        key = k.strip().lower().replace("-", "_")
        name = key if key in fields else ALIASES.get(key)
        if name is None:
            raise GpuAuditError(f"what-if: unknown threshold {k.strip()!r} (known: "
                                f"{', '.join(sorted(fields))}; aliases: {', '.join(sorted(ALIASES))})")
        out[name] = _value(name, v)
    if not out:
        raise GpuAuditError("what-if: no thresholds given (e.g. idle_sm=0.1,episode=1h)")
    return out


def thresholds_with(cfg: Config, overrides: dict[str, Any]) -> Thresholds:
    try:
        return Thresholds.model_validate({**cfg.thresholds.model_dump(), **overrides})
    except ValidationError as exc:
        raise GpuAuditError(f"what-if: {one_line(exc, 'thresholds')}") from None


def _kinds(store: Store, run_id: int) -> dict[str, dict[str, Any]]:
    sql = ("SELECT f.kind, f.allocation_id, f.reservation_id, f.account, f.gpu_hours, f.idle_gpu_hours, f.cost, "
           "a.cluster AS a_cluster, a.external_id, r.name AS r_name, f.cluster FROM findings f "
           "LEFT JOIN allocations a ON a.id = f.allocation_id "
           "LEFT JOIN reservations r ON r.id = f.reservation_id WHERE f.run_id = :run")
    out: dict[str, dict[str, Any]] = {}
    with store.engine.connect() as conn:
        for r in conn.execute(text(sql), {"run": run_id}):
            k = out.setdefault(r.kind, {"findings": 0, "gpu_hours": 0.0, "idle_gpu_hours": 0.0, "cost": 0.0,
                                        "flagged": set()})
            k["findings"] += 1
            k["gpu_hours"] += r.gpu_hours
            k["idle_gpu_hours"] += r.idle_gpu_hours
            k["cost"] += r.cost
            k["flagged"].add(f"{r.a_cluster}:{r.external_id}" if r.allocation_id is not None
                             else f"{r.cluster}:reservation:{r.r_name}" if r.reservation_id is not None
                             else f"{r.cluster}:{r.kind}:{r.account}")  # idle_quota: the quota's account
    return out


def what_if(store: Store, cfg: Config, since: datetime, until: datetime,
            overrides: str | dict[str, Any]) -> dict[str, Any]:
    """Audit [since, until) twice (configured thresholds, then overridden) and diff the results."""
    from auditor.audit.run import run_audit

    changes = parse_overrides(overrides)
    th = thresholds_with(cfg, changes)
    base = run_audit(store, cfg, since, until, thresholds=cfg.thresholds, what_if=True)
    alt = run_audit(store, cfg, since, until, thresholds=th, what_if=True)
    kb, ka = _kinds(store, base.run_id), _kinds(store, alt.run_id)
    kinds = {}
    for kind in sorted(set(kb) | set(ka)):
        b = kb.get(kind, {"findings": 0, "gpu_hours": 0.0, "idle_gpu_hours": 0.0, "cost": 0.0, "flagged": set()})
        a = ka.get(kind, {"findings": 0, "gpu_hours": 0.0, "idle_gpu_hours": 0.0, "cost": 0.0, "flagged": set()})
        added, removed = sorted(a["flagged"] - b["flagged"]), sorted(b["flagged"] - a["flagged"])
        kinds[kind] = {
            **{f"{m}": {"official": b[m], "what_if": a[m], "delta": a[m] - b[m]}
               for m in ("findings", "gpu_hours", "idle_gpu_hours", "cost")},
            "flagged": {"official": len(b["flagged"]), "what_if": len(a["flagged"]),
                        "delta": len(a["flagged"]) - len(b["flagged"])},
            "added": added[:LIST_MAX], "removed": removed[:LIST_MAX],
            "added_count": len(added), "removed_count": len(removed)}
    summary = {k: {"official": base.summary.get(k), "what_if": alt.summary.get(k),
                   "delta": (alt.summary.get(k) or 0.0) - (base.summary.get(k) or 0.0)} for k in SUMMARY_KEYS}
    official = cfg.thresholds.model_dump()
    return {"since": since.isoformat(), "until": until.isoformat(), "currency": cfg.prices.currency,
            "overrides": {k: {"official": official[k], "what_if": v} for k, v in changes.items()},
            "official_run_id": base.run_id, "what_if_run_id": alt.run_id, "summary": summary, "kinds": kinds}


def format_diff(diff: dict[str, Any]) -> str:
    """The what-if difference as a plain-text table."""
    lines = [f"what-if {diff['since']} .. {diff['until']} (runs {diff['official_run_id']} official, "
             f"{diff['what_if_run_id']} what-if)",
             "thresholds: " + ", ".join(f"{k} {v['official']} -> {v['what_if']}"
                                        for k, v in diff["overrides"].items()), ""]
    lines.append(f"{'':24} {'official':>12} {'what-if':>12} {'delta':>12}")
    for k, v in diff["summary"].items():
        lines.append(f"{k:24} {v['official'] or 0:12.2f} {v['what_if'] or 0:12.2f} {v['delta']:+12.2f}")
    lines += ["", f"{'finding':18} {'flagged':>17} {'idle GPU-h':>25}  added / removed"]
    for kind, v in diff["kinds"].items():
        f, ih = v["flagged"], v["idle_gpu_hours"]
        lines.append(f"{kind:18} {f['official']:5d} -> {f['what_if']:5d} {ih['official']:10.2f} -> "
                     f"{ih['what_if']:10.2f}  +{v['added_count']} / -{v['removed_count']}")
        if v["added"]:
            lines.append("    added: " + ", ".join(v["added"][:10]) + (" ..." if v["added_count"] > 10 else ""))
        if v["removed"]:
            lines.append("    removed: " + ", ".join(v["removed"][:10])
                         + (" ..." if v["removed_count"] > 10 else ""))
    if not diff["kinds"]:
        lines.append("(no findings either way)")
    return "\n".join(lines)
