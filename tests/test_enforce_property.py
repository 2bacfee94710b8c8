"""The enforcement rule (docs/enforcement.md, (a)-(e)) as a property, on both engines: over generated
fleets (Slurm jobs and Kubernetes bare pods, Deployments and Jobs with 1-3 pods; each allocation idle,
working, unknown, GPU-Util-only, mirage or half covered; GPU faults, recorded exemptions, advance
reservations, a stale collector) and generated live states (requeued, moved or re-owned jobs, a job
requeued under the same id, start, nodes and user with only a new Slurm 25.11 SLUID, gone or
replaced pods, extra replicas the store never saw, forged ownerReferences), ``enforce --apply`` never
takes an action whose effect reaches a working, unknown, fault-affected, exempt, reserved or never-judged
allocation, on stale evidence, or on a live object other than the judged one.

The backend is fake but honest: it implements a backend's inspect and execute over a small in-memory scheduler
(:class:`World`), reports exactly what that scheduler holds (as the real backends report what squeue or
the API server says) and records every execute call. Which allocations an action really reaches is
computed by the world from the real ownership (what the Deployment / Job controllers would stop), not
from what a pod claims: that is the independent oracle. Each generated allocation's class is known by
construction (its telemetry was built from it), so "judged idle" is never taken from the code under test."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete

sys.path.insert(0, str(Path(__file__).parent))
from test_enforce import collected  # noqa: E402

from auditor.audit import exempt  # noqa: E402
from auditor.config import Config, EnforceConfig, Policy  # noqa: E402
from auditor.enforce.policy import enforce  # noqa: E402
from auditor.records import AllocatedGpu, Allocation, GpuBucket, NodeEvent, Reservation  # noqa: E402
from auditor.store import schema  # noqa: E402
from auditor.timeutil import floor_to, utcnow  # noqa: E402
from connectors.actions import LiveState  # noqa: E402

#: GPU_AUDIT_PROPERTY_NOSHRINK=1: report the first failing fleet as generated, unshrunk (quick when a check
#: is dropped on purpose to see this test fail); =generate: generated fleets only, no explicit example
PHASES = {"": list(Phase), "generate": [Phase.generate]}.get(os.environ.get("GPU_AUDIT_PROPERTY_NOSHRINK", ""),
                                                             [Phase.explicit, Phase.reuse, Phase.generate])

CLASSES = ("idle", "working", "unknown", "util_only", "mirage", "half")
#: (SM activity, GPU-Util) of a class's buckets; None = no such field; "half": idle, last third unobserved
TELEMETRY = {"idle": (0.0, 0.0), "working": (0.8, 0.9), "util_only": (None, 0.0), "mirage": (0.0, 0.99),
             "half": (0.0, 0.0)}
HOURS = 1.5  # history; the act window is the last hour


@dataclass
class Unit:
    """One generated allocation: what it really did, and what the live scheduler says about it now."""

    cls: str
    fault: bool = False
    exempt: bool = False
    resv: bool = False
    live: str = "same"  # slurm: same, requeued, resluid, moved, user, gone; k8s pods: same, replaced, gone
    sluid: bool = True  # slurm: the cluster runs 25.11+ (SLUIDs stored and shown live), else older Slurm


@dataclass
class Group:
    kind: str  # bare, deployment, job
    pods: list[Unit]
    extra_live_pod: bool = False  # a pod the owner runs that the store never saw (never judged)
    forge: str = "none"  # none, direct (ref names another Deployment), uid (wrong uid), labels (not selected)


@dataclass
class Fleet:
    jobs: list[Unit]
    groups: list[Group]
    stale: bool = False
    act_on_mirage: bool = False
    act_on_util_only: bool = False
    act_in_reservations: bool = False

    def __repr__(self) -> str:  # short, for hypothesis' falsifying example
        g = [(x.kind, [(u.cls, u.fault, u.exempt, u.live) for u in x.pods], x.extra_live_pod, x.forge)
             for x in self.groups]
        return (f"Fleet(jobs={[(u.cls, u.fault, u.exempt, u.resv, u.live) for u in self.jobs]}, groups={g}, "
                f"stale={self.stale}, mirage={self.act_on_mirage}, util={self.act_on_util_only}, "
                f"resv={self.act_in_reservations})")


def rarely() -> st.SearchStrategy[bool]:
    """True one time in five: each flaw alone must be able to show, so most allocations are otherwise fine."""
    return st.sampled_from((False, False, False, False, True))


#: half the allocations idle, the rest spread over the classes that must never be acted on
classes = st.sampled_from(("idle",) * 5 + CLASSES[1:])
units = st.builds(Unit, cls=classes, fault=rarely(), exempt=rarely(), resv=rarely(),
                  live=st.sampled_from(("same",) * 4 + ("requeued", "resluid", "moved", "user", "gone")),
                  sluid=st.sampled_from((True, True, False)))

CB32 = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def sluid_of(cluster_id: int, at: datetime, seq: int = 0) -> str:
    """A SLUID as Slurm 25.11 makes and prints one (src/common/sluid.c generate_sluid, print_sluid): cluster
    id << 52 | milliseconds << 10 | sequence, as 's' + 13 characters of Crockford's base 32."""
    n = (cluster_id << 52) | (int(at.timestamp() * 1000) << 10) | seq
    return "s" + "".join(CB32[(n >> (5 * (12 - i))) & 31] for i in range(13))


@st.composite
def groups(draw: st.DrawFn) -> Group:
    """Pods of one owner share a class (so whole units can be idle). Half the groups are clean (only
    exemptions vary, often, so an exempt pod inside an otherwise idle unit shows); in the others every pod
    may differ in class, faults and live state, the owner may run a pod the store never saw, and the first
    pod's ownerReference may be forged."""
    base = draw(classes)
    n = draw(st.integers(1, 3))
    kind = draw(st.sampled_from(("bare", "deployment", "deployment", "job")))
    if draw(st.booleans()):
        return Group(kind, [Unit(base, exempt=draw(st.booleans())) for _ in range(n)])
    pods_ = [Unit(draw(classes) if draw(rarely()) else base, fault=draw(rarely()), exempt=draw(rarely()),
                  live=draw(st.sampled_from(("same",) * 6 + ("replaced", "gone")))) for _ in range(n)]
    return Group(kind, pods_, extra_live_pod=draw(rarely()),
                 forge=draw(st.sampled_from(("none",) * 2 + ("direct", "uid", "labels"))))


fleets = st.builds(Fleet, jobs=st.lists(units, min_size=2, max_size=5), groups=st.lists(groups(), min_size=1,
                                                                                         max_size=3),
                   stale=rarely(), act_on_mirage=rarely(), act_on_util_only=rarely(),
                   act_in_reservations=rarely())


@dataclass
class World:
    """The live schedulers. ``jobs``: Slurm job id -> state/start/nodes/user. ``pods``: uid -> pod (name,
    labels, controller ref, phase, node); ``owners``: (kind, name) -> {uid, selector, ref} (ref: the
    owner's own controller reference)."""

    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    owners: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (action, target, deciding allocation)

    def true_parent(self, pod: dict[str, Any]) -> tuple[str, str] | None:
        """The owner a controller really counts the pod under: referenced by uid AND selecting it."""
        ref = pod.get("ref")
        if not ref:
            return None
        o = self.owners.get((ref["kind"], ref["name"]))
        if o is None or o["uid"] != ref["uid"] or not labels_match(o["selector"], pod["labels"]):
            return None
        return ref["kind"], ref["name"]

    def reached(self, action: str, target: str) -> list[str]:
        """What an action really stops: Slurm job ids or pod uids."""
        if action in ("cancel", "requeue"):
            return [target.rsplit(" ", 1)[-1]]
        kind, name = target.split(" ", 1)[0], target.split("/", 1)[1]
        if action == "delete_pod":
            return [u for u, p in self.pods.items() if p["name"] == name]
        out = []
        for u, p in self.pods.items():
            parent = self.true_parent(p)
            if parent is not None and parent[0] == "ReplicaSet":
                rs = self.owners[parent]
                ref = rs.get("ref")
                parent = (ref["kind"], ref["name"]) if ref and self.owners.get((ref["kind"], ref["name"]), {}).get(
                    "uid") == ref["uid"] else None
            if parent == (kind, name) and p["phase"] == "Running":
                out.append(u)
        return out


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


class HonestBackend:
    """A backend's inspect and execute over :class:`World`: reports what the world holds, acts and records."""

    def __init__(self, world: World, cluster: str) -> None:
        self.world, self.cluster = world, cluster

    def inspect(self, alloc: dict[str, Any], policy: Any) -> LiveState:
        if alloc["source"] == "slurm":
            job = self.world.jobs.get(str(alloc["external_id"]))
            if job is None:
                return LiveState(False, state="gone", target=f"slurm job {alloc['external_id']}")
            return LiveState(True, state="RUNNING", target=f"slurm job {alloc['external_id']}",
                             action=policy.slurm_action if policy.slurm_action == "requeue" else "cancel",
                             identity={"job_id": str(alloc["external_id"]), "start_ts": job["start_ts"],
                                       "nodes": sorted(job["nodes"]), "user": job["user"],
                                       # squeue %s / step_id.sluid: only a 25.11+ Slurm shows one
                                       **({"sluid": job["sluid"]} if job["sluid"] else {})})
        ns, name = alloc["account"], alloc["name"]
        pod_uid, pod = next(((u, p) for u, p in self.world.pods.items() if p["name"] == name), (None, None))
        if pod is None:
            return LiveState(False, state="gone", target=f"Pod {ns}/{name}")
        live = LiveState(pod["phase"] == "Running", state=pod["phase"], target=f"Pod {ns}/{name}",
                         identity={"uid": pod_uid, "namespace": ns, "name": name, "node": pod["node"]},
                         detail={"uid": pod_uid})
        if pod_uid != str(alloc["external_id"]):
            live.running, live.state = False, f"replaced (uid {pod_uid})"
            return live
        child, child_kind, child_labels = pod, "Pod", pod["labels"]
        while child.get("ref") and len(live.chain) < 3:
            ref = child["ref"]
            o = self.world.owners.get((ref["kind"], ref["name"]))
            live.chain.append({"kind": ref["kind"], "name": ref["name"], "ref_uid": ref["uid"],
                               "uid": o["uid"] if o else None,
                               "selector": {"matchLabels": o["selector"]} if o and o["selector"] else None,
                               "child_kind": child_kind, "child_labels": child_labels})
            if o is None:
                break
            child, child_kind, child_labels = o, ref["kind"], o.get("labels", {})
        kinds = [c["kind"] for c in live.chain]
        if not kinds:
            live.action = "delete_pod"
            return live
        top = {("ReplicaSet", "Deployment"): 1, ("Job",): 0}.get(tuple(kinds))
        if top is None:
            live.blocked = f"chain {kinds}"
            return live
        owner = live.chain[top]
        live.target = f"{owner['kind']} {ns}/{owner['name']}"
        live.detail["owner"] = {"kind": owner["kind"], "name": owner["name"], "uid": owner["uid"]}
        live.action = "scale_to_zero" if owner["kind"] == "Deployment" else "suspend_job"
        parents = {owner["uid"]} | {o["uid"] for o in self.world.owners.values()
                                    if o.get("ref") and o["ref"]["uid"] == owner["uid"]}
        live.members = [{"uid": u, "name": p["name"], "annotations": {}} for u, p in self.world.pods.items()
                        if p.get("ref") and p["ref"]["uid"] in parents and p["phase"] == "Running"]
        return live

    def execute(self, alloc: dict[str, Any], live: LiveState) -> str:
        self.world.calls.append((live.action, live.target, str(alloc["external_id"])))
        return "ok"


def build(store: Any, f: Fleet, now: datetime) -> tuple[World, dict[str, dict[str, Any]], Config]:
    """Store the fleet's judged past, build the live world; returns (world, truth per job id / pod uid, cfg)."""
    t0 = now - timedelta(hours=HOURS)
    world, truth = World(), {}
    recs: list[Any] = []
    exempts: list[str] = []
    node_no = 0

    def gpu_history(cluster: str, node: str, u: Unit) -> None:
        if u.cls == "unknown":
            return
        sm, util = TELEMETRY[u.cls]
        n = int(HOURS * 12) - (6 if u.cls == "half" else 0)  # "half": the last 30 min unobserved
        recs.extend(GpuBucket(cluster, node, 0, t0 + timedelta(seconds=300 * i), 300, 10, sm_active=sm,
                              gpu_util=util) for i in range(n))
        if u.fault:
            at = now - timedelta(minutes=20)  # an XID is a moment: no infrastructure time to speak of
            recs.append(NodeEvent(cluster, node, "xid", at, at, gpu=0, reason="XID 79", source="dcgm"))

    for i, u in enumerate(f.jobs):
        node_no += 1
        node, jid = f"n{node_no}", str(1000 + i)
        if u.live == "resluid":  # only a 25.11+ Slurm tells this requeue apart
            u.sluid = True
        run = sluid_of(77, t0, i) if u.sluid else None
        recs.append(Allocation("hpc", "slurm", jid, user=f"user{i}", account="acct", partition="gpu", start=t0,
                               reservation="resv-a" if u.resv else "", gpus=[AllocatedGpu(node, 0)], sluid=run))
        gpu_history("hpc", node, u)
        truth[jid] = {"unit": u, "same": u.live == "same"}
        if u.exempt:
            exempts.append(f"hpc:{jid}")
        if u.live != "gone":
            world.jobs[jid] = {"start_ts": int((now - timedelta(seconds=60)).timestamp()) if u.live == "requeued"
                               else int(t0.timestamp()), "nodes": ["elsewhere"] if u.live == "moved" else [node],
                               "user": "mallory" if u.live == "user" else f"user{i}",
                               # requeued within the judged start second, onto the same node: a new run, and
                               # only its SLUID says so
                               "sluid": sluid_of(77, now, i) if u.live == "resluid" else run}
    if any(u.resv for u in f.jobs):
        recs.append(Reservation("hpc", "resv-a", t0, now + timedelta(hours=4), nodes=[], gpu_count=1))
    for gi, g in enumerate(f.groups):
        name = f"w{gi}"
        owner_uid, rs_uid = f"{gi}-owner", f"{gi}-rs"
        sel = {"app": name}
        if g.kind == "deployment":
            world.owners[("Deployment", name)] = {"uid": owner_uid, "selector": sel, "labels": sel}
            world.owners[("ReplicaSet", f"{name}-rs")] = {
                "uid": rs_uid, "selector": sel, "labels": sel,
                "ref": {"kind": "Deployment", "name": name, "uid": owner_uid}}
            ref = {"kind": "ReplicaSet", "name": f"{name}-rs", "uid": rs_uid}
            owner_wl = f"Deployment/{name}"
        elif g.kind == "job":
            world.owners[("Job", name)] = {"uid": owner_uid, "selector": sel, "labels": sel}
            ref, owner_wl = {"kind": "Job", "name": name, "uid": owner_uid}, f"Job/{name}"
        else:
            ref, owner_wl = None, ""
        members = [*g.pods, *([Unit("working")] if g.extra_live_pod and ref else [])]
        for pi, u in enumerate(members):
            node_no += 1
            node, pname, puid = f"k{node_no}", f"{name}-{pi}", f"{gi}-pod-{pi}"
            labels, pref = dict(sel), ref
            if pi == 0 and ref and g.forge == "labels":
                labels = {"app": "other"}
            if pi == 0 and ref and g.forge == "uid":
                pref = {**ref, "uid": "forged-uid"}
            if pi == 0 and g.forge == "direct":  # names the victim Deployment v{gi} directly, with its real uid
                world.owners[("Deployment", f"v{gi}")] = {"uid": f"{gi}-victim", "selector": {"app": f"v{gi}"},
                                                          "labels": {"app": f"v{gi}"}}
                world.pods[f"{gi}-victim-pod"] = {"name": f"v{gi}-0", "labels": {"app": f"v{gi}"}, "node": "kv",
                                                   "phase": "Running", "ref": {"kind": "ReplicaSet",
                                                                               "name": f"v{gi}-rs",
                                                                               "uid": f"{gi}-vrs"}}
                world.owners[("ReplicaSet", f"v{gi}-rs")] = {
                    "uid": f"{gi}-vrs", "selector": {"app": f"v{gi}"}, "labels": {"app": f"v{gi}"},
                    "ref": {"kind": "Deployment", "name": f"v{gi}", "uid": f"{gi}-victim"}}
                truth[f"{gi}-victim-pod"] = {"unit": Unit("working"), "same": True}  # bob's, working, not stored
                pref = {"kind": "Deployment", "name": f"v{gi}", "uid": f"{gi}-victim"}
            in_store = not (g.extra_live_pod and ref and pi == len(members) - 1)
            live_uid = f"{puid}-new" if u.live == "replaced" else puid
            if u.live != "gone":
                world.pods[live_uid] = {"name": pname, "labels": labels, "node": node, "phase": "Running",
                                        "ref": pref}
            truth[live_uid] = {"unit": u if in_store else Unit("unknown"), "same": u.live == "same" and in_store}
            if in_store:
                recs.append(Allocation("k8s", "kubernetes", puid, name=pname, user="alice", account="ml", start=t0,
                                       owner_workload=owner_wl, gpus=[AllocatedGpu(node, 0)]))
                gpu_history("k8s", node, u)
                if u.exempt:
                    exempts.append(f"k8s:{puid}")
    store.ingest(recs)
    collected(store, ["hpc", "k8s"], now - timedelta(hours=1) if f.stale else now)
    cfg = Config(clusters=[{"name": "hpc"}, {"name": "k8s"}],
                 policies=[Policy(name="p", warn_after_hours=None, act_after_hours=1,
                                  act_on_mirage=f.act_on_mirage, act_on_util_only=f.act_on_util_only,
                                  act_in_reservations=f.act_in_reservations)],
                 enforce=EnforceConfig(apply=True, max_actions_per_run=100))
    for target in exempts:
        exempt.add(store, cfg, target, "now+1day", "generated exemption", by="prop", now=now)
    return world, truth, cfg


def acceptable(f: Fleet, t: dict[str, Any] | None) -> str:
    """'' when acting on this live allocation is allowed by the rule, judged from how it was generated."""
    if t is None:
        return "never judged (not in the store)"
    u: Unit = t["unit"]
    ok_classes = {"idle"} | ({"mirage"} if f.act_on_mirage else set()) | ({"util_only"} if f.act_on_util_only
                                                                          else set())
    for bad, why in ((u.cls not in ok_classes, f"{u.cls}, not idle"), (u.fault, "a fault in the window"),
                     (u.exempt, "exempt"), (u.resv and not f.act_in_reservations, "in a reservation"),
                     (not t["same"], f"live identity differs ({u.live})"), (f.stale, "stale evidence")):
        if bad:
            return why
    return ""


def clear(store: Any) -> None:
    with store.begin() as conn:
        for t in reversed(schema.metadata.sorted_tables):
            conn.execute(delete(t))


@settings(max_examples=20, deadline=None, derandomize=True, phases=PHASES,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(f=fleets)
# two shapes the 20 derandomized examples may miss (the other flaws are found by generation): an exempt pod
# inside an otherwise idle Deployment, and a pod whose labels its ReplicaSet does not select (a forged chain)
@example(f=Fleet(jobs=[], groups=[Group("deployment", [Unit("idle", exempt=True), Unit("idle")])]))
@example(f=Fleet(jobs=[], groups=[Group("deployment", [Unit("idle"), Unit("idle")], forge="labels")]))
# Slurm 25.11: an idle job requeued with the same job id, start, nodes and user, a new SLUID (another run)
@example(f=Fleet(jobs=[Unit("idle", live="resluid"), Unit("idle")], groups=[]))
def test_no_action_reaches_anything_but_judged_idle_work(store: Any, f: Fleet) -> None:
    clear(store)
    now = floor_to(utcnow(), 300)
    world, truth, cfg = build(store, f, now)
    backends = {"slurm": HonestBackend(world, "hpc"), "kubernetes": HonestBackend(world, "k8s")}
    res = enforce(store, cfg, backends=lambda cluster, source: backends.get(source), now=now)
    for action, target, decided in world.calls:
        reached_all = world.reached(action, target)
        # an action decided for an allocation must reach that allocation: else it acted on someone else's
        # object (a forged owner chain, a replaced pod)
        assert decided in reached_all, f"{action} {target} was decided for {decided} but reaches {reached_all}"
        for reached in reached_all:
            why = acceptable(f, truth.get(reached))
            assert not why, f"{action} {target} (decided for {decided}) reached {reached}: {why}; {res['decisions']}"
