"""Issue 31 items 1, 2 and 11 on a real store (SQLite and PostgreSQL) with the real ``kubernetes`` client
against the replay server (tests/k8s_actions.py): an owner is acted on only when every pod it runs was
judged idle; a pod's ownerReference is never believed (only verified chains Pod -> ReplicaSet -> Deployment,
Pod -> StatefulSet, Pod -> Job [-> CronJob], each owner's uid and selector checked); a write's outcome is
its HTTP status. The extra pods, ReplicaSets and Jobs are deep copies of the recorded v1.24 objects
(tests/fixtures/kubernetes/pods-all.json, replicasets-all.json, jobs-all.json) with new names, uids and
labels; telemetry is hand-built (SM 0.0 = idle, 0.8 = working, every 5 minutes for 3 hours)."""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from k8s_actions import ActionServer, workload  # noqa: E402
from k8s_server import TOKEN  # noqa: E402
from test_enforce import TOKEN_ENV, backends, collected, log_rows, series  # noqa: E402

from auditor.config import Config, EnforceConfig, Policy  # noqa: E402
from auditor.enforce.policy import enforce  # noqa: E402
from auditor.records import AllocatedGpu, Allocation  # noqa: E402
from auditor.timeutil import floor_to, utcnow  # noqa: E402

NS = "ml"


def uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


@pytest.fixture
def now() -> datetime:
    return floor_to(utcnow(), 300)


@pytest.fixture
def srv(monkeypatch: pytest.MonkeyPatch) -> Iterator[ActionServer]:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with ActionServer() as s:
        yield s


def add_pod(srv: ActionServer, name: str, pod_uid: str, labels: dict[str, str], owner: dict[str, Any] | None,
            node: str = "gpu-node-a") -> dict[str, Any]:
    pod = copy.deepcopy(srv.replay.find("pods", "research", "notebook-alice-6d5f8b7c9-tx2lq"))
    md = pod["metadata"]
    md.update(name=name, namespace=NS, uid=pod_uid, labels=labels)
    md.pop("managedFields", None)
    md["ownerReferences"] = [{"apiVersion": "apps/v1", "controller": True, "blockOwnerDeletion": True, **owner}] \
        if owner else []
    pod["spec"]["nodeName"] = node
    srv.replay.data["pods"].append(pod)
    return pod


def deployment(srv: ActionServer, name: str, n: int, base: int) -> list[str]:
    """Deployment NS/name -> ReplicaSet name-5f7d -> n pods; returns the pods' uids."""
    rs = copy.deepcopy(srv.replay.find("replicasets", "research", "notebook-alice-6d5f8b7c9"))
    sel = {"app": name, "pod-template-hash": "5f7d"}
    rs["metadata"].update(name=f"{name}-5f7d", namespace=NS, uid=uid(base), labels=dict(sel))
    rs["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                                          "uid": uid(base + 1), "controller": True, "blockOwnerDeletion": True}]
    rs["spec"]["selector"] = {"matchLabels": dict(sel)}
    rs["spec"]["replicas"] = n
    srv.replay.data["replicasets"].append(rs)
    srv.replay.data["deployments"].append(workload("Deployment", NS, name, uid(base + 1), n,
                                                   selector={"app": name}))
    pods = [uid(base + 10 + i) for i in range(n)]
    for i, p in enumerate(pods):
        add_pod(srv, f"{name}-5f7d-{i}", p, dict(sel), {"kind": "ReplicaSet", "name": f"{name}-5f7d", "uid": uid(base)})
    return pods


def job(srv: ActionServer, name: str, n: int, base: int) -> list[str]:
    j = copy.deepcopy(srv.replay.find("jobs", "ml-train", "llama-ft"))
    j["metadata"].update(name=name, namespace=NS, uid=uid(base))
    j["spec"]["selector"] = {"matchLabels": {"controller-uid": uid(base)}}
    j["spec"]["parallelism"] = n
    srv.replay.data["jobs"].append(j)
    pods = [uid(base + 10 + i) for i in range(n)]
    for i, p in enumerate(pods):
        add_pod(srv, f"{name}-{i}", p, {"controller-uid": uid(base), "job-name": name},
                {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid(base)})
    return pods


def store_pods(store: Any, now: datetime, pods: list[tuple[str, str, str, float]]) -> None:
    """(name, uid, owner_workload, SM activity) per pod, each on its own GPU of gpu-node-a, 3 h of history."""
    t0 = now - timedelta(hours=3)
    recs: list[Any] = []
    for i, (name, pod_uid, owner, sm) in enumerate(pods):
        recs.append(Allocation("k8s", "kubernetes", pod_uid, name=name, user="alice", account=NS, start=t0,
                               owner_workload=owner, gpus=[AllocatedGpu("gpu-node-a", i)]))
        recs += series("k8s", "gpu-node-a", i, t0, 3, sm, sm)
    store.ingest(recs)
    collected(store, ["k8s"], now)


def cfg() -> Config:
    return Config(policies=[Policy(name="idle-2h", warn_after_hours=None, act_after_hours=2)],
                  enforce=EnforceConfig(apply=True))


def acts(store: Any) -> list[tuple[str, str, str, str]]:
    return [(r["target"], r["action"], r["decision"], r["reason"]) for r in log_rows(store) if r["stage"] == "act"]


def test_one_idle_replica_of_three_leaves_the_deployment_alone(store: Any, srv: ActionServer, now: datetime) -> None:
    """Item 1: before the fix the idle replica's decision scaled Deployment ml/serve to zero (2 working
    replicas stopped: one PATCH .../deployments/serve/scale)."""
    pods = deployment(srv, "serve", 3, 100)
    store_pods(store, now, [(f"serve-5f7d-{i}", p, "Deployment/serve", sm) for i, (p, sm) in
                            enumerate(zip(pods, (0.0, 0.8, 0.8), strict=True))])
    enforce(store, cfg(), backends=backends(srv), now=now)
    assert srv.replay.writes == []
    got = acts(store)
    assert len(got) == 1 and got[0][:3] == ("Deployment ml/serve", "scale_to_zero", "skipped")
    assert got[0][3].startswith("2 other pods of Deployment ml/serve work: serve-5f7d-1: idle 0% < 95%; "
                                "serve-5f7d-2: idle 0% < 95%")


def test_all_replicas_idle_scales_once_and_logs_every_pod(store: Any, srv: ActionServer, now: datetime) -> None:
    pods = deployment(srv, "serve", 3, 100)
    store_pods(store, now, [(f"serve-5f7d-{i}", p, "Deployment/serve", 0.0) for i, p in enumerate(pods)])
    res = enforce(store, cfg(), backends=backends(srv), now=now)
    assert res["acted"] == 1
    assert srv.replay.writes == [("PATCH", "/apis/apps/v1/namespaces/ml/deployments/serve/scale",
                                  "application/merge-patch+json", {"spec": {"replicas": 0}})]
    got = acts(store)
    assert [g[:3] for g in got] == [("Deployment ml/serve", "scale_to_zero", "done")] * 3  # one row per pod stopped
    assert got[1][3].startswith("stopped with Deployment ml/serve: idle 100%")
    assert log_rows(store)[0]["evidence"]["unit"] == [f"kubernetes ml/serve-5f7d-{i}" for i in range(3)]


def test_a_replica_not_in_the_store_blocks_the_scale(store: Any, srv: ActionServer, now: datetime) -> None:
    """A replica started after the last collection was never judged: the owner is left alone."""
    pods = deployment(srv, "serve", 2, 100)
    store_pods(store, now, [("serve-5f7d-0", pods[0], "Deployment/serve", 0.0)])
    enforce(store, cfg(), backends=backends(srv), now=now)
    assert srv.replay.writes == []
    assert acts(store)[0][3].startswith("1 other pod of Deployment ml/serve is not judged idle: serve-5f7d-1 is "
                                        "not in the store (never judged)")


def test_one_idle_pod_of_a_four_pod_job_leaves_the_job_alone(store: Any, srv: ActionServer, now: datetime) -> None:
    """Item 1: before the fix the one idle pod's decision suspended Job ml/sweep (3 working pods stopped)."""
    pods = job(srv, "sweep", 4, 200)
    store_pods(store, now, [(f"sweep-{i}", p, "Job/sweep", sm) for i, (p, sm) in
                            enumerate(zip(pods, (0.0, 0.8, 0.8, 0.8), strict=True))])
    enforce(store, cfg(), backends=backends(srv), now=now)
    assert srv.replay.writes == []
    got = acts(store)
    assert len(got) == 1 and got[0][:3] == ("Job ml/sweep", "suspend_job", "skipped")
    assert got[0][3].startswith("3 other pods of Job ml/sweep work: sweep-1: idle 0% < 95%")


def test_forged_owner_references_are_refused(store: Any, srv: ActionServer, now: datetime) -> None:
    """Item 2: a pod whose controller reference names bob's Deployment directly (with its real uid), or his
    ReplicaSet without carrying its labels, or a ReplicaSet under a wrong uid. Before the fix the first
    scaled bob's working Deployment ml/serve to zero."""
    pods = deployment(srv, "serve", 1, 100)  # bob's, working
    add_pod(srv, "mallory-direct", uid(301), {"app": "x"}, {"kind": "Deployment", "name": "serve", "uid": uid(101)})
    add_pod(srv, "mallory-labels", uid(302), {"app": "x"}, {"kind": "ReplicaSet", "name": "serve-5f7d",
                                                            "uid": uid(100)})
    add_pod(srv, "mallory-uid", uid(303), {"app": "serve", "pod-template-hash": "5f7d"},
            {"kind": "ReplicaSet", "name": "serve-5f7d", "uid": uid(999)})
    store_pods(store, now, [("serve-5f7d-0", pods[0], "Deployment/serve", 0.8),
                            ("mallory-direct", uid(301), "Deployment/serve", 0.0),
                            ("mallory-labels", uid(302), "Deployment/serve", 0.0),
                            ("mallory-uid", uid(303), "Deployment/serve", 0.0)])
    enforce(store, cfg(), backends=backends(srv), now=now)
    assert srv.replay.writes == []
    reasons = sorted(r["reason"] for r in log_rows(store) if r["stage"] == "act")
    assert reasons == sorted([
        "owner chain Pod -> Deployment is not one gpu-audit follows",
        "not provably the judged kubernetes allocation: ReplicaSet ml/serve-5f7d: its selector does not select "
        "the Pod",
        "not provably the judged kubernetes allocation: ReplicaSet ml/serve-5f7d: live uid "
        f"{uid(100)} is not the uid {uid(999)} the Pod's ownerReference names"])
    assert srv.replay.find("deployments", NS, "serve")["spec"]["replicas"] == 1


def test_a_done_write_is_done_whatever_its_body(store: Any, srv: ActionServer, now: datetime,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 11: the API server answers the scale PATCH 200 with a body the client's V1Scale model cannot
    use ({}): before the fix the done action was logged `failed` (AttributeError: 'NoneType' object has
    no attribute 'replicas')."""
    pods = deployment(srv, "serve", 1, 100)
    store_pods(store, now, [("serve-5f7d-0", pods[0], "Deployment/serve", 0.0)])
    orig = srv.replay.act

    def empty_ok(method: str, path: str, auth: str | None, ctype: str, body: bytes) -> tuple[int, Any]:
        status, out = orig(method, path, auth, ctype, body)
        return (200, {}) if method == "PATCH" and status == 200 else (status, out)

    monkeypatch.setattr(srv.replay, "act", empty_ok)
    enforce(store, cfg(), backends=backends(srv), now=now)
    row = next(r for r in log_rows(store) if r["stage"] == "act")
    assert (row["decision"], row["result"]) == ("done", "scaled Deployment ml/serve to 0 replicas (had ?): HTTP 200")
    assert srv.replay.find("deployments", NS, "serve")["spec"]["replicas"] == 0
