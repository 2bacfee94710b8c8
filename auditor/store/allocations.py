"""The allocation ledger at ingest: one row per job instance (a reused Slurm id is a new instance), its
GPUs, and the GPU inventory. Merges keep the more specific value: a GPU index recorded while a job ran beats
a later count-only sacct row; an end time once known stays; a stale "running" sighting never reopens a job."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import Connection, Table, select, update

from auditor.records import Allocation, GpuInventory
from auditor.store import cascade, schema
from auditor.store.sqlfuncs import Merge, greatest, least, upsert
from auditor.timeutil import to_epoch

#: Allocations per ingest transaction
ALLOC_BATCH = 2000


def _keep_text(col: str) -> Merge:
    from sqlalchemy import func

    return lambda t, ex: func.coalesce(func.nullif(getattr(ex, col), ""), getattr(t.c, col))


def keep_known(col: str) -> Merge:
    """Merge: the new value, else the stored one (a sighting that does not know a field never erases it)."""
    from sqlalchemy import func

    return lambda t, ex: func.coalesce(getattr(ex, col), getattr(t.c, col))


def _state(t: Table, ex: Any) -> Any:
    from sqlalchemy import case

    # a stale "running" sighting never overwrites the state of an allocation known to have ended
    return case((ex.end_ts.is_(None) & t.c.end_ts.isnot(None), t.c.state), else_=ex.state)


ALLOC_MERGE: dict[str, Merge | None] = {
    **{c: _keep_text(c) for c in ("name", "user_name", "account", "partition", "qos", "reservation",
                                  "owner_workload", "state")},
    "state": _state,
    **{c: keep_known(c) for c in ("submit_ts", "start_ts", "end_ts", "time_limit_s", "labels", "exit_code",
                                  "cpus", "cpu_time_s", "restarts", "sluid", "failure_reason",
                                  "job_uid")},
    "first_seen_ts": lambda t, ex: least(t.c.first_seen_ts, ex.first_seen_ts),
    "last_seen_ts": lambda t, ex: greatest(t.c.last_seen_ts, ex.last_seen_ts),
    "gpu_count": None,
}


def _alloc_row(a: Allocation, seen: int) -> dict[str, Any]:
    return {"cluster": a.cluster, "source": a.source, "external_id": a.external_id, "name": a.name,
            "user_name": a.user, "account": a.account, "partition": a.partition, "qos": a.qos,
            "state": a.state, "submit_ts": to_epoch(a.submit), "start_ts": to_epoch(a.start),
            "end_ts": to_epoch(a.end), "reservation": a.reservation, "owner_workload": a.owner_workload,
            "time_limit_s": a.time_limit_s, "labels": dict(a.labels) or None, "gpu_count": a.gpu_count,
            "first_seen_ts": seen, "last_seen_ts": seen, "exit_code": a.exit_code, "cpus": a.cpus,
            "cpu_time_s": a.cpu_time_s, "restarts": a.restarts, "sluid": a.sluid,
            "failure_reason": a.failure_reason or None, "job_uid": a.job_uid or None}


def _gpu_rows(a: Allocation) -> list[dict[str, Any]]:
    by_node: dict[str, list[Any]] = defaultdict(list)
    for g in a.gpus:
        by_node[g.node].append(g)
    rows = []
    for node in sorted(by_node):
        gs = sorted(by_node[node], key=lambda g: (g.index is None, g.index if g.index is not None else 0))
        for slot, g in enumerate(gs):
            rows.append({"node": node, "slot": slot, "gpu_index": g.index, "uuid": g.uuid,
                         "model": g.model, "share": g.share, "mig_profile": g.mig_profile})
    return rows


def _instance(a: Allocation) -> tuple[int | None, int | None]:
    """(submit, start) epochs that tell apart two jobs of one reused Slurm id (pods: never reused)."""
    if a.source == "kubernetes":
        return None, None
    return to_epoch(a.submit), to_epoch(a.start)


def _same_job(submit: int | None, start: int | None, row: Any) -> bool:
    """Submit times decide when both are known; else start times; a sighting with neither is matched by
    the caller to the latest job of that id."""
    if submit is not None and row.submit_ts is not None:
        return bool(submit == row.submit_ts)
    return start is not None and row.start_ts is not None and start == row.start_ts


Key4 = tuple[str, str, str, int]
CHUNK = 1000


def _by_ids(conn: Connection, keys: set[tuple[str, str, str]], *extra: Any) -> list[Any]:
    """Stored allocations of these (cluster, source, external_id): per cluster and source, ``external_id
    IN (...)`` on the unique index (plain values bind much faster than row-value tuples)."""
    t = schema.allocations
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for c, src, ext in keys:
        groups[(c, src)].append(ext)
    out: list[Any] = []
    for (c, src), exts in groups.items():
        exts.sort()
        for i in range(0, len(exts), CHUNK):
            out += conn.execute(select(t.c.id, t.c.cluster, t.c.source, t.c.external_id, t.c.instance_ts, *extra)
                                .where(t.c.cluster == c, t.c.source == src,
                                       t.c.external_id.in_(exts[i:i + CHUNK]))).all()
    return out


def resolve_instances(conn: Connection, allocs: list[Allocation]) -> tuple[dict[Key4, Allocation], dict[Key4, int]]:
    """Key each sighting by (cluster, source, external_id, instance_ts): the stored job it is the same job
    as (see :func:`_same_job`), else a new instance (submit time, else start time, else 0). Slurm reuses job
    ids; Kubernetes pod UIDs are unique, so pods always get instance 0. Also returns the ids of the stored
    jobs it read, so only new ones are looked up after the upsert."""
    from types import SimpleNamespace

    t = schema.allocations
    ext = {(a.cluster, a.source, a.external_id) for a in allocs if a.source != "kubernetes"}
    known: dict[tuple[str, str, str], list[Any]] = defaultdict(list)
    ids: dict[Key4, int] = {}
    for r in _by_ids(conn, ext, t.c.submit_ts, t.c.start_ts):
        known[(r.cluster, r.source, r.external_id)].append(
            SimpleNamespace(instance_ts=r.instance_ts, submit_ts=r.submit_ts, start_ts=r.start_ts))
        ids[(r.cluster, r.source, r.external_id, r.instance_ts)] = r.id
    latest: dict[Key4, Allocation] = {}
    for a in allocs:  # the last sighting in a batch wins, like a later batch would
        k3 = (a.cluster, a.source, a.external_id)
        submit, start = _instance(a)
        if a.source == "kubernetes":
            latest[(*k3, 0)] = a
            continue
        rows = known[k3]
        match = next((r for r in rows if _same_job(submit, start, r)), None)
        if match is None and submit is None and start is None and rows:
            match = max(rows, key=lambda r: r.instance_ts)
        if match is None:  # a stored sighting with neither time is the job this one gives times for
            match = next((r for r in rows if r.submit_ts is None and r.start_ts is None), None)
        if match is None:
            inst = submit if submit is not None else (start if start is not None else 0)
            match = SimpleNamespace(instance_ts=inst, submit_ts=submit, start_ts=start)
            rows.append(match)
        else:  # what this sighting adds helps match the next one in the batch
            match.submit_ts = match.submit_ts if match.submit_ts is not None else submit
            match.start_ts = match.start_ts if match.start_ts is not None else start
        latest[(*k3, match.instance_ts)] = a
    return latest, ids


def ingest_allocations(conn: Connection, allocs: list[Allocation], seen: int) -> tuple[int, int]:
    """Upsert allocations, then their GPUs: indices never get downgraded to "unknown"."""
    t, g = schema.allocations, schema.allocated_gpus
    latest, known_ids = resolve_instances(conn, allocs)
    key_cols = ("cluster", "source", "external_id", "instance_ts")
    upsert(conn, t, [{**_alloc_row(a, seen), "instance_ts": k[3]} for k, a in latest.items()], key_cols,
           ALLOC_MERGE)
    ids = {k: known_ids[k] for k in latest if k in known_ids}
    missing = {k for k in latest if k not in ids}
    ids.update(((r.cluster, r.source, r.external_id, r.instance_ts), r.id)
               for r in _by_ids(conn, {k[:3] for k in missing}) if (r.cluster, r.source, r.external_id,
                                                                       r.instance_ts) in missing)
    existing: dict[int, list[Any]] = defaultdict(list)
    for r in conn.execute(select(g.c.id, g.c.allocation_id, g.c.node, g.c.slot, g.c.gpu_index)
                          .where(g.c.allocation_id.in_(list(ids.values())))):
        existing[r.allocation_id].append(r)
    new_rows: list[dict[str, Any]] = []
    stale: list[int] = []
    for key, a in latest.items():
        aid = ids[key]
        rows = _gpu_rows(a)
        old = existing.get(aid, [])
        if old and any(r.gpu_index is not None for r in old) and all(r["gpu_index"] is None for r in rows):
            continue  # keep the indices recorded while it ran
        if old and not rows:
            continue  # a sighting without GPUs (count unknown to accounting) keeps the GPUs recorded earlier
        wanted = {(r["node"], r["slot"]) for r in rows}
        stale += [r.id for r in old if (r.node, r.slot) not in wanted]
        new_rows += [{"allocation_id": aid, **r} for r in rows]
    cascade.delete_allocated_gpus(conn, stale)
    upsert(conn, g, new_rows, ("allocation_id", "node", "slot"))
    if ids:
        from sqlalchemy import func

        total = (select(func.coalesce(func.sum(g.c.share), 0.0)).where(g.c.allocation_id == t.c.id)
                 .scalar_subquery())
        conn.execute(update(t).where(t.c.id.in_(list(ids.values()))).values(gpu_count=total))
    return len(latest), len(new_rows)


def ingest_inventory(conn: Connection, items: list[GpuInventory], seen: int) -> int:
    rows = {}
    for i in items:
        ts = to_epoch(i.seen_at) or seen
        rows[(i.cluster, i.host, i.gpu)] = {"cluster": i.cluster, "host": i.host, "gpu_index": i.gpu,
                                            "model": i.model, "uuid": i.uuid, "mig_layout": i.mig_layout,
                                            "first_seen_ts": ts, "last_seen_ts": ts}
    upsert(conn, schema.gpu_inventory, list(rows.values()), ("cluster", "host", "gpu_index"),
           {"model": keep_known("model"), "uuid": keep_known("uuid"),
            "first_seen_ts": lambda t, ex: least(t.c.first_seen_ts, ex.first_seen_ts),
            "last_seen_ts": lambda t, ex: greatest(t.c.last_seen_ts, ex.last_seen_ts)})
    return len(rows)
