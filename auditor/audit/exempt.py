"""Exemptions from enforcement: standing rules from ``[[exemptions]]`` (user, account, QOS, namespace,
labels; with an expiry), single allocations recorded with ``gpu-audit exempt CLUSTER:ID --until --reason``
(who, why, until when) and pod annotations read at decision time. Expired ones no longer count."""

from __future__ import annotations

import getpass
import socket
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, insert, select

from auditor.config import Config, ExemptionRule
from auditor.errors import GpuAuditError
from auditor.store import schema
from auditor.store.engine import Store
from auditor.timeutil import parse_time, to_epoch


def actor() -> str:
    """user@host of whoever runs this process (recorded as who acted or asked)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"[:255]


def _until_ts(rule: ExemptionRule) -> int | None:
    if rule.until is None:
        return None
    u = rule.until if rule.until.tzinfo else rule.until.replace(tzinfo=UTC)
    return int(u.timestamp())


def rule_matches(rule: ExemptionRule, a: dict[str, Any], now: int) -> bool:
    """Every non-empty criterion must match; an expired rule matches nothing."""
    until = _until_ts(rule)
    if until is not None and until <= now:
        return False
    k8s = a.get("source") == "kubernetes"
    checks = [(rule.clusters, a.get("cluster")), (rule.users, a.get("user_name")),
              (rule.qos, a.get("qos")), (rule.accounts, None if k8s else a.get("account")),
              (rule.namespaces, a.get("account") if k8s else None)]
    if not any(vals for vals, _ in checks) and not rule.labels:
        return False
    for vals, have in checks:
        if vals and have not in vals:
            return False
    labels = a.get("labels") or {}
    return all(labels.get(k) == v for k, v in rule.labels.items())


def recorded(store: Store, cluster: str, ids: list[str], now: int) -> dict[str, Any] | None:
    """The standing recorded exemption (latest expiry) for any of ``ids`` of one cluster, or None."""
    t = schema.exemptions
    with store.engine.connect() as conn:
        row = conn.execute(select(t).where(t.c.cluster == cluster, t.c.external_id.in_(ids),
                                           t.c.until_ts > now, t.c.revoked_ts.is_(None))
                           .order_by(t.c.until_ts.desc()).limit(1)).mappings().first()
    return dict(row) if row else None


def find(store: Store, cfg: Config, a: dict[str, Any], now: int,
         annotations: dict[str, str] | None = None) -> dict[str, Any] | None:
    """Why ``a`` is exempt right now (``{"by": ..., "reason": ..., "until": ...}``), or None."""
    ids = [str(a["external_id"])]
    if a.get("source") == "kubernetes":
        ids.append(f"{a.get('account')}/{a.get('name')}")
    rec = recorded(store, a["cluster"], ids, now)
    if rec:
        return {"by": f"recorded by {rec['requested_by']}", "reason": rec["reason"], "until_ts": rec["until_ts"]}
    for i, rule in enumerate(cfg.exemptions):
        if rule_matches(rule, a, now):
            return {"by": f"config exemptions[{i}]", "reason": rule.reason, "until_ts": _until_ts(rule)}
    ann = annotations or {}
    raw = ann.get(cfg.enforce.exempt_annotation)
    if raw:
        try:
            until = to_epoch(parse_time(raw))
        except ValueError:
            return None  # an unreadable annotation exempts nothing; the decision records it
        if until is not None and until > now:
            return {"by": f"pod annotation {cfg.enforce.exempt_annotation}",
                    "reason": ann.get(cfg.enforce.exempt_reason_annotation, "(no reason given)")[:500],
                    "until_ts": until}
    return None


def parse_target(text: str) -> tuple[str, str]:
    """``CLUSTER:ID`` -> (cluster, id); the id may itself contain ':' or '/' (namespace/pod)."""
    cluster, sep, ident = text.partition(":")
    if not sep or not cluster or not ident.strip():
        raise GpuAuditError(f"exempt: expected CLUSTER:ID (e.g. hpc:12345 or k8s:research/notebook), got {text!r}")
    return cluster, ident.strip()


def add(store: Store, cfg: Config, target: str, until: str, reason: str, *, by: str | None = None,
        now: datetime | None = None) -> dict[str, Any]:
    """Record an exemption; the cluster must be configured and the expiry in the future."""
    cluster, ident = parse_target(target)
    if cfg.clusters and cluster not in {c.name for c in cfg.clusters}:
        raise GpuAuditError(f"exempt: unknown cluster {cluster!r} (configured: "
                            f"{', '.join(c.name for c in cfg.clusters)})")
    if not reason.strip():
        raise GpuAuditError("exempt: --reason must say why")
    when = now or datetime.now(UTC)
    try:
        text = until.strip().lower()
        if text.startswith("now+"):  # relative expiry: now+3days, now+12hours
            until_ts = to_epoch(when + (when - parse_time("now-" + text[4:], now=when)))
        else:
            until_ts = to_epoch(parse_time(until, now=when))
    except ValueError as exc:
        raise GpuAuditError(f"exempt: --until: {exc}") from None
    now_ts = int(when.timestamp())
    if until_ts is None or until_ts <= now_ts:
        raise GpuAuditError("exempt: --until must be in the future")
    row = {"cluster": cluster, "external_id": ident[:255], "until_ts": until_ts, "reason": reason.strip()[:2000],
           "requested_by": (by or actor())[:255], "created_ts": now_ts, "revoked_ts": None}
    with store.begin() as conn:
        row["id"] = conn.execute(insert(schema.exemptions).values(**row)).inserted_primary_key[0]
    return row


def active(store: Store, cfg: Config, now: int) -> list[dict[str, Any]]:
    """Every exemption standing at ``now``: recorded ones and config rules (for reports)."""
    t = schema.exemptions
    out: list[dict[str, Any]] = []
    with store.engine.connect() as conn:
        for r in conn.execute(select(t).where(t.c.until_ts > now, t.c.revoked_ts.is_(None))
                              .order_by(t.c.until_ts)).mappings():
            out.append({"scope": f"{r['cluster']}:{r['external_id']}", "reason": r["reason"],
                        "by": r["requested_by"], "until_ts": r["until_ts"], "created_ts": r["created_ts"]})
    for i, rule in enumerate(cfg.exemptions):
        until = _until_ts(rule)
        if until is not None and until <= now:
            continue
        crit = [f"{k}={','.join(v)}" for k, v in (("cluster", rule.clusters), ("user", rule.users),
                ("account", rule.accounts), ("qos", rule.qos), ("namespace", rule.namespaces)) if v]
        crit += [f"label {k}={v}" for k, v in rule.labels.items()]
        out.append({"scope": "; ".join(crit), "reason": rule.reason, "by": f"config exemptions[{i}]",
                    "until_ts": until, "created_ts": None})
    return out


def report_section(store: Store, cfg: Config, since_ts: int, now_ts: int, when: Any) -> dict[str, Any]:
    """For reports: exemptions standing now, and the enforcement log since the window start, newest first."""
    t = schema.enforcement_log
    with store.engine.connect() as conn:
        log = [dict(r) for r in conn.execute(select(t).where(t.c.decided_ts >= since_ts)
                                             .order_by(t.c.id.desc()).limit(cfg.report.top_n)).mappings()]
        total = conn.execute(select(func.count()).select_from(t).where(t.c.decided_ts >= since_ts)).scalar()
    ex = active(store, cfg, now_ts)
    return {"exemptions": [{**e, "until": when(e["until_ts"]) or "no expiry"} for e in ex],
            "log": [{"when": when(r["decided_ts"]), "target": r["target"], "stage": r["stage"],
                     "action": r["action"], "decision": r["decision"], "dry_run": bool(r["dry_run"]),
                     "reason": r["reason"], "actor": r["actor"], "result": r["result"] or ""} for r in log],
            "log_total": int(total or 0)}
