"""The queue side in the store (docs/definitions.md "Opportunity cost"): its tables ``gpu_waits`` and
``gpu_quotas`` and their upserts: GPU jobs that waited (:class:`GpuWait`) and GPU quotas (:class:`GpuQuota`).
Idempotent like the rest of the ingest: the same sighting twice leaves the same rows, an end once known
stays, first/last sightings only widen."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Column, Connection, Float, Index, Integer, String, Table, Text, UniqueConstraint, case, func

from auditor.records import GpuQuota, GpuWait
from auditor.store.metadata import _ts, metadata
from auditor.store.sqlfuncs import Merge, greatest, least, upsert
from auditor.timeutil import to_epoch

gpu_waits = Table(
    "gpu_waits", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True, comment="Surrogate key."),
    Column("cluster", String(128), nullable=False, comment="Cluster name."),
    Column("source", String(16), nullable=False, comment="slurm or kubernetes."),
    Column("external_id", Text, nullable=False, comment="Slurm job id or Kubernetes pod UID."),
    Column("instance_ts", Integer, nullable=False, default=0, server_default="0",
           comment="Which job of that id: its submit time (UTC epoch seconds; the eligible time when the "
           "scheduler gave no submit time), as in allocations."),
    Column("name", Text, nullable=False, default="", comment="Job or pod name (user-controlled text)."),
    Column("user_name", Text, nullable=False, default="", comment="Owner user."),
    Column("account", Text, nullable=False, default="", comment="Slurm account or Kubernetes namespace."),
    Column("partition", Text, nullable=False, default="",
           comment="Slurm partition it waited in; '' for Kubernetes (the cluster is one queue)."),
    Column("qos", Text, nullable=False, default="", comment="Slurm QOS."),
    Column("state", Text, nullable=False, default="", comment="Scheduler state when last seen, e.g. PENDING."),
    Column("gpus", Float, nullable=False, default=0.0, comment="GPUs requested."),
    _ts("submit_ts", "Submission time"),
    _ts("eligible_ts", "When it could have started (Slurm Eligible; a Pending pod's creation)", nullable=False),
    _ts("end_ts", "When the wait ended: the job started, or left the queue without starting; NULL while "
        "it waits (the audit then ends the wait at last_seen_ts)"),
    _ts("first_seen_ts", "First sighting"),
    _ts("last_seen_ts", "Latest sighting"),
    UniqueConstraint("cluster", "source", "external_id", "instance_ts"),
    Index(None, "cluster", "eligible_ts"),
    comment="GPU jobs and pods that waited for GPUs (pending), one row per job: the demand idle GPUs "
            "blocked (finding idle_while_queued).",
)

gpu_quotas = Table(
    "gpu_quotas", metadata,
    Column("cluster", String(128), primary_key=True, comment="Cluster name."),
    Column("kind", String(16), primary_key=True, comment="qos (Slurm QOS GrpTRES), account (Slurm "
           "association GrpTRES of an account) or queue (a Kubernetes queue's GPU quota: Kueue ClusterQueue, "
           "KAI-Scheduler or Volcano queue; the allocations of that partition): which allocations count against "
           "it."),
    Column("name", String(255), primary_key=True, comment="QOS, account or queue name."),
    Column("gpus", Float, nullable=False, comment="GPUs the quota allows at once (gres/gpu=N)."),
    Column("reserved_gpus", Float, comment="GPUs of it reserved for admitted workloads at the latest sighting "
           "(Kueue ClusterQueue status.flavorsUsage, borrowed included); NULL where the system does not say."),
    _ts("first_seen_ts", "First sighting"),
    _ts("last_seen_ts", "Latest sighting"),
    comment="GPU quotas held by teams or queues, with their latest definition (finding idle_quota).",
)


def _state(t: Table, ex: Any) -> Any:
    # a stale "pending" sighting never overwrites the state of a wait known to have ended
    return case((ex.end_ts.is_(None) & t.c.end_ts.isnot(None), t.c.state), else_=ex.state)


def _keep_text(col: str) -> Merge:
    return lambda t, ex: func.coalesce(func.nullif(getattr(ex, col), ""), getattr(t.c, col))


WAIT_MERGE: dict[str, Merge | None] = {
    **{c: _keep_text(c) for c in ("name", "user_name", "account", "partition", "qos")},
    "state": _state,
    "submit_ts": lambda t, ex: func.coalesce(ex.submit_ts, t.c.submit_ts),
    "end_ts": lambda t, ex: func.coalesce(ex.end_ts, t.c.end_ts),
    "first_seen_ts": lambda t, ex: least(t.c.first_seen_ts, ex.first_seen_ts),
    "last_seen_ts": lambda t, ex: greatest(t.c.last_seen_ts, ex.last_seen_ts),
}


def _wait_row(w: GpuWait, seen: int) -> dict[str, Any]:
    eligible = to_epoch(w.eligible)
    submit = to_epoch(w.submit)
    end = to_epoch(w.end)
    return {"cluster": w.cluster, "source": w.source, "external_id": w.external_id,
            "instance_ts": 0 if w.source == "kubernetes" else (submit or eligible or 0),
            "name": w.name, "user_name": w.user, "account": w.account, "partition": w.partition, "qos": w.qos,
            "state": w.state, "gpus": float(w.gpus), "submit_ts": submit, "eligible_ts": eligible,
            "end_ts": end if end is None or eligible is None else max(end, eligible),
            "first_seen_ts": seen, "last_seen_ts": seen}


def ingest_waits(conn: Connection, waits: list[GpuWait], seen: int) -> int:
    """One row per (cluster, source, job id, submit time); the latest sighting in a batch wins."""
    rows = {}
    for w in waits:
        r = _wait_row(w, seen)
        rows[(r["cluster"], r["source"], r["external_id"], r["instance_ts"])] = r
    upsert(conn, gpu_waits, list(rows.values()), ("cluster", "source", "external_id", "instance_ts"),
           WAIT_MERGE)
    return len(rows)


def ingest_quotas(conn: Connection, quotas: list[GpuQuota], seen: int) -> int:
    """The latest definition of each quota replaces the stored one."""
    rows = {}
    for q in quotas:
        ts = to_epoch(q.seen_at) or seen
        rows[(q.cluster, q.kind, q.name)] = {"cluster": q.cluster, "kind": q.kind, "name": q.name,
                                             "gpus": float(q.gpus), "first_seen_ts": ts, "last_seen_ts": ts,
                                             "reserved_gpus": None if q.reserved is None else float(q.reserved)}
    upsert(conn, gpu_quotas, list(rows.values()), ("cluster", "kind", "name"),
           {"first_seen_ts": lambda t, ex: least(t.c.first_seen_ts, ex.first_seen_ts),
            "last_seen_ts": lambda t, ex: greatest(t.c.last_seen_ts, ex.last_seen_ts)})
    return len(rows)


def ingest_queue(conn: Connection, records: list[GpuWait | GpuQuota], seen: int) -> tuple[int, int]:
    """(waits, quotas) written."""
    waits = [r for r in records if isinstance(r, GpuWait)]
    quotas = [r for r in records if isinstance(r, GpuQuota)]
    return ingest_waits(conn, waits, seen) if waits else 0, ingest_quotas(conn, quotas, seen) if quotas else 0
