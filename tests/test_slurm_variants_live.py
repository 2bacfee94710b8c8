"""The Slurm connector against REAL Slurm configurations that lose data today (issue 14 §3), as variants of
the testbed (``SLURM_TESTBED_VARIANT`` of scripts/testbed-slurm.sh): AccountingStorageTRES without gres/gpu,
and MIG-typed GRES plus shards on fake devices. Each test reconfigures the running testbed, submits real
jobs and restores the default configuration afterwards (about a minute each). Needs root and the testbed;
other users of the testbed serialise with ``flock LOCK`` on a shared lock file (or run these alone, as CI does)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from auditor.records import Allocation
from auditor.store.engine import Store
from connectors import build
from connectors.base import Context, Problems, Window
from tests.conftest import need, need_slurm
from tests.test_slurm_live import CLUSTER, in_sacct, job_state, sbatch, sh, wait

ROOT = Path(__file__).resolve().parent.parent


def reconfigure(variant: str) -> None:
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "testbed-slurm.sh"), "up"],  # noqa: S603, S607
                          env={**os.environ, "SLURM_TESTBED_VARIANT": variant}, capture_output=True, text=True,
                          timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]


@contextmanager
def variant(name: str) -> Iterator[None]:
    need(os.geteuid() == 0, "not root (the Slurm testbed's variants run as root)")
    need_slurm()
    t0 = time.monotonic()
    while sh("squeue", "-h").strip() and time.monotonic() - t0 < 120:  # never reconfigure under others' jobs
        time.sleep(2)
    need(not sh("squeue", "-h").strip(), "the testbed is busy with other jobs")
    try:
        reconfigure(name)
        yield
    finally:
        reconfigure("default")


def read(expect: tuple[str, ...] = ()) -> list:
    deadline = time.monotonic() + 30
    while True:
        now = datetime.now(UTC)
        records = list(build("slurm", "allocations", {}, Context(CLUSTER)).collect(
            Window(now - timedelta(hours=1), now + timedelta(minutes=1)), Problems()))
        got = {r.external_id for r in records if isinstance(r, Allocation)}
        if all(e in got for e in expect) or time.monotonic() > deadline:
            return records
        time.sleep(1)


def allocs(records: list) -> dict[str, Allocation]:
    return {r.external_id: r for r in records if isinstance(r, Allocation)}


@pytest.mark.service
@pytest.mark.serial
def test_accounting_without_gres_gpu(tmp_path: Path) -> None:
    with variant("no-gpu-tres"):
        out = ["-o", "/tmp/gpu-audit-variant-%j.out", "--uid=alice", "-A", "team-a"]
        a = sbatch(*out, "--gres=gpu:2", "-t", "5", "--wrap", "sleep 300")
        wait("job A running", lambda: job_state(a) == "RUNNING")
        store = Store.open(f"sqlite:///{tmp_path / 's.db'}")
        store.upgrade()
        first = read((a,))
        running = allocs(first)[a]
        assert len(running.gpus) == 2 and all(g.index is not None for g in running.gpus)  # scontrol -d IDX
        store.ingest(first, seen_at_ts=int(time.time()))
        sh("scancel", a)
        b = sbatch(*out, "--gres=gpu:1", "-t", "5", "--wrap", "sleep 1")  # starts and ends between collects
        wait("accounting", lambda: in_sacct(a, ("CANCELLED",)) and in_sacct(b, ("COMPLETED",)), timeout=90)
        tres = sh("sacct", "-n", "-X", "-P", "-j", f"{a},{b}", "-o", "AllocTRES")
        assert "gres/gpu" not in tres  # the variant is real: slurmdbd keeps no GPU count
        second = read((a, b))
        got = allocs(second)
        # reported, not dropped: slurmctld still lists b (MinJobAge) with tres_per_job gres/gpu:1, so it keeps that
        # one GPU, its index unknown (its time is then unknown, never idle)
        assert [g.index for g in got[b].gpus] == [None] and got[b].labels.get("gpu_count") != "unknown"
        time.sleep(1)
        store.ingest(second, seen_at_ts=int(time.time()))
        with store.engine.connect() as conn:
            rows = {r.external_id: (r.end_ts is not None, r.n, r.labels) for r in conn.execute(text(
                "SELECT a.external_id, a.end_ts, a.labels, count(g.id) AS n FROM allocations a LEFT JOIN "
                "allocated_gpus g ON g.allocation_id = a.id WHERE a.external_id IN (:a, :b) "
                "GROUP BY a.external_id, a.end_ts, a.labels"), {"a": a, "b": b})}
        assert rows[a][:2] == (True, 2)  # ended, and keeps the 2 GPUs recorded while it ran
        assert rows[b][:2] == (True, 1)


@pytest.mark.service
@pytest.mark.serial
def test_mig_typed_gres_and_shards() -> None:
    with variant("mig-shard"):
        out = ["-o", "/tmp/gpu-audit-variant-%j.out", "--uid=bob", "-A", "team-b", "-t", "5"]
        m = sbatch(*out, "--gres=gpu:1g.10gb:2", "--wrap", "sleep 300")
        t = sbatch(*out, "--gres=gpu:3g.40gb:1", "--wrap", "sleep 300")
        s = sbatch(*out, "--gres=shard:2", "--wrap", "sleep 300")
        try:
            wait("jobs running", lambda: all(job_state(j) == "RUNNING" for j in (m, t, s)))
            got = allocs(read((m, t, s)))
            # 1g.10gb = 1 of 7 compute slices, 3g.40gb = 3 of 7; by Slurm's MIG device index (IDX)
            assert [(g.node, round(g.share * 7, 6), g.mig_profile) for g in got[m].gpus] == \
                [("gpu-node-01", 1.0, "1g.10gb")] * 2
            assert all(g.index is not None for g in got[m].gpus + got[t].gpus)
            assert [(round(g.share * 7, 6), g.mig_profile) for g in got[t].gpus] == [(3.0, "3g.40gb")]
            # 2 shards of a node with 64 shards on 8 GPUs: 2/8 of one GPU, on the GPU Slurm names
            assert [(g.node, g.share, g.mig_profile) for g in got[s].gpus] == [("gpu-node-02", 0.125, "shard")] * 2
            assert got[m].gpu_count == pytest.approx(2 / 7) and got[s].gpu_count == pytest.approx(0.25)
        finally:
            sh("scancel", m, t, s)
        wait("accounting", lambda: all(in_sacct(j, ("CANCELLED",)) for j in (m, t, s)), timeout=90)
        hist = allocs(read((m, t, s)))  # accounting rows only now: typed TRES gres/gpu:1g.10gb=2, gres/shard=2
        assert sorted(round(g.share * 7, 6) for g in hist[m].gpus) == [1.0, 1.0]
        assert sum(g.share for g in hist[s].gpus) == pytest.approx(0.25)
