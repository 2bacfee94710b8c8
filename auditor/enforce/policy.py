"""Graduated enforcement (docs/enforcement.md): per policy, nudge the owner after X hours idle, escalate to
the team lead or sponsor, act after Y hours; tell reservation owners about idle reservations.

How a decision is taken, for each allocation the store says is running and a policy covers:

1. For each stage the policy has (warn / escalate / act after H hours), the trailing window [now - H, now)
   is judged by the audit itself (a what-if run, removed afterwards), so verdicts follow the definitions.
   A stage fires when the allocation ran the whole window, telemetry covers at least ``min_coverage`` of
   its reserved time and idle + mirage time is at least ``idle_fraction`` of the RESERVED time: unknown,
   infrastructure and busy_unverified time never count as idle (for acting: idle-by-util only with
   ``act_on_util_only``, mirage only with ``act_on_mirage`` and once the audit itself calls it a mirage).
   A GPU its own job's input starved (input/storage wait, :mod:`auditor.audit.starved`) is never a target
   of any stage, nor one idle while a shared node's host read busy (it could be another job's input).
2. The highest firing stage is taken; then exemptions, the live check (still running? nodes healthy?), and
   for acting :meth:`Run.proof`, the ONE place that proves the rule (a)-(e) of docs/enforcement.md before
   any scheduler write, then the per-run cap and the dry-run switch.
3. Every action and every decision not to act (blocked stage, exemption, stale, cap, dry-run, failure)
   is written to ``enforcement_log`` with its evidence. Allocations that are simply not idle are only in
   the run's output.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import delete, insert, or_, select

from auditor.audit import exempt
from auditor.audit.money import Pricing
from auditor.audit.verdict import EPS
from auditor.config import Config, Policy, Thresholds
from auditor.errors import GpuAuditError
from auditor.report.channels import Message, Notifier
from auditor.report.mailparts import safe_header
from auditor.store import schema
from auditor.store.engine import Store
from auditor.timeutil import H, floor_to, utcnow

log = logging.getLogger("gpu_audit.enforce")
STAGES = ("act", "escalate", "warn")
Backends = Callable[[str, str], Any]  # (cluster, source) -> a backend (inspect, execute) or None


def policy_for(cfg: Config, a: dict[str, Any], *, any_partition: bool = False) -> Policy | None:
    """The first policy whose scope covers the allocation (an empty list matches anything).
    ``any_partition``: a reservation has no partition, so the partitions criterion does not apply."""
    k8s = a["source"] == "kubernetes"
    for p in cfg.policies:
        if p.clusters and a["cluster"] not in p.clusters:
            continue
        if p.partitions and not any_partition and a["partition"] not in p.partitions:
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
                        "unknown_s", "busy_unverified_s", "infra_s", "max_gpu_mirage_s", "input_wait_s",
                        "host_busy_idle_s", "idle_by_counters_s", "busy_by_counters_s", "engine_spin_s") if c in ua.c]
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
             now_ts: int, th: Thresholds | None = None) -> tuple[str, str, dict[str, Any]]:
    """('idle' | 'not_idle' | 'blocked', reason, evidence) of one stage's trailing window. For the act
    stage only SM-verified time counts (rule (b)): idle-by-util only with ``act_on_util_only``, mirage only
    with ``act_on_mirage`` and once a GPU's mirage lasted as long as the audit needs to report one, and no
    infrastructure-affected time at all."""
    u = u or {}
    mirage_min_s = (th or Thresholds()).mirage_min_minutes * 60
    reserved = u.get("reserved_s", 0.0)
    busy_unverified = u.get("busy_unverified_s", 0.0)  # column of the verdict change; absent = 0
    util_only = u.get("idle_by_util_s", 0.0)
    by_counters = u.get("idle_by_counters_s", 0.0)  # idle on the stock counters: not SM-verified either
    spin = u.get("engine_spin_s", 0.0)
    mirage = u.get("mirage_s", 0.0)
    infra = u.get("infra_s", 0.0)
    starved = u.get("input_wait_s", 0.0)  # GPU starved by its own job's input (auditor.audit.starved)
    host_busy = u.get("host_busy_idle_s", 0.0)  # idle while a shared node's host read busy
    act = stage == "act"
    mirage_counts = not act or (p.act_on_mirage and u.get("max_gpu_mirage_s", 0.0) >= mirage_min_s - EPS)
    idle = u.get("idle_s", 0.0) + (mirage if mirage_counts else 0.0)
    if act and not p.act_on_util_only:
        idle -= util_only + by_counters  # only SM-verified idle time may lead to an action
    ev = {"stage": stage, "window_hours": hours, "reserved_gpu_hours": reserved / H,
          "idle_gpu_hours": idle / H, "idle_by_util_gpu_hours": util_only / H, "mirage_gpu_hours": mirage / H,
          "working_gpu_hours": u.get("working_s", 0.0) / H, "low_gpu_hours": u.get("low_s", 0.0) / H,
          "unknown_gpu_hours": u.get("unknown_s", 0.0) / H, "busy_unverified_gpu_hours": busy_unverified / H,
          "infra_gpu_hours": infra / H, "input_wait_gpu_hours": starved / H,
          "host_busy_idle_gpu_hours": host_busy / H, "idle_by_counters_gpu_hours": by_counters / H,
          "busy_by_counters_gpu_hours": u.get("busy_by_counters_s", 0.0) / H, "engine_spin_gpu_hours": spin / H,
          "coverage": (u.get("observed_s", 0.0) / reserved) if reserved > 0 else None,
          "idle_share": (idle / reserved) if reserved > 0 else None,
          "idle_fraction": p.idle_fraction, "min_coverage": p.min_coverage}
    if a["start_ts"] is None or a["start_ts"] > now_ts - hours * H:
        return "not_idle", f"running {(now_ts - (a['start_ts'] or now_ts)) / H:.2f} h < {hours:g} h", ev
    if reserved <= 0:
        return "blocked", "no reserved time in the window", ev
    if ev["coverage"] < p.min_coverage - EPS:
        return "blocked", (f"telemetry coverage {ev['coverage']:.0%} < min_coverage {p.min_coverage:.0%} "
                           f"(unknown {ev['unknown_gpu_hours']:.2f} GPU-h is never idle)"), ev
    if act and infra > 0:
        return "blocked", (f"{infra / H:.2f} GPU-h of the window inside an infrastructure event (never idle; "
                           "acting waits for a window without one)"), ev
    if starved > 0:  # never an enforcement target, never told to release its GPU (issue 44)
        return "blocked", (f"{starved / H:.2f} GPU-h of the window the GPU waited on the job's own input "
                           "(input/storage wait, GPU starved: SM ~0 while its storage or input cores were busy "
                           "on a node it held whole): working, not idle"), ev
    if host_busy > 0 and ev["idle_share"] >= p.idle_fraction - EPS:
        return "blocked", (f"idle {ev['idle_share']:.0%} of reserved time, but {host_busy / H:.2f} GPU-h of it "
                           "while the node's host read busy on a node the job shares: the I/O or cores could be "
                           "this job's input or another job's, so gpu-audit does not act"), ev
    # a mirage is named as one (issue 44: a mirage's warning said "idle 100 %", its outlook "idle 1 % < 95 %")
    ev["mirage_share"] = mirage / reserved
    mirage_words = (f" (of it a mirage {ev['mirage_share']:.0%}: GPU-Util read busy while the SM did no work)"
                    if mirage > 0 and mirage_counts else "")
    if ev["idle_share"] >= p.idle_fraction - EPS:
        return "idle", (f"idle {ev['idle_share']:.0%} of reserved time in the last {hours:g} h >= "
                        f"{p.idle_fraction:.0%}{mirage_words}"), ev
    why = f"idle {ev['idle_share']:.0%} < {p.idle_fraction:.0%}{mirage_words}"
    if act and mirage > 0 and not mirage_counts:
        why = (f"mirage {ev['mirage_share']:.0%} of reserved time (GPU-Util busy while SM idle) acts only with "
               f"act_on_mirage and after {mirage_min_s / 60:g} min of mirage: warn instead; idle without the "
               f"mirage {ev['idle_share']:.0%} < {p.idle_fraction:.0%}")
        return "blocked", why, ev
    if busy_unverified > 0 or (act and util_only > 0 and not p.act_on_util_only):
        why += " (busy_unverified and GPU-Util-only time do not count as idle)"
        return "blocked", why, ev
    if spin > 0 or (act and by_counters > 0 and not p.act_on_util_only):
        why += (" (engine-spin time, and for acting idle-by-counters time, judged without SM activity, do not "
                "count as idle)")
        return "blocked", why, ev
    return "not_idle", why, ev


#: the controller chains gpu-audit follows (rule (c)), pod first, and which link is acted on (None: the pod)
CHAINS: dict[tuple[str, ...], int | None] = {(): None, ("ReplicaSet", "Deployment"): 1, ("StatefulSet",): 0,
                                             ("Job",): 0, ("Job", "CronJob"): 0}
#: owners whose selector must select their child (a CronJob has none: it owns Jobs by reference only)
SELECTING = {"ReplicaSet", "Deployment", "StatefulSet", "Job"}


def selects(selector: Any, labels: dict[str, str]) -> bool:
    """Whether a LabelSelector (matchLabels / matchExpressions) selects ``labels``. An empty or unreadable
    selector proves nothing: False."""
    if not isinstance(selector, dict) or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        if not isinstance(e, dict):
            return False
        key, op, vals = e.get("key"), e.get("operator"), set(e.get("values") or [])
        if op == "In" and labels.get(key) not in vals:
            return False
        if op == "NotIn" and key in labels and labels[key] in vals:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


def verify_chain(chain: list[dict[str, Any]], ns: str) -> tuple[str, dict[str, Any] | None]:
    """('' or why the chain is refused, the owner to act on or None for the pod itself). Each link's live
    uid must be the uid its child's ownerReference names and, where the owner has a selector, select the
    child: a pod cannot point gpu-audit at someone else's workload."""
    kinds = tuple(str(c.get("kind")) for c in chain)
    if kinds not in CHAINS:
        return (f"owner chain Pod -> {' -> '.join(kinds)} is not one gpu-audit follows (Pod -> ReplicaSet -> "
                "Deployment, Pod -> StatefulSet, Pod -> Job [-> CronJob])"), None
    child = "Pod"
    for link in chain:
        what = f"{link.get('kind')} {ns}/{link.get('name')}"
        if link.get("child_kind") != child:
            return f"{what}: the chain skips a link (child {link.get('child_kind')}, expected {child})", None
        if not link.get("uid") or link.get("uid") != link.get("ref_uid"):
            return (f"{what}: live uid {link.get('uid') or '(not found)'} is not the uid {link.get('ref_uid')} "
                    f"the {child}'s ownerReference names"), None
        if link.get("kind") in SELECTING and not selects(link.get("selector"), link.get("child_labels") or {}):
            return f"{what}: its selector does not select the {child}", None
        child = str(link.get("kind"))
    top = CHAINS[kinds]
    return "", (None if top is None else chain[top])


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
        self.judged: dict[float, dict[int, dict[str, float]]] = {}
        self.covered: set[int] = set()  # allocations already acted on in this run as part of a unit
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
        self.judged = judged
        try:
            for a, p in cands:
                if a["id"] not in self.covered:
                    self.decide(a, p, judged)
            self.reservations()
        finally:
            self.notifier.close()
        self.out["acted"] = self.acts
        return self.out

    def target_of(self, a: dict[str, Any]) -> str:
        return (f"kubernetes {a['account']}/{a['name']}" if a["source"] == "kubernetes"
                else f"{a['source']} job {a['external_id']}")

    def decide(self, a: dict[str, Any], p: Policy, judged: dict[float, dict[int, dict[str, float]]]) -> None:
        a["team"] = self.pricing.team_of(a)
        target = self.target_of(a)
        blocked: list[tuple[str, str, dict[str, Any]]] = []
        chosen = None
        for stage, h in sorted(stage_hours(p).items(), key=lambda s: STAGES.index(s[0])):
            status, reason, ev = evaluate(judged[h].get(a["id"]), a, p, stage, h, self.end_ts, self.cfg.thresholds)
            faults = self.faults(a, self.end_ts - int(h * H))
            if faults:
                ev["faults"] = faults  # (b): in the evidence whatever the stage; acting is refused below
            if a.get("reservation"):
                ev["reservation"] = a["reservation"]
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

    def faults(self, a: dict[str, Any], since_ts: int) -> list[str]:
        """Infrastructure events (node_events: XID, ECC, throttle, drain, down, ...) on the allocation's GPUs
        or their whole node that overlap [since, now]."""
        ne, g = schema.node_events, schema.allocated_gpus
        with self.store.engine.connect() as conn:
            gpus = [(r.node, r.gpu_index) for r in conn.execute(select(g.c.node, g.c.gpu_index)
                                                                 .where(g.c.allocation_id == a["id"]))]
            nodes = sorted({n for n, _ in gpus})
            if not nodes:
                return []
            rows = conn.execute(select(ne.c.node, ne.c.gpu_index, ne.c.kind, ne.c.reason, ne.c.start_ts).where(
                ne.c.cluster == a["cluster"], ne.c.node.in_(nodes), ne.c.start_ts <= self.now_ts,
                or_(ne.c.end_ts.is_(None), ne.c.end_ts >= since_ts)).order_by(ne.c.start_ts)).all()
        out = []
        for r in rows:
            if r.gpu_index == -1 or (r.node, r.gpu_index) in gpus or (r.node, None) in gpus:
                where = r.node if r.gpu_index == -1 else f"{r.node} GPU {r.gpu_index}"
                out.append(f"{r.kind} on {where} since {datetime.fromtimestamp(r.start_ts, UTC):%Y-%m-%d %H:%M}Z"
                           + (f": {' '.join(str(r.reason).split())[:120]}" if r.reason else ""))
        return out

    def stale(self, cluster: str) -> str:
        """Rule (d): '' when every source of the cluster was collected up to the judged window's end (to
        within one bucket), else why the evidence is too old to act on."""
        from auditor.config import source_key

        t = schema.watermarks
        with self.store.engine.connect() as conn:
            marks = {r.source: r.watermark_ts for r in conn.execute(
                select(t.c.source, t.c.watermark_ts).where(t.c.cluster == cluster))}
        cl = next((c for c in self.cfg.clusters if c.name == cluster), None)
        keys = [source_key(role, i, src) for role in ("allocations", "telemetry")
                for i, src in enumerate(getattr(cl, role) if cl else [])]
        if not keys and not marks:
            return f"no successful collection recorded for cluster {cluster}: the evidence's age is unknown"
        need = self.end_ts - self.cfg.store.bucket_seconds
        for key in keys or sorted(marks):
            wm = marks.get(key)
            if wm is None:
                return f"stale evidence: {cluster} {key} was never collected successfully"
            if wm < need:
                return (f"stale evidence: {cluster} {key} last collected up to "
                        f"{datetime.fromtimestamp(wm, UTC):%Y-%m-%d %H:%M}Z, the judged window ends "
                        f"{self.end:%Y-%m-%d %H:%M}Z (a failing collector never makes old evidence act)")
        return ""

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
            self.notify(a, p, stage, reason, ev, target, outlook=self.outlook(a, p, backend, live))
            return
        if live is None:
            self.log(a, p.name, stage, "none", "skipped", f"no action backend for {a['source']} on "
                     f"{a['cluster']} (needs a slurm or kubernetes allocation source)", ev, target)
            return
        if live.blocked:
            self.log(a, p.name, stage, live.action, "skipped", live.blocked, ev, target)
            return
        why, unit, ev = self.proof(a, p, live, ev, target)
        if why:
            self.log(a, p.name, stage, live.action, "skipped", why, ev, target)
            return
        if self.acts >= self.cfg.enforce.max_actions_per_run:
            self.log(a, p.name, stage, live.action, "skipped",
                     f"cap reached: enforce.max_actions_per_run = {self.cfg.enforce.max_actions_per_run}", ev, target)
            return
        self.acts += 1
        self.covered.update(m["id"] for m in unit)
        others = [m for m in unit if m["id"] != a["id"]]
        if self.dry_run:
            self.log(a, p.name, stage, live.action, "dry_run", f"would {live.action}: {reason}", ev, target)
            for m in others:
                self.log(m, p.name, stage, live.action, "dry_run", f"would {live.action} with {target}", ev, target)
            return
        try:
            result = backend.execute(a, live)
        except BACKEND_ERRORS as exc:
            self.log(a, p.name, stage, live.action, "failed", reason, ev, target, _one(exc))
            return
        self.log(a, p.name, stage, live.action, "done", reason, ev, target, result)
        for m in others:  # every allocation the action stopped has its row (its job page shows it)
            self.log(m, p.name, stage, live.action, "done", f"stopped with {target}: {reason}", ev, target, result)
        self.notify(a, p, "action", f"{live.action}: {reason}", ev, target, log_it=False)

    # -- the rule (a)-(e) of docs/enforcement.md, in one place ----------------------------------------
    def proof(self, a: dict[str, Any], p: Policy, live: Any, ev: dict[str, Any], target: str
              ) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
        """('' or why not, the unit's allocations, the evidence) for acting on ``live``. Every check is
        here, after the backend only reported what the scheduler says, so no backend can skip one:
        (c) the live object is the judged one, (a) the unit acted on is exactly allocations judged idle,
        (b) each of them on SM-verified, covered time without a fault or reservation, (d) on fresh
        evidence, (e) none of them exempt."""
        h = stage_hours(p)["act"]
        why = self.same_identity(a, p, live)  # (c)
        if why:
            return f"not provably the judged {a['source']} allocation: {why}", [], ev
        unit, why = self.unit_of(a, p, live, target)  # (a)
        ev = {**ev, "unit": [self.target_of(m) for m in unit]}
        if why:
            return why, unit, ev
        for m in unit:  # (b), for every allocation the action stops
            status, reason, _ = evaluate(self.judged[h].get(m["id"]), m, p, "act", h, self.end_ts,
                                         self.cfg.thresholds)
            name = "" if m["id"] == a["id"] else f"{self.target_of(m)}: "
            if status != "idle":
                return f"{name}{reason}", unit, ev
            faults = self.faults(m, self.end_ts - int(h * H))
            if faults:
                return (f"{name}infrastructure event in the window: {'; '.join(faults[:3])}",
                        unit, {**ev, "faults": faults})
            if m.get("reservation") and not p.act_in_reservations:
                return (f"{name}runs in advance reservation {m['reservation']}: stopping it frees nothing the "
                        "reservation does not hold (act_in_reservations = false)", unit, ev)
        why = self.stale(a["cluster"])  # (d)
        if why:
            return why, unit, ev
        notes = {m.get("uid"): m.get("annotations") for m in live.members}
        for m in unit:  # (e)
            ex = exempt.find(self.store, self.cfg, m, self.now_ts,
                             live.annotations if m["id"] == a["id"] else notes.get(str(m["external_id"])))
            if ex:
                return (f"{self.target_of(m)} is exempt ({ex['by']}): {ex['reason']}", unit,
                        {**ev, "exemption": ex})
        return "", unit, ev

    def nodes_of(self, allocation_id: int) -> list[str]:
        g = schema.allocated_gpus
        with self.store.engine.connect() as conn:
            return sorted({n for (n,) in conn.execute(select(g.c.node).where(g.c.allocation_id == allocation_id))})

    def same_identity(self, a: dict[str, Any], p: Policy, live: Any) -> str:
        """Rule (c): '' when the live object is the judged one, else the difference."""
        got = live.identity or {}
        if a["source"] == "slurm":
            want = {"job_id": str(a["external_id"]), "start_ts": a["start_ts"], "nodes": self.nodes_of(a["id"]),
                    "user": a["user_name"]}
        elif a["source"] == "kubernetes":
            want = {"uid": str(a["external_id"]), "namespace": a["account"], "name": a["name"]}
        else:
            return f"no identity check for source {a['source']}"
        if a["source"] == "slurm" and a.get("sluid") and "sluid" in got:
            # Slurm 25.11+: the SLUID names the run; a requeue keeps the job id and gives a new one. A judged
            # run without one (older Slurm, or collected before) keeps the proof above; a live Slurm that
            # can show one but showed none is doubt: no action
            want["sluid"] = a["sluid"]
        diff = [f"{k} {got.get(k)!r} live, {v!r} judged" for k, v in want.items() if got.get(k) != v]
        if diff:
            return "; ".join(diff) + (" (requeued or moved?)" if a["source"] == "slurm" else "")
        if a["source"] != "kubernetes":
            return ""
        why, owner = verify_chain(live.chain, a["account"])
        if why:
            return why
        want_action = ("delete_pod" if owner is None else "scale_to_zero"
                       if owner["kind"] in ("Deployment", "StatefulSet") else
                       "delete_job" if p.job_action == "delete" else "suspend_job")
        have = live.detail.get("owner") or None
        if live.action != want_action or (owner is not None and (not have or (have.get("kind"), have.get("name"),
                                                                              have.get("uid")) !=
                                                                 (owner["kind"], owner["name"], owner["uid"]))):
            return f"the action {live.action} on {live.target} is not what the verified owner chain allows"
        return ""

    def unit_of(self, a: dict[str, Any], p: Policy, live: Any, target: str) -> tuple[list[dict[str, Any]], str]:
        """Rule (a): the allocations the action stops, and '' when each was judged by this policy (same rule,
        same coverage), else why not. A Slurm job or a bare pod is its own unit; an owner's unit is every
        live pod it runs plus every pod of it the store has in the window."""
        if a["source"] != "kubernetes" or live.action == "delete_pod":
            return [a], ""
        t = schema.allocations
        h = stage_hours(p)["act"]
        since = self.end_ts - int(h * H)
        uids = [str(m.get("uid")) for m in live.members]
        if str(a["external_id"]) not in uids:
            return [a], f"{target} does not run {a['account']}/{a['name']} now: its pods are not the judged ones"
        with self.store.engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(select(t).where(
                t.c.cluster == a["cluster"], t.c.source == "kubernetes",
                or_(t.c.external_id.in_(uids), (t.c.account == a["account"]) & (t.c.owner_workload != "") &
                    (t.c.owner_workload == a["owner_workload"]) & (t.c.start_ts < self.end_ts) &
                    (t.c.end_ts.is_(None) | (t.c.end_ts > since)))).order_by(t.c.id)).mappings()]
        by_uid = {str(r["external_id"]): r for r in rows}
        unit = rows
        bad = [f"{m.get('name') or m.get('uid')} is not in the store (never judged)" for m in live.members
               if str(m.get("uid")) not in by_uid]
        kinds = []
        for m in unit:
            if m["id"] == a["id"]:
                continue
            mp = policy_for(self.cfg, m)
            if mp is None or mp.name != p.name:
                bad.append(f"{m['name']} is under policy {mp.name if mp else '(none)'}, not {p.name}")
                continue
            status, reason, ev = evaluate(self.judged.get(h, {}).get(m["id"]), m, p, "act", h, self.end_ts,
                                          self.cfg.thresholds)
            if status != "idle":
                kinds.append("work" if (ev.get("working_gpu_hours") or 0) + (ev.get("low_gpu_hours") or 0) > 0
                             else "not judged idle")
                bad.append(f"{m['name']}: {reason}")
        if bad:
            n = len(bad)
            working = len(kinds) == n and all(k == "work" for k in kinds)
            verb = ("work" if n > 1 else "works") if working else ("are" if n > 1 else "is") + " not judged idle"
            return unit, (f"{n} other pod{'s' if n > 1 else ''} of {target} {verb}: {'; '.join(bad[:5])}"
                          " (an owner is acted on only when every pod it runs was judged idle; deleting the idle "
                          "pod alone would only restart it)")
        return unit, ""

    def outlook(self, a: dict[str, Any], p: Policy, backend: Any, live: Any) -> str:
        """'' when the act stage could really fire for this allocation later, else why it never will (the
        warning must not promise a stop that cannot happen)."""
        if not p.act_after_hours:
            return "the policy never acts"
        if backend is None or live is None:
            return f"no action backend for {a['source']} on {a['cluster']}"
        if live.blocked:
            return live.blocked
        if a.get("reservation") and not p.act_in_reservations:
            return f"it runs in advance reservation {a['reservation']}"
        u = self.judged.get(stage_hours(p)["act"], {}).get(a["id"])
        if u is not None:
            status, reason, _ = evaluate(u, {**a, "start_ts": 0}, p, "act", stage_hours(p)["act"], self.end_ts,
                                         self.cfg.thresholds)
            if status == "blocked" and ("GPU-Util-only" in reason or "mirage" in reason):
                return reason
        return ""

    def notify(self, a: dict[str, Any], p: Policy, stage: str, reason: str, ev: dict[str, Any], target: str,
               *, log_it: bool = True, outlook: str = "") -> None:
        emails, chans = [], []
        if stage == "escalate":
            names = {c.name for c in self.cfg.channels}
            chans = [x for x in p.escalate_to if x in names]
            emails = [x for x in p.escalate_to if x not in names and "@" in x]
            emails += [e for t in self.cfg.teams if t.name == a["team"] for e in t.emails]
        stops = stage != "action" and not outlook
        idle = "is a mirage (reads busy, does no work)" if ev.get("mirage_share", 0.0) >= 0.5 else "is idle"
        what = {"warn": f"{idle} and will be stopped" if stops else idle,
                "escalate": f"{idle} (escalated)", "action": "was stopped"}[stage]
        who = safe_header(f"{target} (user {a['user_name'] or '?'}, team {a['team']})", 300)  # user-controlled
        resv = f" It runs in advance reservation {a['reservation']}." if a.get("reservation") else ""
        faults = f" Infrastructure events in the window: {'; '.join(ev['faults'][:3])}." if ev.get("faults") else ""
        if stage == "action":
            tail = ("It was stopped by gpu-audit; its GPUs are free for others. Resubmit it when it has work for "
                    "the GPUs; if it must not be stopped again, ask the GPU administrators for an exemption.")
        else:
            rules = (f"Policy {p.name}: warn after {p.warn_after_hours or '-'} h, act after "
                     f"{p.act_after_hours or '-'} h idle.")
            fate = (f" It will be stopped once it has been idle for {p.act_after_hours:g} h." if stops and
                    p.act_after_hours else f" It will not be stopped automatically ({outlook})." if outlook
                    and p.act_after_hours else "")
            tail = (f"{rules}{fate} To keep it, ask the GPU administrators for an exemption (gpu-audit exempt "
                    f"{a['cluster']}:{a['external_id']} --until ... --reason ...).")
        body = f"{who} {what}: {reason}.{resv}{faults}\n{tail}"
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
        """Tell owners of active reservations that sat idle over a policy window (issue 44: a notice fired 50 s
        after a reservation started, "0.1 of 0.1 GPU-h idle", and never again while 4.5 of 4.9 GPU-h went
        unused). Each policy's window is its ``warn_after_hours`` (1 h when it has none): the trailing window is
        judged by the audit itself (a what-if run, removed afterwards), a reservation must have existed for the
        whole window and the audit must call it idle there (``idle_reservation``); the owner is told again in
        each later window while it stays idle, at most once per window (the throttle key names the window)."""
        pols = [p for p in self.cfg.policies if p.notify_reservations]
        if not pols:
            return
        judged: dict[float, list[dict[str, Any]]] = {}
        r = schema.reservations
        with self.store.engine.connect() as conn:
            active = conn.execute(select(r.c.id, r.c.cluster, r.c.accounts).where(
                r.c.end_ts > self.now_ts, r.c.start_ts < self.now_ts)).mappings().all()
        for res in active:
            a = {"cluster": res["cluster"], "source": "slurm", "partition": "", "account":
                 (res["accounts"] or [""])[0], "id": None, "reservation_id": res["id"]}
            p = policy_for(self.cfg, a, any_partition=True)  # a reservation has no partition of its own
            if p is None or not p.notify_reservations:
                continue
            hours = p.warn_after_hours or 1.0
            if hours not in judged:
                judged[hours] = idle_reservations(self.store, self.cfg, hours, self.now_ts)
            row = next((x for x in judged[hours] if x["id"] == res["id"]), None)
            if row is None or row["start_ts"] > self.now_ts - hours * H:
                continue  # not idle over the window, or not reserved for the whole of it yet
            target = f"reservation {row['name']}"
            reason = (f"{row['idle_gpu_hours']:.1f} of {row['gpu_hours']:.1f} reserved GPU-hours idle in the last "
                      f"{hours:g} h")
            ev = {"idle_gpu_hours": row["idle_gpu_hours"], "reserved_gpu_hours": row["gpu_hours"],
                  "window_hours": hours}
            slot = int(self.now_ts // (hours * H))  # one notice per window while it stays idle
            sent: list[dict[str, Any]] = []
            for user in row["users"] or [""]:
                msg = Message(kind="notify_owners", subject=f"[gpu-audit] {target} is idle", body=
                              f"{target} on {row['cluster']}: {reason}. Release it if it is not needed.",
                              user=user, period_key=f"resv:{row['id']}:{slot}")
                sent += self.notifier.send(msg)
            fresh = [s for s in sent if s["status"] != "throttled"]
            if fresh:
                self.log(a, p.name, "notify", "notify_owners", "dry_run" if self.dry_run else "done", reason, ev,
                         target, "; ".join(f"{s['to']}: {s['status']}" for s in fresh))


def idle_reservations(store: Store, cfg: Config, hours: float, now_ts: int) -> list[dict[str, Any]]:
    """The reservations the audit calls idle (``idle_reservation``) over [now - hours, now): a what-if run,
    deleted afterwards, as :func:`judge_window`'s."""
    from datetime import timedelta

    from auditor.audit.run import run_audit

    now = datetime.fromtimestamp(now_ts, UTC)
    res = run_audit(store, cfg, now - timedelta(hours=hours), now, what_if=True)
    f, r = schema.findings, schema.reservations
    with store.engine.connect() as conn:
        rows = [dict(x) for x in conn.execute(select(
            f.c.cluster, f.c.idle_gpu_hours, f.c.gpu_hours, r.c.id, r.c.name, r.c.users, r.c.start_ts).join(
            r, r.c.id == f.c.reservation_id).where(f.c.run_id == res.run_id, f.c.kind == "idle_reservation"))
                .mappings()]
    with store.begin() as conn:
        for t in (schema.findings, schema.usage_gpu, schema.usage_allocation):
            conn.execute(delete(t).where(t.c.run_id == res.run_id))
        conn.execute(delete(schema.audit_runs).where(schema.audit_runs.c.id == res.run_id))
    return rows


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
