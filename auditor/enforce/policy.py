"""Graduated enforcement (docs/enforcement.md): per policy, nudge the owner after X hours idle, escalate to
the team lead or sponsor, act after Y hours; tell reservation owners about idle reservations.

How a decision is taken, for each allocation the store says is running and a policy covers:

1. For each stage the policy has (warn / escalate / act after H hours), the trailing window [now - H, now)
   is judged by the audit itself (a what-if run, removed afterwards), so verdicts follow the definitions.
   A stage fires when the allocation ran the whole window, telemetry covers at least ``min_coverage`` of
   its reserved time and idle + mirage time is at least ``idle_fraction`` of the RESERVED time: unknown and
   busy_unverified time never count as idle (and for acting, idle-by-util only with ``act_on_util_only``).
2. The highest firing stage is taken; then, in order: exemptions (recorded, config, pod annotation), the
   live check (still running now? nodes healthy, i.e. no infrastructure trouble? an owner we can stop?),
   for acting the per-run cap and the dry-run switch.
3. Every action and every decision not to act (blocked stage, exemption, stale, cap, dry-run, failure)
   is written to ``enforcement_log`` with its evidence. Allocations that are simply not idle are only in
   the run's output.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import delete, insert, select

from auditor.audit import exempt
from auditor.audit.money import Pricing
from auditor.config import Config, Policy
from auditor.errors import GpuAuditError
from auditor.report.channels import Message, Notifier
from auditor.report.mailparts import safe_header
from auditor.store import schema
from auditor.store.engine import Store
from auditor.timeutil import floor_to, utcnow

log = logging.getLogger("gpu_audit.enforce")
H = 3600.0
STAGES = ("act", "escalate", "warn")
Backends = Callable[[str, str], Any]  # (cluster, source) -> Actions or None


def policy_for(cfg: Config, a: dict[str, Any]) -> Policy | None:
    """The first policy whose scope covers the allocation (an empty list matches anything)."""
    k8s = a["source"] == "kubernetes"
    for p in cfg.policies:
        if p.clusters and a["cluster"] not in p.clusters:
            continue
        if p.partitions and a["partition"] not in p.partitions:
            continue
        if p.accounts and (k8s or a["account"] not in p.accounts):
            continue
        if p.namespaces and (not k8s or a["account"] not in p.namespaces):
            continue
        return p
    return None


def stage_hours(p: Policy) -> dict[str, float]:
    return {s: h for s, h in (("act", p.act_after_hours), ("escalate", p.escalate_after_hours),
                              ("warn", p.warn_after_hours)) if h}


def judge_window(store: Store, cfg: Config, hours: float, now: datetime, clusters: list[str]
                 ) -> dict[int, dict[str, float]]:
    """Per allocation: the audit's seconds for [now - hours, now); the what-if run is deleted afterwards."""
    from datetime import timedelta

    from auditor.audit.run import run_audit

    res = run_audit(store, cfg, now - timedelta(hours=hours), now, clusters=clusters, what_if=True)
    ua = schema.usage_allocation
    cols = [c for c in ("reserved_s", "observed_s", "idle_s", "idle_by_util_s", "mirage_s", "low_s", "working_s",
                        "unknown_s", "busy_unverified_s") if c in ua.c]
    with store.engine.connect() as conn:
        rows = {r.allocation_id: {c: float(getattr(r, c) or 0) for c in cols}
                for r in conn.execute(select(ua.c.allocation_id, *[ua.c[c] for c in cols])
                                      .where(ua.c.run_id == res.run_id))}
    with store.begin() as conn:
        for t in (schema.findings, schema.usage_gpu, schema.usage_allocation):
            conn.execute(delete(t).where(t.c.run_id == res.run_id))
        conn.execute(delete(schema.audit_runs).where(schema.audit_runs.c.id == res.run_id))
    return rows


def evaluate(u: dict[str, float] | None, a: dict[str, Any], p: Policy, stage: str, hours: float,
             now_ts: int) -> tuple[str, str, dict[str, Any]]:
    """('idle' | 'not_idle' | 'blocked', reason, evidence) of one stage's trailing window."""
    u = u or {}
    reserved = u.get("reserved_s", 0.0)
    busy_unverified = u.get("busy_unverified_s", 0.0)  # column of the verdict change; absent = 0
    util_only = u.get("idle_by_util_s", 0.0)
    idle = u.get("idle_s", 0.0) + u.get("mirage_s", 0.0)
    if stage == "act" and not p.act_on_util_only:
        idle -= util_only  # only SM-verified idle time may lead to an action
    ev = {"stage": stage, "window_hours": hours, "reserved_gpu_hours": reserved / H,
          "idle_gpu_hours": idle / H, "idle_by_util_gpu_hours": util_only / H,
          "working_gpu_hours": u.get("working_s", 0.0) / H, "low_gpu_hours": u.get("low_s", 0.0) / H,
          "unknown_gpu_hours": u.get("unknown_s", 0.0) / H, "busy_unverified_gpu_hours": busy_unverified / H,
          "coverage": (u.get("observed_s", 0.0) / reserved) if reserved > 0 else None,
          "idle_share": (idle / reserved) if reserved > 0 else None,
          "idle_fraction": p.idle_fraction, "min_coverage": p.min_coverage}
    if a["start_ts"] is None or a["start_ts"] > now_ts - hours * H:
        return "not_idle", f"running {(now_ts - (a['start_ts'] or now_ts)) / H:.2f} h < {hours:g} h", ev
    if reserved <= 0:
        return "blocked", "no reserved time in the window", ev
    if ev["coverage"] < p.min_coverage - 1e-9:
        return "blocked", (f"telemetry coverage {ev['coverage']:.0%} < min_coverage {p.min_coverage:.0%} "
                           f"(unknown {ev['unknown_gpu_hours']:.2f} GPU-h is never idle)"), ev
    if ev["idle_share"] >= p.idle_fraction - 1e-9:
        return "idle", (f"idle {ev['idle_share']:.0%} of reserved time in the last {hours:g} h >= "
                        f"{p.idle_fraction:.0%}"), ev
    why = f"idle {ev['idle_share']:.0%} < {p.idle_fraction:.0%}"
    if busy_unverified > 0 or (stage == "act" and util_only > 0 and not p.act_on_util_only):
        why += " (busy_unverified and GPU-Util-only time do not count as idle)"
        return "blocked", why, ev
    return "not_idle", why, ev


#: what a scheduler call may raise on an odd answer (connectors raise GpuAuditError for everything known)
BACKEND_ERRORS = (GpuAuditError, ValueError, KeyError, TypeError, AttributeError)


def _one(exc: Exception) -> str:
    text = " ".join(str(exc).split())[:300]
    return text if isinstance(exc, GpuAuditError) else f"{type(exc).__name__}: {text}"


class Run:
    """One enforcement pass; ``backends(cluster, source)`` gives the scheduler actions (None = none)."""

    def __init__(self, store: Store, cfg: Config, *, apply: bool, backends: Backends,
                 now: datetime | None = None) -> None:
        self.store, self.cfg, self.backends = store, cfg, backends
        self.dry_run = not (apply or cfg.enforce.apply)
        self.now = now or utcnow()
        self.now_ts = int(self.now.timestamp())
        # windows end at the last whole bucket: collection reads no further, so the bucket in progress
        # would look unobserved and lower the coverage
        self.end = floor_to(self.now, cfg.store.bucket_seconds)
        self.end_ts = int(self.end.timestamp())
        self.key = uuid.uuid4().hex[:16]
        self.actor = exempt.actor()
        self.notifier = Notifier(store, cfg, dry_run=self.dry_run)
        self.pricing = Pricing(cfg)
        self.acts = 0
        self.longest = 0.0
        self.out: dict[str, Any] = {"run_key": self.key, "dry_run": self.dry_run, "actor": self.actor,
                                    "decisions": [], "not_idle": []}

    def log(self, a: dict[str, Any], policy: str, stage: str, action: str, decision: str, reason: str,
            evidence: dict[str, Any], target: str, result: str | None = None) -> None:
        row = {"run_key": self.key, "decided_ts": self.now_ts, "cluster": a["cluster"],
               "allocation_id": a.get("id"), "reservation_id": a.get("reservation_id"), "target": target[:512],
               "policy": policy, "stage": stage, "action": action, "decision": decision, "reason": reason,
               "actor": self.actor, "dry_run": self.dry_run, "evidence": evidence,
               "result": (result or "")[:1000] or None}
        with self.store.begin() as conn:
            conn.execute(insert(schema.enforcement_log).values(**row))
        self.out["decisions"].append({k: row[k] for k in ("cluster", "target", "policy", "stage", "action",
                                                          "decision", "reason", "result")})
        log.info("%s %s %s: %s (%s)%s", stage, target, action, decision, reason, f": {result}" if result else "")

    # -- allocations ----------------------------------------------------------------------------------
    def running(self) -> list[dict[str, Any]]:
        t = schema.allocations
        with self.store.engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(select(t).where(t.c.end_ts.is_(None), t.c.start_ts.isnot(None))
                                                  .order_by(t.c.id)).mappings()]
        return rows

    def execute(self) -> dict[str, Any]:
        cands = [(a, p) for a in self.running() if (p := policy_for(self.cfg, a)) is not None]
        hours = sorted({h for _, p in cands for h in stage_hours(p).values()})
        self.longest = max(hours, default=0.0)
        clusters = sorted({a["cluster"] for a, _ in cands})
        judged = {h: judge_window(self.store, self.cfg, h, self.end, clusters) for h in hours}
        try:
            for a, p in cands:
                self.decide(a, p, judged)
            self.reservations()
        finally:
            self.notifier.close()
        self.out["acted"] = self.acts
        return self.out

    def decide(self, a: dict[str, Any], p: Policy, judged: dict[float, dict[int, dict[str, float]]]) -> None:
        a["team"] = self.pricing.team_of(a)
        target = f"{a['source']} {a['account'] + '/' if a['source'] == 'kubernetes' else ''}" \
                 f"{a['name'] if a['source'] == 'kubernetes' else 'job ' + str(a['external_id'])}"
        blocked: list[tuple[str, str, dict[str, Any]]] = []
        chosen = None
        for stage, h in sorted(stage_hours(p).items(), key=lambda s: STAGES.index(s[0])):
            status, reason, ev = evaluate(judged[h].get(a["id"]), a, p, stage, h, self.end_ts)
            if status == "idle":
                chosen = (stage, reason, ev)
                break
            if status == "blocked":
                blocked.append((stage, reason, ev))
        for stage, reason, ev in blocked[:1]:  # the highest blocked stage says why nothing stronger happened
            self.log(a, p.name, stage, "none", "skipped", reason, ev, target)
        if chosen is None:
            if not blocked:
                self.out["not_idle"].append({"target": target, "policy": p.name})
            return
        stage, reason, ev = chosen
        if stage == "act" and p.warn_first and not self.warned(a["id"]):
            stage, reason = "warn", f"{reason}; warn_first: acting waits for a warning sent in an earlier run"
        self.act_or_notify(a, p, stage, reason, ev, target)

    def maintenance(self, a: dict[str, Any]) -> str:
        """A maintenance reservation (flag MAINT) on one of the allocation's nodes during the window: the
        site's own work may be why the GPUs sat idle."""
        r, g = schema.reservations, schema.allocated_gpus
        with self.store.engine.connect() as conn:
            nodes = {n for (n,) in conn.execute(select(g.c.node).where(g.c.allocation_id == a["id"]))}
            for row in conn.execute(select(r.c.name, r.c.nodes, r.c.flags).where(
                    r.c.cluster == a["cluster"], r.c.end_ts > self.end_ts - self.longest * H,
                    r.c.start_ts <= self.now_ts)):
                flags = {str(f).upper() for f in row.flags or []}
                hit = sorted(nodes & set(row.nodes or []))
                if "MAINT" in flags and hit:
                    return f"maintenance reservation {row.name} on {', '.join(hit)}"
        return ""

    def warned(self, allocation_id: int) -> bool:
        """Whether a real warning about the allocation went out in an earlier run (warn_first)."""
        t = schema.enforcement_log
        with self.store.engine.connect() as conn:
            return conn.execute(select(t.c.id).where(
                t.c.allocation_id == allocation_id, t.c.stage == "warn", t.c.decision == "done",
                t.c.dry_run.is_(False)).limit(1)).first() is not None

    def act_or_notify(self, a: dict[str, Any], p: Policy, stage: str, reason: str, ev: dict[str, Any],
                      target: str) -> None:
        backend = self.backends(a["cluster"], a["source"])
        live = None
        if backend is not None:
            try:
                live = backend.inspect(a, p)
            except BACKEND_ERRORS as exc:  # one odd answer must not stop the run: log it, go on
                self.log(a, p.name, stage, "none", "skipped", f"cannot check the live state: {_one(exc)}", ev,
                         target)
                return
            target = live.target or target
            ev = {**ev, "live_state": live.state, **({"nodes": live.detail.get("nodes")} if "nodes" in live.detail
                                                      else {})}
        ex = exempt.find(self.store, self.cfg, a, self.now_ts, live.annotations if live else None)
        if ex:
            self.log(a, p.name, stage, "none", "skipped", f"exempt ({ex['by']}): {ex['reason']}",
                     {**ev, "exemption": ex}, target)
            return
        if live is not None and not live.running:
            self.log(a, p.name, stage, "none", "skipped", f"not running any more (state {live.state})", ev, target)
            return
        infra = (live.infra if live is not None else "") or self.maintenance(a)
        if infra:
            self.log(a, p.name, stage, "none", "skipped", f"infrastructure trouble: {infra}", ev, target)
            return
        if stage != "act":
            self.notify(a, p, stage, reason, ev, target)
            return
        if live is None:
            self.log(a, p.name, stage, "none", "skipped", f"no action backend for {a['source']} on "
                     f"{a['cluster']} (needs a slurm or kubernetes allocation source)", ev, target)
            return
        if live.blocked:
            self.log(a, p.name, stage, live.action, "skipped", live.blocked, ev, target)
            return
        if self.acts >= self.cfg.enforce.max_actions_per_run:
            self.log(a, p.name, stage, live.action, "skipped",
                     f"cap reached: enforce.max_actions_per_run = {self.cfg.enforce.max_actions_per_run}", ev, target)
            return
        self.acts += 1
        if self.dry_run:
            self.log(a, p.name, stage, live.action, "dry_run", f"would {live.action}: {reason}", ev, target)
            return
        try:
            result = backend.execute(a, live)
        except BACKEND_ERRORS as exc:
            self.log(a, p.name, stage, live.action, "failed", reason, ev, target, _one(exc))
            return
        self.log(a, p.name, stage, live.action, "done", reason, ev, target, result)
        self.notify(a, p, "action", f"{live.action}: {reason}", ev, target, log_it=False)

    def notify(self, a: dict[str, Any], p: Policy, stage: str, reason: str, ev: dict[str, Any], target: str,
               *, log_it: bool = True) -> None:
        emails, chans = [], []
        if stage == "escalate":
            names = {c.name for c in self.cfg.channels}
            chans = [x for x in p.escalate_to if x in names]
            emails = [x for x in p.escalate_to if x not in names and "@" in x]
            emails += [e for t in self.cfg.teams if t.name == a["team"] for e in t.emails]
        what = {"warn": "is idle and will be stopped" if p.act_after_hours else "is idle",
                "escalate": "is idle (escalated)", "action": "was stopped"}[stage]
        who = safe_header(f"{target} (user {a['user_name'] or '?'}, team {a['team']})", 300)  # user-controlled
        body = (f"{who} {what}: {reason}.\n"
                f"Policy {p.name}: warn after {p.warn_after_hours or '-'} h, act after {p.act_after_hours or '-'} h "
                f"idle. To keep it, ask for an exemption: gpu-audit exempt {a['cluster']}:{a['external_id']} "
                f"--until ... --reason ...")
        msg = Message(kind=stage, subject=f"[gpu-audit] {target} {what}", body=body, team=a["team"],
                      user=a["user_name"], allocation_id=a["id"], emails=emails, channels=chans)
        sent = self.notifier.send(msg)
        if not log_it:
            return
        if not sent:
            self.log(a, p.name, stage, stage, "skipped", f"{reason}; nobody to tell (no channel routes this, "
                     "no email address: set email.user_domain, teams[].emails or escalate_to)", ev, target)
            return
        fresh = [s for s in sent if s["status"] != "throttled"]
        if not fresh:
            self.out["decisions"].append({"target": target, "stage": stage, "decision": "throttled",
                                          "reason": "already told every recipient"})
            return
        failed = [s for s in fresh if s["status"] == "failed"]
        decision = "dry_run" if self.dry_run else ("failed" if len(failed) == len(fresh) else "done")
        result = "; ".join(f"{s['to']}: {s['status']}" for s in fresh)
        self.log(a, p.name, stage, stage, decision, reason, ev, target, result)

    # -- reservations ---------------------------------------------------------------------------------
    def reservations(self) -> None:
        """Tell owners of reservations the latest audit found idle and that are still active."""
        from auditor.audit.run import latest_run

        run_id = latest_run(self.store)
        if run_id is None or not any(p.notify_reservations for p in self.cfg.policies):
            return
        f, r = schema.findings, schema.reservations
        with self.store.engine.connect() as conn:
            rows = conn.execute(select(f.c.cluster, f.c.idle_gpu_hours, f.c.gpu_hours, r.c.id, r.c.name, r.c.users,
                                       r.c.accounts, r.c.end_ts).join(r, r.c.id == f.c.reservation_id)
                                .where(f.c.run_id == run_id, f.c.kind == "idle_reservation",
                                       r.c.end_ts > self.now_ts)).mappings().all()
        for row in rows:
            a = {"cluster": row["cluster"], "source": "slurm", "partition": "", "account":
                 (row["accounts"] or [""])[0], "id": None, "reservation_id": row["id"]}
            p = policy_for(self.cfg, a)
            if p is None or not p.notify_reservations:
                continue
            target = f"reservation {row['name']}"
            reason = f"{row['idle_gpu_hours']:.1f} of {row['gpu_hours']:.1f} reserved GPU-hours idle"
            ev = {"idle_gpu_hours": row["idle_gpu_hours"], "reserved_gpu_hours": row["gpu_hours"]}
            sent: list[dict[str, Any]] = []
            for user in row["users"] or [""]:
                msg = Message(kind="notify_owners", subject=f"[gpu-audit] {target} is idle", body=
                              f"{target} on {row['cluster']}: {reason}. Release it if it is not needed.",
                              user=user, period_key=f"resv:{row['id']}")
                sent += self.notifier.send(msg)
            fresh = [s for s in sent if s["status"] != "throttled"]
            if fresh:
                self.log(a, p.name, "notify", "notify_owners", "dry_run" if self.dry_run else "done", reason, ev,
                         target, "; ".join(f"{s['to']}: {s['status']}" for s in fresh))


def enforce(store: Store, cfg: Config, *, apply: bool = False, base_dir: Path = Path("."),
            backends: Backends | None = None, now: datetime | None = None) -> dict[str, Any]:
    """One enforcement pass (dry-run unless ``apply`` or ``enforce.apply``); returns what was decided."""
    if not cfg.policies:
        return {"dry_run": not (apply or cfg.enforce.apply), "decisions": [], "not_idle": [], "acted": 0,
                "note": "no [[policies]] configured: nothing to enforce"}
    from auditor.store.locks import Lease, default_holder
    from connectors.actions import from_config

    with Lease(store, "enforce", default_holder(), 900) as lease:  # two runs at once could act twice
        if not lease.acquired:
            raise GpuAuditError("another enforcement run holds the `enforce` lease; try again when it ends")
        return Run(store, cfg, apply=apply, backends=backends or from_config(cfg, base_dir), now=now).execute()


def log_rows(store: Store, *, since_ts: int | None = None, limit: int = 200) -> list[dict[str, Any]]:
    """The audit log, newest first (reports, `gpu-audit enforce-log`)."""
    t = schema.enforcement_log
    q = select(t).order_by(t.c.id.desc()).limit(limit)
    if since_ts is not None:
        q = q.where(t.c.decided_ts >= since_ts)
    with store.engine.connect() as conn:
        return [dict(r) for r in conn.execute(q).mappings()]
