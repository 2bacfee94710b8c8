"""Training goodput on Kubernetes (auditor/audit/goodput.py, docs/definitions.md "Goodput"): a Job's failed pods
under its backoffLimit counted as lost GPU-hours and as restarts, each failed pod's cause from what the API says
about it, through the real ``kubernetes`` client against tests/k8s_server.py, stored on SQLite and PostgreSQL.

BUILT FROM RECORDED OBJECTS: the recorded Job ``ml-train/llama-ft`` (tests/fixtures/kubernetes/jobs-all.json)
and its recorded pod ``llama-ft-x7k2p`` (pods-all.json: 4 GPUs on gpu-node-a, Running since 11:31:58 on
2026-11-29, label team=nlp). The recording had no Job controller, so the Job's status was empty and it had
one pod; this test gives the Job the status a controller writes after two of its pods failed and one more
failed and was deleted before any collection saw it, and adds the two failed pods as copies of the recorded
pod with the fields a kubelet and the taint manager write (the Kubernetes API's own field names and reasons):

- ``llama-ft-a1`` ran 06:31:58-08:31:58 (2 h) and was deleted by the taint manager when gpu-node-a went
  NotReady: condition DisruptionTarget, reason DeletionByTaintManager -> infrastructure;
- ``llama-ft-b2`` ran 09:31:58-10:31:58 (1 h), its container exited 1 (reason Error) -> the user's;
- ``llama-ft-x7k2p`` (recorded) runs from 11:31:58; the audit window ends at the recording, 14:31:58 (3 h).
- The Job: backoffLimit 3, status.failed 3 (the third failed pod never collected), active 1.

By hand, 4 GPUs each, price 2.0 per GPU-hour: reserved 4 x (2 + 1 + 3) = 24 GPU-h; lost 4 x 2 = 8
(infrastructure) + 4 x 1 = 4 (user) = 12 GPU-h, USD 24; useful time 12 / 24 = 50 %. Restarts: the Job
retried 3 failed pods (status.failed 3, it has not given up; 2 of them seen, each followed by a later pod),
no container restarted: 3 >= GOODPUT_MIN_RESTARTS 2, so one failed_restarts finding on the latest pod with
the 12 lost GPU-hours, 1 failed pod the store never held (its GPU time not measured). Beside them the
recorded ``inference/crashed-eval`` (no Job; its container OOMKilled after 30 min on 2 GPUs: 1 GPU-h, the
user's, team unmapped) is a lost run of its own.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from k8s_server import TOKEN, K8sServer
from sqlalchemy import text

from auditor.audit.run import run_audit
from auditor.collect import collect as collect_all
from auditor.config import Config
from auditor.report.context import build_context
from auditor.store.engine import Store

TOKEN_ENV = "GPU_AUDIT_TEST_K8S_TOKEN"
W0 = datetime(2026, 11, 29, 0, 0, tzinfo=UTC)
W1 = datetime(2026, 11, 29, 14, 31, 58, tzinfo=UTC)  # the recording


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[K8sServer]:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with K8sServer() as srv:
        yield srv


def failed_copy(recorded: dict[str, Any], name: str, uid: str, start: str, end: str, *,
                disruption: str = "", exit_code: int = 137, reason: str = "Error") -> dict[str, Any]:
    """The recorded Job pod as it would read after failing: phase Failed, its container terminated."""
    p = copy.deepcopy(recorded)
    p["metadata"].update(name=name, uid=uid)
    p["status"]["phase"] = "Failed"
    p["status"]["startTime"] = start
    p["status"]["containerStatuses"][0].update(ready=False, started=False, state={"terminated": {
        "exitCode": exit_code, "reason": reason, "startedAt": start, "finishedAt": end}})
    if disruption:
        p["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True", "reason": disruption,
                                          "lastTransitionTime": end})
    return p


def backoff(srv: K8sServer) -> None:
    pods = srv.replay.data["pods"]
    recorded = next(p for p in pods if p["metadata"]["name"] == "llama-ft-x7k2p")
    pods += [failed_copy(recorded, "llama-ft-a1", "0a1a1a1a-0000-4000-8000-000000000001", "2026-11-29T06:31:58Z",
                         "2026-11-29T08:31:58Z", disruption="DeletionByTaintManager"),
             failed_copy(recorded, "llama-ft-b2", "0b2b2b2b-0000-4000-8000-000000000002", "2026-11-29T09:31:58Z",
                         "2026-11-29T10:31:58Z", exit_code=1)]
    job = next(j for j in srv.replay.data["jobs"] if j["metadata"]["name"] == "llama-ft")
    job["spec"]["backoffLimit"] = 3
    job["status"] = {"startTime": "2026-11-29T06:31:58Z", "failed": 3, "active": 1, "ready": 1}


def cfg(store_url: str, srv: K8sServer, **th: Any) -> Config:
    return Config.model_validate({"store": {"url": store_url}, "prices": {"default": 2.0}, "thresholds": th,
                                  "clusters": [{"name": "k8s-test", "allocations": [
                                      {"kind": "kubernetes", "host": srv.url, "token": {"env": TOKEN_ENV}}]}]})


def evidence(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else json.loads(v)


def test_job_backoff_is_lost_gpu_hours_and_restarts(store: Store, store_url: str, server: K8sServer,
                                                    tmp_path: Path) -> None:
    backoff(server)
    c = cfg(store_url, server)
    assert all(r.ok for r in collect_all(store, c, base_dir=tmp_path, now=datetime.now(UTC)).results)
    with store.engine.connect() as conn:
        jobs = {r.name: r for r in conn.execute(text("SELECT * FROM kube_jobs"))}
        pods = {r.name: r for r in conn.execute(text(
            "SELECT name, labels, failure_reason, job_uid FROM allocations WHERE name LIKE 'llama-ft%'"))}
    # both recorded GPU Jobs are stored; llama-ft with the status given above
    assert sorted(jobs) == ["llama-ft", "resnet-sweep-7"]
    lf = jobs["llama-ft"]
    assert (lf.uid, lf.namespace, lf.backoff_limit, lf.failed, lf.active, lf.state) == \
        ("c6317465-fd6a-47f2-a55d-899ca2d14f96", "ml-train", 3, 3, 1, "Running")
    assert pods["llama-ft-a1"].failure_reason == "DeletionByTaintManager"
    assert pods["llama-ft-b2"].failure_reason == "Error"
    assert pods["llama-ft-x7k2p"].failure_reason is None
    # every pod of the Job carries its uid on the record, none keeps a label of ours
    assert {p.job_uid for p in pods.values()} == {lf.uid}
    assert not any("gpu-audit.io/failure-reason" in evidence(p.labels) for p in pods.values())

    rid = run_audit(store, c, W0, W1).run_id
    g = build_context(store, c, rid)["goodput"]
    runs = {r["name"]: r for r in g["runs"]}
    assert {n: (r["cause"], r["reason"], r["lost_gpu_hours"]) for n, r in runs.items()} == {
        "llama-ft-a1": ("infrastructure", "DeletionByTaintManager", pytest.approx(8.0)),
        "llama-ft-b2": ("user", "Error", pytest.approx(4.0)), "crashed-eval": ("user", "OOMKilled", 1.0)}
    nlp = next(t for t in g["teams"] if t["team"] == "nlp")
    assert nlp["reserved_gpu_hours"] == pytest.approx(24.0) and nlp["lost_gpu_hours"] == pytest.approx(12.0)
    assert (nlp["infrastructure_gpu_hours"], nlp["user_gpu_hours"]) == (pytest.approx(8.0), pytest.approx(4.0))
    assert nlp["useful_share"] == pytest.approx(0.5)
    with store.engine.connect() as conn:
        found = conn.execute(text("SELECT f.gpu_hours, f.cost, f.evidence, a.name FROM findings f JOIN allocations a "
                                  "ON a.id = f.allocation_id WHERE f.run_id = :r AND f.kind = 'failed_restarts'"),
                             {"r": rid}).all()
    assert len(found) == 1
    f = found[0]
    ev = evidence(f.evidence)
    assert (f.name, f.gpu_hours, f.cost) == ("llama-ft-x7k2p", pytest.approx(12.0), pytest.approx(24.0))
    assert (ev["restarts"], ev["pod_retries"], ev["container_restarts"], ev["unseen_failed_pods"]) == (3, 3, 0, 1)
    assert ev["job"] == {"id": "ml-train/llama-ft", "name": "llama-ft", "source": "kubernetes",
                         "uid": "c6317465-fd6a-47f2-a55d-899ca2d14f96"}
    assert ev["kubernetes_job"] == {"state": "Running", "reason": "", "backoff_limit": 3, "failed": 3,
                                    "succeeded": 0}
    assert ev["lost_by_cause"] == {"infrastructure": 8.0, "user": 4.0, "preempted": 0.0}


def test_a_job_that_gave_up_and_the_other_causes(store: Store, store_url: str, server: K8sServer,
                                                 tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same Job after its last pod failed too, preempted by the scheduler (DisruptionTarget
    PreemptionByScheduler: preempted), and the Job gave up (condition Failed, BackoffLimitExceeded): the last
    failure is no retry, so 3 restarts (status.failed 4, less the one not retried), and the preempted pod's
    3 h x 4 = 12 GPU-h are lost as preempted. With GOODPUT_MIN_RESTARTS 4 there is no finding."""
    backoff(server)
    pods = server.replay.data["pods"]
    last = next(p for p in pods if p["metadata"]["name"] == "llama-ft-x7k2p")
    pods[pods.index(last)] = failed_copy(last, "llama-ft-x7k2p", last["metadata"]["uid"], "2026-11-29T11:31:58Z",
                                         "2026-11-29T14:31:58Z", disruption="PreemptionByScheduler")
    job = next(j for j in server.replay.data["jobs"] if j["metadata"]["name"] == "llama-ft")
    job["status"] = {"startTime": "2026-11-29T06:31:58Z", "failed": 4, "conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
         "lastTransitionTime": "2026-11-29T14:31:58Z"}]}
    c = cfg(store_url, server)
    assert all(r.ok for r in collect_all(store, c, base_dir=tmp_path, now=datetime.now(UTC)).results)
    rid = run_audit(store, c, W0, W1).run_id
    g = build_context(store, c, rid)["goodput"]
    assert g["totals"]["preempted_gpu_hours"] == pytest.approx(12.0)
    assert g["totals"]["lost_gpu_hours"] == pytest.approx(24.0 + 1.0)  # every pod failed: 8 + 4 + 12; crashed-eval
    with store.engine.connect() as conn:
        ev = evidence(conn.execute(text("SELECT evidence FROM findings WHERE run_id = :r AND kind = "
                                        "'failed_restarts'"), {"r": rid}).scalar_one())
    assert (ev["restarts"], ev["unseen_failed_pods"]) == (3, 1)
    assert ev["kubernetes_job"]["state"] == "Failed" and ev["kubernetes_job"]["reason"] == "BackoffLimitExceeded"
    from auditor.audit import goodput

    monkeypatch.setattr(goodput, "GOODPUT_MIN_RESTARTS", 4)
    rid4 = run_audit(store, c, W0, W1).run_id
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM findings WHERE run_id = :r AND kind = 'failed_restarts'"),
                            {"r": rid4}).scalar() == 0


def test_migration_puts_the_stored_pods_failure_and_job_on_the_record(store_url: str) -> None:
    """0039_pod_failure: a pod stored before it (the failure reason under our label, the Job's uid under the Job
    controller's) reads the same after it: its failure reason and Job uid in their columns, our label gone, the
    user's labels kept; a Slurm job's labels untouched."""
    s = Store.open(store_url)
    s.upgrade("0038_prompt_cache")
    old = {"controller-uid": "u-1", "team": "nlp", "gpu-audit.io/failure-reason": "Evicted"}
    with s.begin() as conn:
        for ext, src, labels in (("p1", "kubernetes", old), ("p2", "kubernetes", {"batch.kubernetes.io/controller-uid":
                                 "u-2", "controller-uid": "u-2"}), ("7", "slurm", {"controller-uid": "x"})):
            conn.execute(text("INSERT INTO allocations (cluster, source, external_id, instance_ts, name, user_name, "
                              "account, partition, qos, state, reservation, owner_workload, labels, gpu_count) VALUES "
                              "('c', :src, :ext, 0, '', '', '', '', '', 'Failed', '', '', :labels, 1)"),
                         {"src": src, "ext": ext, "labels": json.dumps(labels)})
    s.upgrade()
    with s.engine.connect() as conn:
        rows = {r.external_id: r for r in conn.execute(text(
            "SELECT external_id, labels, failure_reason, job_uid FROM allocations"))}
    assert (rows["p1"].failure_reason, rows["p1"].job_uid, evidence(rows["p1"].labels)) == \
        ("Evicted", "u-1", {"controller-uid": "u-1", "team": "nlp"})
    assert (rows["p2"].failure_reason, rows["p2"].job_uid) == (None, "u-2")
    assert (rows["7"].failure_reason, rows["7"].job_uid, evidence(rows["7"].labels)) == \
        (None, None, {"controller-uid": "x"})
    s.engine.dispose()
