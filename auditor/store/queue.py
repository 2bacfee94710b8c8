"""Upserts of the queue side: GPU jobs that waited (:class:`GpuWait`) and GPU quotas (:class:`GpuQuota`).
Idempotent like the rest of the ingest: the same sighting twice leaves the same rows, an end once known
stays, first/last sightings only widen."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Table, case, func

from auditor.records import GpuQuota, GpuWait
from auditor.store import schema
from auditor.store.sqlfuncs import Merge, greatest, least, upsert
from auditor.timeutil import to_epoch


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
    upsert(conn, schema.gpu_waits, list(rows.values()), ("cluster", "source", "external_id", "instance_ts"),
           WAIT_MERGE)
    return len(rows)


def ingest_quotas(conn: Connection, quotas: list[GpuQuota], seen: int) -> int:
    """The latest definition of each quota replaces the stored one."""
    rows = {}
    for q in quotas:
        ts = to_epoch(q.seen_at) or seen
        rows[(q.cluster, q.kind, q.name)] = {"cluster": q.cluster, "kind": q.kind, "name": q.name,
                                             "gpus": float(q.gpus), "first_seen_ts": ts, "last_seen_ts": ts}
    upsert(conn, schema.gpu_quotas, list(rows.values()), ("cluster", "kind", "name"),
           {"first_seen_ts": lambda t, ex: least(t.c.first_seen_ts, ex.first_seen_ts),
            "last_seen_ts": lambda t, ex: greatest(t.c.last_seen_ts, ex.last_seen_ts)})
    return len(rows)


def ingest_queue(conn: Connection, records: list[GpuWait | GpuQuota], seen: int) -> tuple[int, int]:
    """(waits, quotas) written."""
    waits = [r for r in records if isinstance(r, GpuWait)]
    quotas = [r for r in records if isinstance(r, GpuQuota)]
    return ingest_waits(conn, waits, seen) if waits else 0, ingest_quotas(conn, quotas, seen) if quotas else 0
