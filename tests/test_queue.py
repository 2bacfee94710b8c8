"""Opportunity cost on hand-computed cases, both engines: idle GPU-hours while GPU jobs waited in the same
partition (idle_while_queued) and GPU quotas held but not used (idle_quota). Unknown is never idle."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from auditor.audit import queue
from auditor.audit.run import run_audit
from auditor.config import Config, Team, Thresholds
from auditor.records import AllocatedGpu, Allocation, GpuBucket, GpuQuota, GpuWait
from auditor.store.engine import Store

T0 = datetime(2026, 11, 20, tzinfo=UTC)
W0, W1 = T0, T0 + timedelta(hours=4)  # the audit window: 4 h
CFG = Config(teams=[Team(name="A", accounts=["acct-a"])])


def h(x: float) -> datetime:
    return T0 + timedelta(hours=x)


def buckets(host: str, gpu: int, start_h: float, end_h: float, sm: float) -> list[GpuBucket]:
    n = int((end_h - start_h) * 12)
    return [GpuBucket("c", host, gpu, h(start_h) + timedelta(minutes=5 * i), 300, 10, sm_active=sm,
                      gpu_util=0.0 if sm < 0.05 else 0.9) for i in range(n)]


def job(ext: str, gpus: list[AllocatedGpu], partition: str, account: str, qos: str = "normal") -> Allocation:
    return Allocation("c", "slurm", ext, user="u", account=account, partition=partition, qos=qos,
                      start=h(0), end=h(4), gpus=gpus, submit=h(0))


def fleet() -> list:
    """h: 2 GPUs in partition gpu, GPU 0 idle 0-4 h, GPU 1 working 0-2 h then idle 2-4 h.
    x: 1 GPU idle 0-4 h in partition debug (nobody waits there). y: 1 GPU working in debug, QOS busy.
    z: 1 GPU in partition gpu without telemetry (unknown: never idle), account acct-a."""
    return [
        job("h", [AllocatedGpu("n1", 0), AllocatedGpu("n1", 1)], "gpu", "acct-a"),
        job("x", [AllocatedGpu("n2", 0)], "debug", "acct-b"),
        job("y", [AllocatedGpu("n2", 1)], "debug", "acct-b", qos="busy"),
        job("z", [AllocatedGpu("n3", 0)], "gpu", "acct-a"),
        *buckets("n1", 0, 0, 4, 0.01), *buckets("n1", 1, 0, 2, 0.8), *buckets("n1", 1, 2, 4, 0.01),
        *buckets("n2", 0, 0, 4, 0.01), *buckets("n2", 1, 0, 4, 0.8),
    ]


def waits() -> list:
    """w1: 4 GPUs waited 1-3 h (then started); w2: 1 GPU pending since 2.5 h, last seen at 3.5 h (the ingest's
    seen time); w3: 8 GPUs waited 0-4 h in partition cpu (no allocation there)."""
    return [
        GpuWait("c", "slurm", "w1", 4, eligible=h(1), end=h(3), submit=h(1), partition="gpu", state="RUNNING"),
        GpuWait("c", "slurm", "w2", 1, eligible=h(2.5), submit=h(2.5), partition="gpu", state="PENDING"),
        GpuWait("c", "slurm", "w3", 8, eligible=h(0), end=h(4), submit=h(0), partition="cpu", state="RUNNING"),
        GpuQuota("c", "account", "acct-a", 8), GpuQuota("c", "qos", "busy", 1),
    ]


def findings(store: Store, run_id: int, kind: str) -> list[dict]:
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT f.*, a.external_id FROM findings f LEFT JOIN allocations a ON "
                                 "a.id = f.allocation_id WHERE f.run_id = :r AND f.kind = :k"),
                            {"r": run_id, "k": kind})
        out = [dict(r._mapping) for r in rows]
    for f in out:
        if isinstance(f["evidence"], str):
            f["evidence"] = json.loads(f["evidence"])
    return out


def audited(store: Store, th: Thresholds | None = None) -> tuple[int, dict]:
    store.ingest(fleet(), seen_at_ts=int(h(4).timestamp()))
    store.ingest(waits(), seen_at_ts=int(h(3.5).timestamp()))
    cfg = CFG if th is None else CFG.model_copy(update={"thresholds": th})
    r = run_audit(store, cfg, W0, W1)
    return r.run_id, r.summary["opportunity"]


def test_idle_while_queued_hand_computed(store: Store) -> None:
    """Waits in partition gpu: w1 [1 h, 3 h) and w2 [2.5 h, 3.5 h) (open: ends at its last sighting), union
    [1 h, 3.5 h). Idle GPU time of h inside it: GPU 0 idle all along -> 2.5 h; GPU 1 idle from 2 h -> 1.5 h;
    4.0 GPU-h. x is idle but nobody waited in debug; z has no telemetry (unknown, never idle); w3 waited in
    cpu. N = 2 jobs (w1, w2), M = 4 GPUs x 2 h + 1 GPU x 1 h = 9 GPU-h."""
    run_id, opp = audited(store)
    [f] = findings(store, run_id, "idle_while_queued")
    assert f["external_id"] == "h" and f["team"] == "A"
    assert f["idle_gpu_hours"] == pytest.approx(4.0) and f["gpu_hours"] == pytest.approx(4.0)
    assert f["evidence"]["waiting_jobs"] == 2 and f["evidence"]["waiting_gpu_hours"] == pytest.approx(9.0)
    q = opp["idle_while_queued"]
    assert q["by_cluster"] == [pytest.approx({"cluster": "c", "idle_gpu_hours": 4.0, "waiting_jobs": 2,
                                              "waiting_gpu_hours": 9.0, "idle_cost": 4.0 * 2.0})]
    assert [(t["team"], t["idle_gpu_hours"]) for t in q["by_team"]] == [("A", pytest.approx(4.0))]
    # every wait in the window: w1 8 + w2 1 + w3 8 x 4 = 32 -> 41 GPU-h by 3 jobs
    assert q["waiting_jobs"] == 3 and q["waiting_gpu_hours"] == pytest.approx(41.0)


def test_idle_while_queued_threshold(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """4.0 idle GPU-h while queued is below a 4.5 h minimum (QUEUE_MIN_IDLE_GPU_HOURS, a setting until issue 45):
    no finding; the summary still counts it."""
    monkeypatch.setattr(queue, "QUEUE_MIN_IDLE_GPU_HOURS", 4.5)
    run_id, opp = audited(store)
    assert findings(store, run_id, "idle_while_queued") == []
    assert opp["idle_while_queued"]["by_cluster"][0]["idle_gpu_hours"] == pytest.approx(4.0)


def test_idle_quota_hand_computed(store: Store) -> None:
    """Window 4 h. acct-a (quota 8): h held 2 GPUs x 4 h + z 1 GPU x 4 h = 12 GPU-h -> 3.0 GPUs on average;
    idle 4 + 2 = 6 GPU-h -> 1.5; z's 4 unknown GPU-h (1.0) count as in use: in use 3.0 - 1.5 = 1.5; unused
    8 - 1.5 = 6.5 >= 1 and >= 50 % of 8: reclaim, 6.5 x 4 h = 26 GPU-h.
    QOS busy (quota 1): y worked 1 GPU all along: in use 1.0, unused 0: not a candidate."""
    run_id, opp = audited(store)
    rows = {(q["kind"], q["name"]): q for q in opp["quotas"]}
    a = rows[("account", "acct-a")]
    assert (a["quota_gpus"], a["team"]) == (8.0, "A")
    assert a["held_gpus"] == pytest.approx(3.0) and a["idle_gpus"] == pytest.approx(1.5)
    assert a["unknown_gpus"] == pytest.approx(1.0) and a["allocations"] == 2
    assert a["in_use_gpus"] == pytest.approx(1.5) and a["unused_gpus"] == pytest.approx(6.5) and a["reclaim"]
    b = rows[("qos", "busy")]
    assert b["in_use_gpus"] == pytest.approx(1.0) and b["unused_gpus"] == pytest.approx(0.0) and not b["reclaim"]
    [f] = findings(store, run_id, "idle_quota")
    assert f["account"] == "acct-a" and f["gpu_hours"] == pytest.approx(26.0) and f["idle_gpu_hours"] == 0.0


def test_idle_quota_thresholds(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unused 6.5 of 8 is 81 %: an 82 % minimum share (IDLE_QUOTA_FRACTION) leaves no candidate."""
    monkeypatch.setattr(queue, "IDLE_QUOTA_FRACTION", 0.82)
    run_id, _ = audited(store)
    assert findings(store, run_id, "idle_quota") == []


def test_waits_are_idempotent_and_an_end_stays(store: Store) -> None:
    """The same waits twice leave one row each; a later 'pending' sighting of w1 does not reopen it."""
    store.ingest(waits(), seen_at_ts=int(h(3.5).timestamp()))
    stale = GpuWait("c", "slurm", "w1", 4, eligible=h(1), submit=h(1), partition="gpu", state="PENDING")
    store.ingest([*waits(), stale], seen_at_ts=int(h(3.6).timestamp()))
    with store.engine.connect() as conn:
        rows = {r.external_id: r for r in conn.execute(text("SELECT * FROM gpu_waits"))}
    assert sorted(rows) == ["w1", "w2", "w3"]
    assert rows["w1"].end_ts == int(h(3).timestamp()) and rows["w1"].state == "RUNNING"
    assert rows["w2"].end_ts is None and rows["w2"].last_seen_ts == int(h(3.6).timestamp())


def test_opportunity_section_renders_escaped(store: Store) -> None:
    """The reports carry the per-cluster and per-team lines and the quota table; a hostile quota name (from
    sacctmgr) is escaped in HTML and cannot break the Markdown table."""
    from auditor.report import context, render

    store.ingest(fleet(), seen_at_ts=int(h(4).timestamp()))
    store.ingest([*waits(), GpuQuota("c", "qos", "<b>evil|q</b>", 2)], seen_at_ts=int(h(3.5).timestamp()))
    run_id = run_audit(store, CFG, W0, W1).run_id
    ctx = context.build_context(store, CFG, run_id)
    html, md, txt = render.render_html(ctx)[0], render.render_md(ctx), render.render_text(ctx)
    assert "<b>evil" not in html and "&lt;b&gt;evil" in html
    assert "evil|q" not in md and "evil\\|q" in md
    assert "c: 4.0 idle GPU-h while 2 jobs waited for 9.0 GPU-h" in txt
    assert "team A on c: 4.0 idle GPU-h while 2 jobs waited for 9.0 GPU-h" in txt
    assert "| c | A | 4.0 | 2 | 9.0 |" in md


def test_partial_buckets_count_only_the_waited_seconds(store: Store) -> None:
    """p holds 1 GPU from 0:02 to 1:00, idle throughout (5-minute buckets from 0:00). wa waits [0:00, 0:10),
    wb [0:11:40, 0:40) in partition gpu2. Bucket 0:00-0:05 is clipped to p's [0:02, 0:05): 180 s, all waited;
    0:05-0:10: 300 s; 0:10-0:15: wb covers 0:11:40-0:15 = 200 s of it; 0:15-0:40: 1500 s. Idle while waited
    = 180 + 300 + 200 + 1500 = 2180 s = 0.605556 GPU-h (counting whole buckets would give 2280 s). N = 2,
    M = 1 GPU x 600 s + 1 GPU x 1700 s = 2300 s = 0.638889 GPU-h."""
    start = h(0) + timedelta(seconds=120)
    store.ingest([Allocation("c", "slurm", "p", account="acct-b", partition="gpu2", start=start, end=h(1),
                             gpus=[AllocatedGpu("n9", 0)], submit=start), *buckets("n9", 0, 0, 1, 0.01),
                  GpuWait("c", "slurm", "wa", 1, eligible=h(0), end=h(0) + timedelta(minutes=10), partition="gpu2"),
                  GpuWait("c", "slurm", "wb", 1, eligible=h(0) + timedelta(seconds=700),
                          end=h(0) + timedelta(minutes=40), partition="gpu2")],
                 seen_at_ts=int(h(1).timestamp()))
    opp = run_audit(store, CFG, W0, W1).summary["opportunity"]["idle_while_queued"]
    assert opp["by_cluster"] == [pytest.approx({"cluster": "c", "idle_gpu_hours": 2180 / 3600, "waiting_jobs": 2,
                                                "waiting_gpu_hours": 2300 / 3600, "idle_cost": 2180 / 3600 * 2.0})]


def test_overlapping_waits_count_their_union(store: Store) -> None:
    """q holds 1 GPU idle 0:00-1:00 in partition gpu3. Waits A [0, 100 s), B [50 s, 150 s), C [200 s, 250 s),
    all in the first 5-minute bucket. Union: [0, 150 s) + [200 s, 250 s) = 200 s idle while waited (two
    disjoint pieces in one bucket; the longest single wait would say 100 s, adding the waits up 250 s).
    N = 3, M = 1 GPU x (100 + 100 + 50) s = 250 GPU-s."""
    def sec(x: int) -> datetime:
        return h(0) + timedelta(seconds=x)

    store.ingest([Allocation("c", "slurm", "q", account="acct-b", partition="gpu3", start=h(0), end=h(1),
                             gpus=[AllocatedGpu("n8", 0)], submit=h(0)), *buckets("n8", 0, 0, 1, 0.01),
                  *[GpuWait("c", "slurm", k, 1, eligible=sec(a), end=sec(b), partition="gpu3")
                    for k, a, b in (("A", 0, 100), ("B", 50, 150), ("C", 200, 250))]],
                 seen_at_ts=int(h(1).timestamp()))
    opp = run_audit(store, CFG, W0, W1).summary["opportunity"]["idle_while_queued"]
    [c] = opp["by_cluster"]
    assert c["idle_gpu_hours"] == pytest.approx(200 / 3600) and c["waiting_jobs"] == 3
    assert c["waiting_gpu_hours"] == pytest.approx(250 / 3600)


def test_an_audit_of_one_cluster_leaves_the_others_queues_and_quotas_out(store: Store) -> None:
    """Audited for cluster c only: another cluster's wait and quota are neither counted nor reclaim candidates
    (they would read 8 unused GPUs there, since none of its allocations is in this run)."""
    store.ingest(fleet(), seen_at_ts=int(h(4).timestamp()))
    store.ingest([*waits(), GpuWait("other", "slurm", "o1", 8, eligible=h(0), end=h(4), partition="gpu"),
                  GpuQuota("other", "account", "acct-x", 8)], seen_at_ts=int(h(3.5).timestamp()))
    opp = run_audit(store, CFG, W0, W1, clusters=["c"]).summary["opportunity"]
    assert opp["idle_while_queued"]["waiting_jobs"] == 3  # w1, w2, w3 of c; not o1
    assert {q["cluster"] for q in opp["quotas"]} == {"c"}


def test_kubernetes_pending_pod_waits_on_the_whole_cluster(store: Store) -> None:
    """A pod holding 2 GPUs idle 0-2 h on cluster k (pods have no partition) while a Pending pod asked for 4
    GPUs from 0:30 and was still pending when last seen at 1:30: 2 GPUs x 1 h = 2.0 idle GPU-h while 1 job
    waited for 4 x 1 h = 4.0 GPU-h."""
    pod = Allocation("k", "kubernetes", "uid-1", name="nb", account="research", start=h(0), end=h(2),
                     gpus=[AllocatedGpu("g1", 0), AllocatedGpu("g1", 1)])
    tel = [GpuBucket("k", "g1", g, h(0) + timedelta(minutes=5 * i), 300, 10, sm_active=0.0, gpu_util=0.0)
           for g in (0, 1) for i in range(24)]
    store.ingest([pod, *tel], seen_at_ts=int(h(2).timestamp()))
    store.ingest([GpuWait("k", "kubernetes", "uid-2", 4, eligible=h(0.5), account="ml-train")],
                 seen_at_ts=int(h(1.5).timestamp()))
    run = run_audit(store, CFG, W0, W1)
    [c] = run.summary["opportunity"]["idle_while_queued"]["by_cluster"]
    assert (c["cluster"], c["waiting_jobs"]) == ("k", 1)
    assert c["idle_gpu_hours"] == pytest.approx(2.0) and c["waiting_gpu_hours"] == pytest.approx(4.0)
    [f] = findings(store, run.run_id, "idle_while_queued")
    assert f["external_id"] == "uid-1" and f["evidence"]["partition"] == ""
