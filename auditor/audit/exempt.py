"""Exemptions from enforcement: standing rules from ``[[exemptions]]`` (user, account, QOS, namespace,
labels; with an expiry), single allocations recorded with ``gpu-audit exempt CLUSTER:ID --until --reason``
(who, why, until when) and pod annotations read at decision time. Expired ones no longer count."""

from __future__ import annotations

import difflib
import getpass
import logging
import re
import socket
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, insert, or_, select

from auditor.config import Config, ExemptionRule
from auditor.errors import GpuAuditError
from auditor.intparse import UINT
from auditor.logs import has_control, log_safe
from auditor.store import schema
from auditor.store.engine import Store
from auditor.timeutil import parse_time, to_epoch

#: The pod annotations an owner exempts a pod with: its expiry (ISO time) and its reason; gpu-audit's own names
#: (settings under `[enforce]` until issue 45)
EXEMPT_ANNOTATION = "gpu-audit.io/exempt-until"
EXEMPT_REASON_ANNOTATION = "gpu-audit.io/exempt-reason"

log = logging.getLogger("gpu_audit.exempt")
#: a Slurm job id: ``JOB``, array task ``JOB_TASK``, heterogeneous component ``JOB+N``; ``JOB`` covers them all
_SLURM_ID = re.compile(rf"(?P<job>{UINT})(?:_{UINT})?(?:\+{UINT})?")
SHOW = 10  # ids shown as what an exemption covers, or as the near misses of one that matches nothing


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


def ids_of(a: dict[str, Any]) -> list[str]:
    """The ids an exemption may name the allocation by: its own id; a Slurm array task or het component
    also by its job id (``123`` covers ``123_4``); a pod also by ``namespace/name``."""
    ext = str(a["external_id"])
    ids = [ext]
    if a.get("source") == "kubernetes":
        ids.append(f"{a.get('account')}/{a.get('name')}")
    elif (m := _SLURM_ID.fullmatch(ext)) and m["job"] != ext:
        ids.append(m["job"])
    return ids


def _annotation(ann: dict[str, str], key: str, a: dict[str, Any]) -> str:
    """A pod annotation as text that is safe to store and print: control characters (a NUL, which
    PostgreSQL cannot store and which ended every enforcement run; a newline, which forged a log line)
    are escaped, and said once in the log."""
    raw = str(ann.get(key) or "")
    if has_control(raw):
        log.warning("%s: pod annotation %s has control characters; kept escaped", a.get("name") or
                    a.get("external_id"), key)
        raw = log_safe(raw)
    return raw[:500]


def find(store: Store, cfg: Config, a: dict[str, Any], now: int,
         annotations: dict[str, str] | None = None) -> dict[str, Any] | None:
    """Why ``a`` is exempt right now (``{"by": ..., "reason": ..., "until_ts": ...}``), or None.

    A pod's exemption annotation that cannot be read is doubt, so it holds the action too: the decision
    says it is unreadable and why (before, it exempted nothing and the pod was acted on)."""
    rec = recorded(store, a["cluster"], ids_of(a), now)
    if rec:
        return {"by": f"recorded by {rec['requested_by']}", "reason": rec["reason"], "until_ts": rec["until_ts"],
                "actor": rec.get("actor"), "external_id": rec["external_id"]}
    for i, rule in enumerate(cfg.exemptions):
        if rule_matches(rule, a, now):
            return {"by": f"config exemptions[{i}]", "reason": rule.reason, "until_ts": _until_ts(rule)}
    ann = annotations or {}
    key = EXEMPT_ANNOTATION
    raw = str(ann.get(key) or "")
    if raw:
        try:
            if has_control(raw):
                raise ValueError("control characters")
            until = to_epoch(parse_time(raw))
        except ValueError as exc:
            why = log_safe(" ".join(str(exc).split()))[:200]
            log.warning("%s: pod annotation %s is unreadable (%s): no action", a.get("name") or
                        a.get("external_id"), key, why)
            return {"by": f"pod annotation {key}, unreadable",
                    "reason": f"'{log_safe(raw)[:80]}' is no time ({why}); no action until it is fixed or removed",
                    "until_ts": None}
        if until is not None and until > now:
            return {"by": f"pod annotation {key}",
                    "reason": _annotation(ann, EXEMPT_REASON_ANNOTATION, a) or "(no reason given)",
                    "until_ts": until}
    return None


def parse_target(text: str) -> tuple[str, str]:
    """``CLUSTER:ID`` -> (cluster, id); the id may itself contain ':' or '/' (namespace/pod)."""
    cluster, sep, ident = text.partition(":")
    if not sep or not cluster or not ident.strip():
        raise GpuAuditError(f"exempt: expected CLUSTER:ID (e.g. hpc:12345 or k8s:research/notebook), got {text!r}")
    return cluster, ident.strip()


def covered(store: Store, cluster: str, ident: str) -> list[str]:
    """External ids of the allocations in the store an exemption ``cluster:ident`` covers (:func:`ids_of`
    read backwards): the id itself, a pod by ``namespace/name``, every task of a Slurm array job."""
    t = schema.allocations
    conds = [t.c.external_id == ident]
    if "/" in ident:
        ns, _, name = ident.partition("/")
        conds.append((t.c.source == "kubernetes") & (t.c.account == ns) & (t.c.name == name))
    if re.fullmatch(UINT, ident):  # digits only: no LIKE wildcard in it; tasks 123_N, components 123+N
        conds += [t.c.external_id.like(f"{ident}!_%", escape="!"), t.c.external_id.like(f"{ident}+%")]
    with store.engine.connect() as conn:
        rows = conn.execute(select(t.c.external_id, t.c.source, t.c.account, t.c.name)
                            .where(t.c.cluster == cluster, or_(*conds))).mappings().all()
    return sorted({str(r["external_id"]) for r in rows if ident in ids_of(dict(r))})


def near_misses(store: Store, cluster: str, ident: str) -> list[str]:
    """Ids of the cluster that look like ``ident`` (a typo, a missing task suffix), running ones first."""
    t = schema.allocations
    with store.engine.connect() as conn:
        rows = conn.execute(select(t.c.external_id, t.c.source, t.c.account, t.c.name)
                            .where(t.c.cluster == cluster).order_by(t.c.end_ts.isnot(None), t.c.id.desc())
                            .limit(20000)).all()
    names = list(dict.fromkeys(f"{r.account}/{r.name}" if r.source == "kubernetes" and "/" in ident
                               else str(r.external_id) for r in rows))
    prefix = [n for n in names if n.startswith(ident) or ident.startswith(n)]
    return list(dict.fromkeys(prefix + difflib.get_close_matches(ident, names, n=SHOW, cutoff=0.6)))[:SHOW]


def _text(flag: str, value: str) -> str:
    """Free text for the trail: no control characters (a newline forges a line, a NUL fails PostgreSQL)."""
    if has_control(value):
        raise GpuAuditError(f"exempt: {flag} has a control character ({log_safe(value)[:80]}); "
                            "write it on one line, in plain text")
    return value.strip()


def add(store: Store, cfg: Config, target: str, until: str, reason: str, *, by: str | None = None,
        future: bool = False, now: datetime | None = None) -> dict[str, Any]:
    """Record an exemption. The cluster must be configured, the expiry in the future, and the id must match
    an allocation in the store (``covers`` lists them) unless ``future`` (a job not yet seen): a typo'd id
    accepted as if it protected something is how a job got cancelled under an exemption."""
    cluster, ident = parse_target(target)
    if cfg.clusters and cluster not in {c.name for c in cfg.clusters}:
        raise GpuAuditError(f"exempt: unknown cluster {cluster!r} (configured: "
                            f"{', '.join(c.name for c in cfg.clusters)})")
    ident, reason = _text("CLUSTER:ID", ident), _text("--reason", reason)
    by = _text("--by", by) if by is not None else None
    if not reason:
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
    covers = covered(store, cluster, ident)
    if not covers and not future:
        near = near_misses(store, cluster, ident)
        raise GpuAuditError(f"exempt: nothing in the store matches {cluster}:{ident}"
                            + (f" (similar: {', '.join(log_safe(n) for n in near)})" if near else "")
                            + "; check the id, or add --future for a job not yet seen")
    who = actor()
    row = {"cluster": cluster, "external_id": ident[:255], "until_ts": until_ts, "reason": reason[:2000],
           "requested_by": (by or who)[:255], "actor": who, "created_ts": now_ts, "revoked_ts": None}
    with store.begin() as conn:
        row["id"] = conn.execute(insert(schema.exemptions).values(**row)).inserted_primary_key[0]
    return {**row, "covers": covers}


def active(store: Store, cfg: Config, now: int) -> list[dict[str, Any]]:
    """Every exemption standing at ``now``: recorded ones and config rules (for reports)."""
    t = schema.exemptions
    out: list[dict[str, Any]] = []
    with store.engine.connect() as conn:
        for r in conn.execute(select(t).where(t.c.until_ts > now, t.c.revoked_ts.is_(None))
                              .order_by(t.c.until_ts)).mappings():
            out.append({"scope": f"{r['cluster']}:{r['external_id']}", "reason": r["reason"],
                        "by": r["requested_by"], "actor": r["actor"], "until_ts": r["until_ts"],
                        "created_ts": r["created_ts"]})
    for i, rule in enumerate(cfg.exemptions):
        until = _until_ts(rule)
        if until is not None and until <= now:
            continue
        crit = [f"{k}={','.join(v)}" for k, v in (("cluster", rule.clusters), ("user", rule.users),
                ("account", rule.accounts), ("qos", rule.qos), ("namespace", rule.namespaces)) if v]
        crit += [f"label {k}={v}" for k, v in rule.labels.items()]
        out.append({"scope": "; ".join(crit), "reason": rule.reason, "by": f"config exemptions[{i}]",
                    "actor": None, "until_ts": until, "created_ts": None})
    return out


def report_section(store: Store, cfg: Config, since_ts: int, now_ts: int, when: Any) -> dict[str, Any]:
    """For reports: exemptions standing now, and the enforcement log since the window start, newest first: at
    most ``report.top_n`` rows, those that did something first; ``log_total`` says how many there were (the
    reports say how many they left out and where to see them: ``gpu-audit enforce-log``)."""
    t = schema.enforcement_log
    with store.engine.connect() as conn:
        # the rows that did something (warnings, actions, dry runs, failures) before the decisions not to act,
        # so a cut never drops the warning that led to a cancel (issue 44); shown newest first
        acted = (t.c.decision != "skipped").desc()
        log = [dict(r) for r in conn.execute(select(t).where(t.c.decided_ts >= since_ts)
                                             .order_by(acted, t.c.id.desc()).limit(cfg.report.top_n)).mappings()]
        log.sort(key=lambda r: -r["id"])
        total = conn.execute(select(func.count()).select_from(t).where(t.c.decided_ts >= since_ts)).scalar()
    ex = active(store, cfg, now_ts)
    return {"exemptions": [{**e, "until": when(e["until_ts"]) or "no expiry"} for e in ex],
            "log": [{"when": when(r["decided_ts"]), "target": r["target"], "stage": r["stage"],
                     "action": r["action"], "decision": r["decision"], "dry_run": bool(r["dry_run"]),
                     "reason": r["reason"], "actor": r["actor"], "result": r["result"] or ""} for r in log],
            "log_total": int(total or 0)}
