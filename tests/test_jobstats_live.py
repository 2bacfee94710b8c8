"""The ``jobstats`` connector reading a REAL Slurm's accounting with ``sacct`` (testbed, default variant): a
job's AdminComment is set to a jobstats summary the way jobstats' ingest does (a JS1 value, here through
``scontrol update``, as an operator may), and after the job ends the connector turns it into per-GPU
buckets on the node and GPU indices the job really had."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from connectors import build
from connectors.base import Context, Problems, Window
from connectors.slurm.jobstats import encode_js1
from connectors.slurm.parse import gpu_items, kv_pairs, scontrol_records
from tests.conftest import need_slurm
from tests.test_slurm_live import CLUSTER, in_sacct, job_state, sbatch, sh, wait


@pytest.mark.service
@pytest.mark.serial
def test_summary_in_admin_comment_read_back_with_sacct() -> None:
    need_slurm()  # its reason names why (a foreign Slurm: "no Slurm testbed: ...")
    job = sbatch("-o", "/tmp/gpu-audit-js-%j.out", "--uid=alice", "-A", "team-a", "--gres=gpu:2", "-t", "5",
                 "--wrap", "sleep 8")
    try:
        wait("job running", lambda: job_state(job) == "RUNNING")
        rec = scontrol_records(sh("scontrol", "-d", "-o", "show", "job", job))[0]
        pairs = kv_pairs(rec)
        node = next(v for k, v in pairs if k == "Nodes")
        idx = next(g.indices for k, v in pairs if k == "GRES" for g in gpu_items(v))
        assert idx is not None and len(idx) == 2
        util = {str(idx[0]): 97.5, str(idx[1]): 0.0}  # one busy GPU, one idle
        summary = {"gpus": 2, "total_time": 8, "nodes": {node: {
            "gpu_utilization": util, "gpu_used_memory": {str(i): 2**30 for i in idx},
            "gpu_total_memory": {str(i): 80 * 2**30 for i in idx}}}}
        sh("scontrol", "update", f"JobId={job}", f"AdminComment={encode_js1(summary)}")
        wait("accounting", lambda: in_sacct(job, ("COMPLETED",)), timeout=90)
    finally:
        sh("scancel", job)
    now = datetime.now(UTC)
    src = build("jobstats", "telemetry", {}, Context(CLUSTER))
    deadline = time.monotonic() + 30
    while True:
        buckets = list(src.collect(Window(now - timedelta(hours=1), now + timedelta(minutes=5)), Problems()))
        mine = [b for b in buckets if b.hpc_job == job]
        if mine or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert {(b.host, b.gpu, b.gpu_util, b.fb_used_mib) for b in mine} == {
        (node, idx[0], 0.975, 1024.0), (node, idx[1], 0.0, 1024.0)}
    assert all(b.samples == 1 and b.sm_active is None for b in mine)
