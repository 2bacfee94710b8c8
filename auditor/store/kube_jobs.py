"""Upserts of Kubernetes Jobs (:class:`auditor.records.KubeJob`): one row per cluster and Job uid, idempotent.
A Job's failed-pod count only grows while it lives, so the most any sighting said is kept (a listing read
from a lagging API server never lowers it); state, reason and end come from the latest sighting that has
them, first/last sightings only widen."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, func

from auditor.records import KubeJob
from auditor.store.schema_jobs import kube_jobs
from auditor.store.sqlfuncs import Merge, greatest, least, upsert
from auditor.timeutil import to_epoch

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
