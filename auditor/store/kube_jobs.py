"""Kubernetes Jobs in the store: their table ``kube_jobs`` (read by the goodput rules) and its upserts
(:class:`auditor.records.KubeJob`): one row per cluster and Job uid, idempotent.
A Job's failed-pod count only grows while it lives, so the most any sighting said is kept (a listing read
from a lagging API server never lowers it); state, reason and end come from the latest sighting that has
them, first/last sightings only widen."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Column, Connection, Integer, PrimaryKeyConstraint, String, Table, Text, func

from auditor.records import KubeJob
from auditor.store.metadata import _ts, metadata
from auditor.store.sqlfuncs import Merge, greatest, least, upsert
from auditor.timeutil import to_epoch

kube_jobs = Table(
    "kube_jobs", metadata,
    Column("cluster", String(128), nullable=False, comment="Cluster name."),
    Column("uid", String(64), nullable=False, comment="The Job's metadata.uid (its pods' label controller-uid, "
           "or batch.kubernetes.io/controller-uid)."),
    Column("namespace", Text, nullable=False, comment="Namespace."),
    Column("name", Text, nullable=False, comment="Job name (user-controlled text)."),
    Column("backoff_limit", Integer, comment="spec.backoffLimit: failed pods retried before the Job fails; NULL "
           "when not said."),
    Column("failed", Integer, nullable=False, default=0, comment="Pods that failed: status.failed plus the failed "
           "pods not yet counted (status.uncountedTerminatedPods.failed); the most any sighting said."),
    Column("succeeded", Integer, nullable=False, default=0, comment="Pods that succeeded (status.succeeded)."),
    Column("active", Integer, nullable=False, default=0, comment="Pods running or pending at the last sighting "
           "(status.active)."),
    Column("state", String(16), nullable=False, default="", comment="Running, Complete, Failed or Suspended (the "
           "Job's conditions at the last sighting)."),
    Column("reason", Text, nullable=False, default="", comment="Why it failed, the Failed condition's reason "
           "(e.g. BackoffLimitExceeded, DeadlineExceeded); '' otherwise."),
    _ts("start_ts", "status.startTime"),
    _ts("end_ts", "status.completionTime, or when the Failed condition was set; NULL while it runs"),
    _ts("first_seen_ts", "First collection that listed it"),
    _ts("last_seen_ts", "Latest collection that listed it"),
    PrimaryKeyConstraint("cluster", "uid"),
    comment="Kubernetes Jobs with GPU pods: failed, succeeded and active pods, backoff limit and outcome.",
)

MERGE: dict[str, Merge | None] = {
    "failed": lambda t, ex: greatest(t.c.failed, ex.failed),
    "succeeded": lambda t, ex: greatest(t.c.succeeded, ex.succeeded),
    "start_ts": lambda t, ex: func.coalesce(ex.start_ts, t.c.start_ts),
    "end_ts": lambda t, ex: func.coalesce(ex.end_ts, t.c.end_ts),
    "first_seen_ts": lambda t, ex: least(t.c.first_seen_ts, ex.first_seen_ts),
    "last_seen_ts": lambda t, ex: greatest(t.c.last_seen_ts, ex.last_seen_ts),
}


def _row(j: KubeJob, seen: int) -> dict[str, Any]:
    at = to_epoch(j.seen_at) if j.seen_at is not None else seen
    return {"cluster": j.cluster, "uid": j.uid, "namespace": j.namespace, "name": j.name,
            "backoff_limit": j.backoff_limit, "failed": j.failed, "succeeded": j.succeeded, "active": j.active,
            "state": j.state[:16], "reason": j.reason, "start_ts": to_epoch(j.start), "end_ts": to_epoch(j.end),
            "first_seen_ts": at, "last_seen_ts": at}


def ingest_kube_jobs(conn: Connection, jobs: list[KubeJob], seen: int) -> int:
    """Upsert ``jobs`` (the last of duplicates in one batch wins)."""
    rows = {(j.cluster, j.uid): _row(j, seen) for j in jobs}
    upsert(conn, kube_jobs, list(rows.values()), ("cluster", "uid"), MERGE)
    return len(rows)
