"""Opportunity cost on the REAL Slurm testbed (scripts/testbed-slurm.sh): a job holds all 8 GPUs of
gpu-node-01 and sleeps (idle: its telemetry is written here, the testbed has no DCGM), a second GPU job
pinned to the same node pends in the same partition; the connector reads the pending job (sacct Eligible,
ReqTRES; scontrol), a QOS GPU limit created here, and the audit prices the idle GPUs by the job that
waited. Run it alone or under a lock file other users of the shared testbed also take (`flock LOCK ...`)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from auditor.audit import queue
from auditor.audit.run import run_audit
from auditor.config import Config, Thresholds
from auditor.records import Allocation, GpuBucket, GpuQuota, GpuWait
from auditor.store.engine import Store
from connectors import build
from connectors.base import Context, Problems, Window
from tests.conftest import need, need_slurm
from tests.test_slurm_live import CLUSTER, job_state, sbatch, sh, wait


def _collect() -> tuple[list, int]:
    now = datetime.now(UTC)
    conn = build("slurm", "allocations", {"history_format": "text"}, Context(CLUSTER))
    problems = Problems()
    records = list(conn.collect(Window(now - timedelta(hours=1), now + timedelta(minutes=1)), problems))
    return records, int(now.timestamp())


def _epoch(text_: str) -> int:
    return int(datetime.fromisoformat(text_).replace(tzinfo=UTC).timestamp())


@pytest.mark.service
@pytest.mark.serial
def test_pending_job_waits_while_another_holds_gpus_idle(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    need_slurm()  # its reason names why (a foreign Slurm: "no Slurm testbed: ...")
    qos = f"gpuaudit-q{uuid.uuid4().hex[:6]}"
    jobs: list[str] = []
    o = ["-o", "/tmp/gpuaudit-queue-%j.out", "-t", "10"]
    try:
        busy = sh("squeue", "-h", "-w", "gpu-node-01", "-o", "%i").split()
        need(not busy, f"gpu-node-01 is busy with jobs {busy} (another test left them)")
        sh("sacctmgr", "-i", "add", "qos", qos, "GrpTRES=gres/gpu=6")
        holder = sbatch(*o, "--uid=alice", "-A", "team-a", "-w", "gpu-node-01", "--gres=gpu:8", "--wrap", "sleep 600")
        jobs.append(holder)
        wait("holder running", lambda: job_state(holder) == "RUNNING")
        waiter = sbatch(*o, "--uid=bob", "-A", "team-b", "-w", "gpu-node-01", "--gres=gpu:2", "--wrap", "sleep 1")
        jobs.append(waiter)
        wait("waiter pending", lambda: job_state(waiter) == "PENDING")
        time.sleep(3)  # a wait of a few seconds, measured from Slurm's own Eligible time
        # slurmctld's EligibleTime (accounting may not have the job yet: slurmdbd takes it in asynchronously)
        eligible = _epoch(next(kv.split("=", 1)[1] for kv in sh("scontrol", "-o", "show", "job", waiter).split()
                               if kv.startswith("EligibleTime=")))
        records, seen = _collect()

        [w] = [r for r in records if isinstance(r, GpuWait) and r.external_id == waiter]
        assert (w.gpus, w.end, w.partition, w.account, w.state) == (2.0, None, "gpu", "team-b", "PENDING")
        assert int(w.eligible.timestamp()) == eligible
        assert GpuQuota(CLUSTER, "qos", qos, 6.0) in [replace(q, seen_at=None) for q in records
                                                      if isinstance(q, GpuQuota)]
        [h] = [r for r in records if isinstance(r, Allocation) and r.external_id == holder]
        assert sorted(g.index for g in h.gpus) == list(range(8)) and not any(
            isinstance(r, Allocation) and r.external_id == waiter for r in records)

        # the rest backend (slurmrestd) reads the same pending job and quota
        token = sh("scontrol", "token", "username=root", "lifespan=600").strip().split("=", 1)[1]
        os.environ["GPU_AUDIT_TEST_SLURM_JWT"] = token
        try:
            now = datetime.now(UTC)
            rest = list(build("slurm", "allocations", {
                "backend": "rest", "rest_url": "http://127.0.0.1:6820",
                "rest_token": {"env": "GPU_AUDIT_TEST_SLURM_JWT"}}, Context(CLUSTER)).collect(
                Window(now - timedelta(hours=1), now + timedelta(minutes=1)), Problems()))
        finally:
            del os.environ["GPU_AUDIT_TEST_SLURM_JWT"]
        [rw] = [r for r in rest if isinstance(r, GpuWait) and r.external_id == waiter]
        assert (rw.gpus, rw.end, rw.partition, int(rw.eligible.timestamp())) == (2.0, None, "gpu", eligible)
        assert GpuQuota(CLUSTER, "qos", qos, 6.0) in [replace(q, seen_at=None) for q in rest
                                                      if isinstance(q, GpuQuota)]

        # the holder's 8 GPUs idle (SM 1 %) in 5-minute buckets from its start through the collection
        start = int(h.start.timestamp())
        first = start - start % 300
        store.ingest(records, seen_at_ts=seen)
        store.ingest([GpuBucket(CLUSTER, "gpu-node-01", g, datetime.fromtimestamp(t, UTC), 300, 10, sm_active=0.01,
                                gpu_util=0.0) for g in range(8) for t in range(first, seen, 300)], seen_at_ts=seen)
        # infra_kinds=[]: the shared testbed keeps the short drains tests/test_infra_slurm.py makes on these
        # nodes in its node events; one in the holder's 5-minute bucket (before the holder started) would leave
        # that bucket unjudged (infrastructure-affected: no verdict), so no idle time (seen in CI)
        monkeypatch.setattr(queue, "QUEUE_MIN_IDLE_GPU_HOURS", 0.0)
        th = Thresholds(min_finding_gpu_hours=0.0, infra_kinds=[])
        run = run_audit(store, Config(thresholds=th), datetime.fromtimestamp(start - 600, UTC),
                        datetime.fromtimestamp(seen, UTC))
        # the wait is [Eligible, last sighting) = [eligible, seen); the holder's 8 GPUs were idle all of it
        waited_s = seen - eligible
        assert waited_s > 0
        with store.engine.connect() as conn:
            f = conn.execute(text("SELECT f.idle_gpu_hours, f.evidence FROM findings f JOIN allocations a ON "
                                  "a.id = f.allocation_id WHERE f.run_id = :r AND f.kind = 'idle_while_queued' "
                                  "AND a.external_id = :j"), {"r": run.run_id, "j": holder}).one()
            quota = [r.evidence for r in conn.execute(text(
                "SELECT evidence FROM findings WHERE run_id = :r AND kind = 'idle_quota'"), {"r": run.run_id})]
        ev = f.evidence if isinstance(f.evidence, dict) else json.loads(f.evidence)
        assert f.idle_gpu_hours == pytest.approx(8 * waited_s / 3600)
        assert ev["waiting_jobs"] == 1 and ev["waiting_gpu_hours"] == pytest.approx(2 * waited_s / 3600)
        quota = [q if isinstance(q, dict) else json.loads(q) for q in quota]
        [mine] = [q for q in quota if q["quota"]["name"] == qos]
        assert mine["quota"]["unused_gpus"] == pytest.approx(6.0)  # nobody ran under it

        # cancelled while pending: accounting has no Start, an End -> the wait closes there
        sh("scancel", waiter)
        wait("cancel in accounting", lambda: "CANCELLED" in sh("sacct", "-n", "-X", "-P", "-j", waiter, "-o", "State"))
        records, _ = _collect()
        [w] = [r for r in records if isinstance(r, GpuWait) and r.external_id == waiter]
        end = _epoch(sh("sacct", "-n", "-X", "-P", "-j", waiter, "-o", "End").strip())
        assert w.end is not None and int(w.end.timestamp()) == end and w.state == "CANCELLED"
    finally:
        for j in jobs:
            subprocess.run(["scancel", j], capture_output=True, timeout=10)  # noqa: S603
        subprocess.run(["sacctmgr", "-i", "delete", "qos", qos], capture_output=True, timeout=30)  # noqa: S603
