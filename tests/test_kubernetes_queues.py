"""Who held the quota on Kubernetes, and fractional GPUs (issue 42 §4): Kueue, KAI-Scheduler and Volcano queues,
Kueue's waits for admission, HAMi vGPUs and KAI fractions, with the real ``kubernetes`` client against the replay
server (tests/k8s_server.py) serving the recorded v1.24 cluster plus the objects of
tests/fixtures/kubernetes/queues/README.md; then through the store and the audit on both engines."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from k8s_server import FIXTURES, OPEN_WINDOW, TOKEN, TOKEN_ENV, K8sReplay, K8sServer, allocations, collect, load
from sqlalchemy import text

from auditor.audit.run import run_audit
from auditor.collect import collect as collect_all
from auditor.config import Config
from auditor.records import GpuBucket, GpuQuota, GpuWait
from auditor.store.engine import Store
from connectors import build
from connectors.base import Context, Problems

QUEUES = load("queues/cluster.json")
GROUPS = {"kueue.x-k8s.io": ["v1beta1"], "scheduling.run.ai": ["v2", "v2alpha2"], "scheduling.volcano.sh": ["v1beta1"]}
H100_MIB = 81559  # gpu-node-a/b: GFD nvidia.com/gpu.memory


def replay(groups: dict[str, list[str]] | None = None) -> K8sReplay:
    rec = K8sReplay()
    rec.data["pods"] = rec.data["pods"] + copy.deepcopy(QUEUES["pods"])
    for key in ("clusterqueues", "localqueues", "workloads", "kai-queues", "kai-podgroups", "volcano-queues",
                "podgroups"):
        rec.data[key] = copy.deepcopy(QUEUES[key])
    rec.groups.update(GROUPS if groups is None else groups)
    return rec


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[K8sServer]:
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with K8sServer(replay()) as srv:
        yield srv


def test_queue_quotas_of_kueue_kai_and_volcano(server: K8sServer) -> None:
    """ClusterQueue nominal quota (GPU resources over the flavors), KAI deserved GPUs (a parent queue and an
    unlimited one, quota -1, are no quota), Volcano deserved over guarantee (its parent root left out)."""
    quotas = sorted((q.kind, q.name, q.gpus, q.reserved) for q in collect(server) if isinstance(q, GpuQuota))
    # team-a-cq's status.flavorsUsage: 4 nvidia.com/gpu in flavor h100 (its cpu and memory are no GPUs);
    # KAI and Volcano queues say nothing reserved (None)
    assert quotas == [("queue", "team-a-cq", 8.0, 4.0), ("queue", "team-nlp", 4.0, None),
                      ("queue", "vc-research", 4.0, None)]


def test_each_pod_runs_in_its_queue(server: K8sServer) -> None:
    """The queue becomes the allocation's partition: Kueue through the pod's LocalQueue label or the admitted
    Workload of its Job (the recorded llama-ft pod carries no label), KAI through its queue label, Volcano
    through its PodGroup; a pod of no queue keeps "" (before: every pod's partition was "")."""
    got = allocations(collect(server))
    assert {n: got[n].partition for n in ("llama-ft-x7k2p", "kueue-direct", "kai-notebook-half", "kai-mem-pair",
                                          "volcano-train-0", "notebook-alice-6d5f8b7c9-tx2lq")} == {
        "llama-ft-x7k2p": "team-a-cq", "kueue-direct": "team-a-cq", "kai-notebook-half": "team-nlp",
        "kai-mem-pair": "team-nlp",
        "volcano-train-0": "vc-research", "notebook-alice-6d5f8b7c9-tx2lq": ""}


def test_kueue_waits_for_admission(server: K8sServer) -> None:
    """A Workload waits from its creation until Admitted (its Job's pods do not exist before): the admitted one
    waited 20 min for 4 GPUs, the pending one waits on for 2 x 4 GPUs; a CPU-only Workload is no GPU wait."""
    waits = {w.name: w for w in collect(server) if isinstance(w, GpuWait)}
    done, pending = waits["job-llama-ft-3b0f2"], waits["job-llama-ft-2-9c1d7"]
    assert (done.gpus, done.end - done.eligible, done.partition, done.state) == (
        4.0, timedelta(minutes=20), "team-a-cq", "Admitted")
    assert (pending.gpus, pending.end, pending.partition, pending.state) == (8.0, None, "team-a-cq", "Pending")
    assert "job-etl-7f2a1" not in waits


def test_fractional_gpus_are_charged_their_share(server: K8sServer) -> None:
    """KAI gpu-fraction 0.5 is half a GPU; gpu-memory 20390 MiB on 2 devices of 81559 MiB is a quarter of each;
    HAMi gpucores 30 % with gpumem-percentage 25 % holds 30 % (the larger); gpumem 40779 MiB half of each of
    its 2 vGPUs. None of them quarantined (before: HAMi's nvidia.com/gpumem* and gpucores were reported as
    unknown resources and KAI fractions, which request no nvidia.com/gpu, were not seen at all)."""
    problems = Problems()
    got = allocations(collect(server, problems))
    shares = {n: [g.share for g in got[n].gpus] for n in ("kai-notebook-half", "kai-mem-pair", "hami-infer",
                                                          "hami-mem")}
    assert shares == {"kai-notebook-half": [0.5], "kai-mem-pair": [pytest.approx(20390 / H100_MIB)] * 2,
                      "hami-infer": [pytest.approx(0.3)], "hami-mem": [pytest.approx(40779 / H100_MIB)] * 2}
    assert [loc for _, loc, _, _ in problems.items] == []


def test_an_odd_fraction_is_quarantined(server: K8sServer) -> None:
    pod = next(p for p in server.replay.data["pods"] if p["metadata"]["name"] == "kai-notebook-half")
    pod["metadata"]["annotations"]["gpu-fraction"] = "1.5"
    problems = Problems()
    assert "kai-notebook-half" not in allocations(collect(server, problems))
    assert [(loc, "gpu-fraction" in reason) for _, loc, reason, _ in problems.items] == [
        ("pod research/kai-notebook-half", True)]


def test_clusters_without_the_queue_crds(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Kueue, KAI or Volcano installed (their groups answer 404): no quota, no queue, no error."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    with K8sServer(replay({})) as srv:
        records = collect(srv)
    assert not [r for r in records if isinstance(r, GpuQuota)]
    assert {a.partition for a in allocations(records).values()} == {""}


def test_forbidden_queues_are_said_not_fatal(server: K8sServer) -> None:
    server.replay.faults.forbidden = {"clusterqueues"}
    conn = build("kubernetes", "allocations", {"host": server.url, "token": {"env": TOKEN_ENV}},
                 Context("k8s-test"))
    records = list(conn.collect(OPEN_WINDOW, Problems()))
    assert sorted(q.name for q in records if isinstance(q, GpuQuota)) == ["team-nlp", "vc-research"]
    (note,) = conn.notes
    assert note.startswith("kueue queues not read") and "'clusterqueues'" in note


def test_queue_quota_and_admission_waits_in_the_audit(store: Store, store_url: str, server: K8sServer,
                                                      tmp_path: Path) -> None:
    """Both engines, one hour 12:00-13:00 of 2026-11-29. llama-ft's 4 GPUs idle (telemetry labelled with its
    pod), kueue-direct's 1 GPU without telemetry (unknown: in use). team-a-cq (quota 8): held 5, idle 4, in
    use 1, unused 7: an idle_quota finding of 7 GPU-h. The pending Workload waited all hour in team-a-cq: the 4
    idle GPU-h of llama-ft were idle while GPU jobs waited. Before: no queue quota was read, and the
    admission wait (a Workload, not a pod) was never seen."""
    cfg = Config.model_validate({"store": {"url": store_url}, "clusters": [{"name": "k8s-test", "allocations": [
        {"kind": "kubernetes", "host": server.url, "token": {"env": TOKEN_ENV}}]}]})
    assert all(r.ok for r in collect_all(store, cfg, base_dir=tmp_path, now=datetime.now(UTC)).results)
    t0 = datetime(2026, 11, 29, 12, tzinfo=UTC)
    store.ingest([GpuBucket("k8s-test", "gpu-node-a", gpu, t0 + timedelta(minutes=5 * i), 300, 10, sm_active=0.0,
                            gpu_util=0.0, pod="llama-ft-x7k2p", namespace="ml-train")
                  for gpu in range(4) for i in range(12)], seen_at_ts=int(t0.timestamp()) + 3600)
    result = run_audit(store, cfg, t0, t0 + timedelta(hours=1))
    summary = result.summary["opportunity"]
    team_a = next(q for q in summary["quotas"] if q["name"] == "team-a-cq")
    assert team_a["kind"] == "queue" and team_a["quota_gpus"] == 8.0
    assert (team_a["held_gpus"], team_a["idle_gpus"], team_a["in_use_gpus"], team_a["unused_gpus"]) == (
        pytest.approx(5.0), pytest.approx(4.0), pytest.approx(1.0), pytest.approx(7.0))
    assert team_a["reclaim"] and team_a["allocations"] == 2
    # Kueue reserved 4 (flavorsUsage at the collection), 1 in use: 4 - 1 = 3 reserved but unused, in the rule
    assert (team_a["reserved_gpus"], team_a["reserved_unused_gpus"]) == (4.0, pytest.approx(3.0))
    with store.engine.connect() as conn:
        rules = [json.loads(e) if isinstance(e, str) else e for (e,) in conn.execute(text(
            "SELECT evidence FROM findings WHERE run_id = :r AND kind = 'idle_quota'"), {"r": result.run_id})]
    (rule,) = [e["rule"] for e in rules if e["quota"]["name"] == "team-a-cq"]
    assert "4 reserved for admitted workloads when last seen, 3.0 of them reserved but unused" in rule
    # team-nlp (KAI, quota 4): kai-notebook-half (label) 0.5 + kai-mem-pair (its PodGroup's queue) 2 x 20390/81559
    team_nlp = next(q for q in summary["quotas"] if q["name"] == "team-nlp")
    assert (team_nlp["allocations"], team_nlp["held_gpus"]) == (2, pytest.approx(0.5 + 2 * 20390 / H100_MIB))
    by_cluster = summary["idle_while_queued"]["by_cluster"]
    assert [(r["cluster"], r["idle_gpu_hours"]) for r in by_cluster] == [("k8s-test", pytest.approx(4.0))]


def test_fixture_readme_names_every_object() -> None:
    readme = (FIXTURES / "queues" / "README.md").read_text()
    for key, objs in QUEUES.items():
        for obj in objs:
            assert obj["metadata"]["name"] in readme, (key, obj["metadata"]["name"])
