"""Slurm sites whose AccountingStorageTRES lacks gres/gpu: finished jobs' accounting rows carry no GPU count.
What was learned while a job ran is kept; a job never seen running is stored with its GPU count unknown (and
said so), never dropped; with GPU accounting on, a job without GPUs is CPU-only and skipped. Built on the
real 22.05 2-node captures with the GPU TRES removed, as such a site's slurmdbd returns them."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import text

from auditor.records import Allocation
from auditor.store.engine import Store
from connectors.base import Problems, Window
from connectors.slurm import assemble, jobs
from connectors.slurm import inventory as inv
from connectors.slurm.cli import accounting_has_gpu
from connectors.slurm.parse import scontrol_records
from connectors.slurm.reading import Reading

FX = Path(__file__).parent / "fixtures" / "slurm" / "22.05"
C = "auditlab"
WIN = Window(datetime(2026, 11, 29, 14, 0, tzinfo=UTC), datetime(2026, 11, 29, 16, 0, tzinfo=UTC))


def no_gpu_tres(s: str) -> str:
    """Remove every gres/gpu TRES, as slurmdbd returns them when AccountingStorageTRES lacks gres/gpu."""
    return re.sub(r",?gres/gpu(:\w+)?=\d+", "", s)


def job23() -> tuple[Allocation, Allocation, Allocation]:
    """(running view, accounting row while running, accounting row after the cancel) of job 23, 2 x 3 GPUs."""
    rec = next(r for r in scontrol_records((FX / "2node/running/scontrol-show-job-oneliner.txt").read_text())
               if r.startswith("JobId=23 "))
    running = jobs.from_scontrol_job(no_gpu_tres(rec), C)
    rows = dict(jobs.sacct_rows((FX / "2node/running/sacct-X.txt").read_text()))
    row = next(r for r in rows.values() if isinstance(r, dict) and r["JobID"] == "23")
    row = {k: no_gpu_tres(v) for k, v in row.items()}
    hist = jobs.from_sacct_row(row, C)
    ended = jobs.from_sacct_row({**row, "State": "CANCELLED by 0", "End": "2026-11-29T14:50:00"}, C)
    return running, hist, ended


def inventory() -> list:
    now = datetime(2026, 11, 29, 14, 40, tzinfo=UTC)
    return [g for r in scontrol_records((FX / "2node/running/scontrol-show-node.txt").read_text())
            if r.startswith("NodeName=") for g in inv.from_scontrol_node(r, C, now)]


def test_config_line_tells_whether_gpus_are_accounted() -> None:
    real = (FX / "config/scontrol-show-config.txt").read_text()
    assert accounting_has_gpu(real) is True
    assert accounting_has_gpu(re.sub(r",gres/gpu(:\w+)?", "", real)) is False
    assert accounting_has_gpu("ClusterName = x\n") is None


def test_finished_jobs_keep_running_gpus_or_are_stored_unknown(store: Store) -> None:
    running, hist, ended = job23()
    # the running view still knows the GPUs (scontrol -d GRES IDX), the accounting row does not
    assert len(running.gpus) == 6 and hist.gpus == [] and ended.gpus == []
    nodes = inventory()
    first = list(assemble(Reading(running=[running], running_complete=True, history=[hist], inventory=nodes,
                                  gpu_accounted=False), WIN, C))
    store.ingest(first, seen_at_ts=int(datetime(2026, 11, 29, 14, 40, tzinfo=UTC).timestamp()))
    # after the cancel: only accounting has it (no GPU count); plus job 90, never seen running
    never = jobs.from_sacct_row({"JobID": "90", "JobIDRaw": "90", "State": "COMPLETED", "NodeList": "gpu-node-01",
                                 "Start": "2026-11-29T14:41:00", "End": "2026-11-29T14:45:00",
                                 "AllocTRES": "billing=1,cpu=1,mem=32000M,node=1"}, C)
    second = [r for r in assemble(Reading(running=[], running_complete=True, history=[ended, never],
                                          inventory=nodes, gpu_accounted=False), WIN, C)
              if isinstance(r, Allocation)]
    assert sorted(a.external_id for a in second) == ["23", "90"]  # never silently dropped
    assert all(a.labels["gpu_count"] == "unknown" for a in second)
    store.ingest(second, seen_at_ts=int(datetime(2026, 11, 29, 14, 55, tzinfo=UTC).timestamp()))
    with store.engine.connect() as conn:
        got = {r.external_id: (r.state, r.end_ts, r.gpu_count, r.n, r.idx) for r in conn.execute(text(
            "SELECT a.external_id, a.state, a.end_ts, a.gpu_count, count(g.id) AS n, "
            "sum(g.gpu_index) AS idx FROM allocations a LEFT JOIN allocated_gpus g ON g.allocation_id = a.id "
            "GROUP BY a.external_id, a.state, a.end_ts, a.gpu_count"))}
    end = int(datetime(2026, 11, 29, 14, 50, tzinfo=UTC).timestamp())
    # job 23 keeps its 6 GPUs with the indices seen while running: 0+1+2 on node 01, 1+2+3 on node 02 = 9
    assert got["23"] == ("CANCELLED", end, 6.0, 6, 9)
    assert got["90"][2:4] == (0.0, 0)  # stored, GPU count unknown (label), no invented GPUs


def test_with_gpu_accounting_a_job_without_gpus_is_cpu_only() -> None:
    _, _, hist = job23()
    out = [r for r in assemble(Reading(running_complete=True, history=[hist], inventory=inventory(),
                                       gpu_accounted=True), WIN, C) if isinstance(r, Allocation)]
    assert out == []
    unknown = [r for r in assemble(Reading(running_complete=True, history=[hist], inventory=inventory(),
                                           gpu_accounted=False), WIN, C) if isinstance(r, Allocation)]
    assert [a.external_id for a in unknown] == ["23"]
    assert Problems().total == 0


def test_counts_seen_while_running_without_indices_are_kept(store: Store) -> None:
    """Same, when the running view had per-node counts but no IDX (GPU indices unknown)."""
    running, _, ended = job23()
    running.gpus = [type(g)(node=g.node, model=g.model) for g in running.gpus]  # counts only
    store.ingest(list(assemble(Reading(running=[running], running_complete=True, inventory=inventory(),
                                       gpu_accounted=False), WIN, C)), seen_at_ts=1)
    store.ingest(list(assemble(Reading(running_complete=True, history=[ended], inventory=inventory(),
                                       gpu_accounted=False), WIN, C)), seen_at_ts=2)
    with store.engine.connect() as conn:
        n = conn.execute(text("SELECT count(*) FROM allocated_gpus g JOIN allocations a ON a.id = g.allocation_id "
                              "WHERE a.external_id = '23'")).scalar()
    assert n == 6
