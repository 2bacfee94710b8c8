"""Batched, idempotent upserts of records on their natural keys.

The same input twice, overlapping windows, or windows out of order leave identical tables: merges keep the
more specific value (a GPU index recorded while a job ran beats a later count-only sacct row; a bucket with
more samples beats a partial one; an end time once known stays).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, insert, select, update

from auditor.records import (
    LABEL_FIELDS,
    METRIC_FIELDS,
    Allocation,
    GpuBucket,
    GpuInventory,
    GpuQuota,
    GpuWait,
    InferenceBucket,
    KubeJob,
    NodeBucket,
    NodeEvent,
    PortBucket,
    Record,
    Reservation,
    RunningSnapshot,
)
from auditor.store import schema
from auditor.store.allocations import ALLOC_BATCH, ingest_allocations, ingest_inventory, keep_known
from auditor.store.reservations import ingest_reservations, money_problem, name_reservations, quarantine_rows
from auditor.store.sqlfuncs import greatest, greatest_least, least, upsert

if TYPE_CHECKING:
    from auditor.store.engine import Store
    from auditor.store.stats import IngestStats

log = logging.getLogger("gpu_audit.ingest")
#: how a metric was measured (auditor.store.columns.EXACT_COMMENTS), merged like the metrics
EXACT_FIELDS = ("sm_exact",)
BUCKET_COLS = ("gpu_id", "bucket_ts", "job", "bucket_s", "samples", "observed_s", "span_start", "span_end",
               *METRIC_FIELDS, *LABEL_FIELDS, *EXACT_FIELDS)
_BUCKET_KEY = attrgetter("cluster", "host", "gpu", "gpu_instance")  # C-level getters: the per-row cost
_BUCKET_VALUES = attrgetter(*METRIC_FIELDS, *LABEL_FIELDS)
_UUID_MODEL = attrgetter("uuid", "model")
HOUR = 3600
COPY_MIN_ROWS = 1  # PostgreSQL: every batch through COPY (tests may raise it to force executemany)


def bucket_sets(dialect: str) -> list[str]:
    """The merge of a row with the stored one, FIELD BY FIELD (docs/definitions.md): each metric and label
    from the row that has it, from the one with more samples if both do (tie: the stored one); samples and
    observed seconds the maximum; the span of the row with more samples. Ingesting the same rows again
    changes nothing; one source's row never blanks another source's fields."""
    big, _ = greatest_least(dialect)
    more = "excluded.samples > gpu_buckets.samples"
    return [f"samples = {big}(gpu_buckets.samples, excluded.samples)",
            f"observed_s = {big}(gpu_buckets.observed_s, excluded.observed_s)",
            *(f"{c} = CASE WHEN {more} THEN excluded.{c} ELSE gpu_buckets.{c} END" for c in ("span_start",
                                                                                             "span_end")),
            *(f"{c} = CASE WHEN excluded.{c} IS NULL THEN gpu_buckets.{c} WHEN gpu_buckets.{c} IS NULL OR {more} "
              f"THEN excluded.{c} ELSE gpu_buckets.{c} END" for c in (*METRIC_FIELDS, *LABEL_FIELDS,
                                                                       *EXACT_FIELDS))]


def _bucket_sql(dialect: str) -> str:
    """The row-at-a-time upsert (SQLite, and PostgreSQL with ``COPY_MIN_ROWS`` not reached)."""
    ph = "%s" if dialect == "postgresql" else "?"
    return (f"INSERT INTO gpu_buckets ({', '.join(BUCKET_COLS)}) VALUES ({', '.join([ph] * len(BUCKET_COLS))}) "
            f"ON CONFLICT (gpu_id, bucket_ts, job) DO UPDATE SET {', '.join(bucket_sets(dialect))}")


def write_bucket_rows(conn: Connection, rows: list[tuple], *, copy: bool | None = None) -> None:
    """Merge bucket row tuples (``BUCKET_COLS`` order) into gpu_buckets. On PostgreSQL batches of at least
    ``COPY_MIN_ROWS`` go through COPY + one set-based merge (:mod:`auditor.store.ingest_pg`), same result."""
    if copy is None:
        copy = conn.dialect.name == "postgresql" and len(rows) >= COPY_MIN_ROWS
    ids: list[int] = []
    if conn.dialect.name == "postgresql":
        from auditor.store import partitions
        from auditor.store.ingest_pg import check_gpu_ids

        ids = sorted({r[0] for r in rows})
        check_gpu_ids(conn, ids)  # the foreign key, once per batch (no per-row trigger on PostgreSQL)
        partitions.ensure_weeks(conn, {r[1] for r in rows})
    if copy:
        from auditor.store.ingest_pg import copy_merge

        copy_merge(conn, rows, BUCKET_COLS, bucket_sets("postgresql"), ids)
    else:
        conn.exec_driver_sql(_bucket_sql(conn.dialect.name), rows)


def telemetry_gpu_ids(conn: Connection, buckets: list[GpuBucket], cache: dict[tuple, int],
                      keys: list[tuple] | None = None) -> None:
    """Resolve (cluster, host, gpu, instance) to telemetry_gpus.id, creating rows for new GPUs; ``keys``:
    the buckets' keys when the caller has them. A new GPU takes the last uuid and the last model any of
    its buckets in the batch knows (a source that lacks one, jobstats beside DCGM say, never blanks the
    other's): one C-level ``dict(zip(...))`` over the batch, a Python pass only where the last bucket lacks one."""
    t = schema.telemetry_gpus
    if keys is None:
        keys = list(map(_BUCKET_KEY, buckets))
    last = dict(zip(keys, map(_UUID_MODEL, buckets), strict=True))
    missing = {k: v for k, v in last.items() if k not in cache}
    gaps = {k for k, (u, m) in missing.items() if u is None or m is None}
    if gaps:  # a source that does not know them: the last uuid and model any bucket of the GPU knew
        for k, b in zip(keys, buckets, strict=True):
            if k in gaps:
                u, m = missing[k]
                missing[k] = (u if b.uuid is None else b.uuid, m if b.model is None else b.model)
    if not missing:
        return
    upsert(conn, t, [{"cluster": k[0], "host": k[1], "gpu_index": k[2], "gpu_instance": k[3], "uuid": u,
                      "model": m} for k, (u, m) in missing.items()],
           ("cluster", "host", "gpu_index", "gpu_instance"),
           {"uuid": keep_known("uuid"), "model": keep_known("model")})
    for cluster in {k[0] for k in missing}:
        for r in conn.execute(select(t.c.id, t.c.host, t.c.gpu_index, t.c.gpu_instance)
                              .where(t.c.cluster == cluster)):
            cache[(cluster, r.host, r.gpu_index, r.gpu_instance)] = r.id


def _row(gid: int, b: GpuBucket) -> tuple:
    seconds, samples = int(b.seconds), int(b.samples)
    obs = b.observed_s
    if obs is None:  # a source that cannot tell: the whole bucket when sampled
        obs = float(seconds) if samples > 0 else 0.0
    else:  # clamped to 0..seconds (NaN -> 0)
        obs = float(obs)
        if not obs > 0.0:
            obs = 0.0
        elif obs >= seconds:
            obs = float(seconds)
    ts = int(b.start.timestamp())
    sp_s = sp_e = None
    if b.span_start is not None or b.span_end is not None:
        sp_s = max(ts, int(b.span_start.timestamp())) if b.span_start is not None else ts
        sp_e = min(ts + seconds, int(b.span_end.timestamp())) if b.span_end is not None else ts + seconds
        sp_e = max(sp_e, sp_s)
    job = b.job
    # a tuple concatenated, not one built by unpacking (a list, then a tuple): 15 % of the row's cost
    return (gid, ts, job if job is not None else b.job_key(), seconds, samples, obs, sp_s, sp_e) + _BUCKET_VALUES(b) \
        + ((None if b.sm_active is None else 1.0 if b.sm_exact else 0.0),)


def _drop_rolled_up(conn: Connection, rows: list[tuple], before: int | None) -> list[tuple]:
    """Fine rows for an hour that a roll-up already folded into an hourly row are dropped (logged): the
    hourly row holds that hour's data, so adding them again would count it twice."""
    if before is None:
        return rows
    old = [r for r in rows if r[3] < HOUR and r[1] < before]
    if not old:
        return rows
    g = schema.gpu_buckets
    hours = {(r[0], r[1] // HOUR * HOUR) for r in old}
    have: set[tuple[int, int]] = set()
    for gid in {h[0] for h in hours}:
        ts = [h[1] for h in hours if h[0] == gid]
        have |= {(gid, x) for (x,) in conn.execute(select(g.c.bucket_ts).where(
            g.c.gpu_id == gid, g.c.bucket_s >= HOUR, g.c.bucket_ts.in_(ts)))}
    if not have:
        return rows
    kept = [r for r in rows if not (r[3] < HOUR and r[1] < before and (r[0], r[1] // HOUR * HOUR) in have)]
    log.warning("dropped %d telemetry buckets for hours already rolled up (gpu-audit db prune): the hourly "
                "rows keep those hours", len(rows) - len(kept))
    return kept


def ingest_buckets(conn: Connection, buckets: list[GpuBucket], cache: dict[tuple, int],
                   rolled_up_before: int | None = None) -> int:
    """The hot path: row tuples (no ORM objects), merged by :func:`write_bucket_rows`."""
    keys = list(map(_BUCKET_KEY, buckets))
    gids = list(map(cache.get, keys))
    if None in gids:
        telemetry_gpu_ids(conn, buckets, cache, keys)
        gids = list(map(cache.__getitem__, keys))
    return len(store_rows(conn, buckets, gids, rolled_up_before))


def store_rows(conn: Connection, buckets: list[GpuBucket], gids: list[int],
               rolled_up_before: int | None) -> list[tuple]:
    """Buckets with their telemetry GPU ids into gpu_buckets, their hours marked for the judged aggregate
    and their GPUs' labels flag set; returns the rows written."""
    streamed = None
    if conn.dialect.name == "postgresql" and len(buckets) >= COPY_MIN_ROWS:
        from auditor.store.ingest_pg import copy_stream

        streamed = copy_stream(conn, buckets, gids, _row, BUCKET_COLS, bucket_sets("postgresql"), rolled_up_before)
    if streamed is not None:
        rows = streamed
    else:
        from auditor.store import meta

        rows = list(map(_row, gids, buckets))
        meta.check_width(conn, {r[3] for r in rows})
        rows = _drop_rolled_up(conn, rows, rolled_up_before)
        if not rows:
            return rows
        write_bucket_rows(conn, rows)
    from auditor.store import judged

    judged.mark_rows(conn, rows)  # the hours the aggregate re-judges before the next audit reads them
    labelled = {r[0] for r in rows if r[2]}
    if labelled:
        t = schema.telemetry_gpus
        conn.execute(update(t).where(t.c.id.in_(sorted(labelled)), t.c.has_jobs == 0).values(has_jobs=1))
    return rows


def close_unseen(conn: Connection, cluster: str, source: str, seen: int, accounts: tuple[str, ...] = ()) -> int:
    """After a complete listing at ``seen``: open allocations not in it ended at their last sighting."""
    t = schema.allocations
    cond = [t.c.cluster == cluster, t.c.source == source, t.c.end_ts.is_(None), t.c.start_ts.isnot(None),
            t.c.last_seen_ts < seen]
    if accounts:
        cond.append(t.c.account.in_(accounts))
    # never before its start: a start read from a clock ahead of the collector's would give negative hours
    res = conn.execute(update(t).where(*cond).values(end_ts=greatest(t.c.last_seen_ts, t.c.start_ts), state="GONE"))
    return res.rowcount or 0


def _write(conn: Connection, allocs: list[Allocation], resv: list[Reservation], inv: list[GpuInventory],
           buckets: list[GpuBucket], events: list[NodeEvent], seen: int, cache: dict[tuple, int],
           stats: IngestStats, queue: list[GpuWait | GpuQuota] | None = None) -> None:
    from auditor.store import meta
    from auditor.store.events import ingest_events
    from auditor.store.queue import ingest_queue

    if queue:
        nw, nq = ingest_queue(conn, queue, seen)
        stats.waits += nw
        stats.quotas += nq
    if resv:  # first: jobs named by reservation id only look their reservation up
        stats.reservations += ingest_reservations(conn, resv, seen)
    if allocs:
        name_reservations(conn, allocs)
        n, ng = ingest_allocations(conn, allocs, seen)
        stats.allocations += n
        stats.allocated_gpus += ng
    if inv:
        stats.inventory += ingest_inventory(conn, inv, seen)
    if buckets:
        stats.buckets += ingest_buckets(conn, buckets, cache, meta.rolled_up_before(conn))
    if events:
        stats.events += ingest_events(conn, events, seen)


def _finish(conn: Connection, snapshots: list[Any], clusters: set[str], seen: int, stats: IngestStats) -> None:
    from auditor.store.events import close_unseen_events

    for s in snapshots:
        stats.closed += close_unseen(conn, s.cluster, s.source, seen, s.accounts)
        if s.event_kinds:
            close_unseen_events(conn, s.cluster, s.event_source, s.event_kinds, seen)
    upsert(conn, schema.clusters, [{"name": c, "first_seen_ts": seen, "last_seen_ts": seen} for c in sorted(clusters)],
           ("name",), {"first_seen_ts": lambda t, ex: least(t.c.first_seen_ts, ex.first_seen_ts),
                       "last_seen_ts": lambda t, ex: greatest(t.c.last_seen_ts, ex.last_seen_ts)})


OnBad = Callable[[Record, str], None]


def _reason(exc: BaseException) -> str:
    """One line from a driver error, without the SQL statement or parameters SQLAlchemy appends."""
    from auditor.logs import scrub

    msg = str(getattr(exc, "orig", None) or exc).strip()
    return scrub(msg.splitlines()[0] if msg else type(exc).__name__)[:300]


def _row_by_row(store: Store, records: list[Record], seen: int, cache: dict[tuple, int], stats: IngestStats,
                on_bad: OnBad, final: Callable[[Connection], None] | None) -> None:
    """After a batch failed: each record in its own savepoint, so the bad ones are quarantined and the rest
    committed in one transaction (nothing half-written: a record and its GPUs go in or stay out together).
    Every record failing alike is the store's fault, not the records': that is raised."""
    from sqlalchemy.exc import DBAPIError

    from auditor.errors import StoreError

    failures: list[tuple[Record, str]] = []
    with store.begin() as conn:
        for rec in records:
            key = _BUCKET_KEY(rec) if isinstance(rec, GpuBucket) else None
            had = key in cache if key else True
            one = type(stats)()
            try:
                with conn.begin_nested():
                    _write(conn, *(([rec] if isinstance(rec, cls) else []) for cls in
                                   (Allocation, Reservation, GpuInventory, GpuBucket, NodeEvent)), seen, cache,
                           one, [rec] if isinstance(rec, GpuWait | GpuQuota) else None)
            except Exception as exc:
                if isinstance(exc, DBAPIError) and exc.connection_invalidated:
                    raise StoreError(f"store {store.redacted_url()}: connection lost: {_reason(exc)}") from None
                if not had:
                    cache.pop(key, None)  # its telemetry_gpus row was rolled back with the savepoint
                failures.append((rec, _reason(exc)))
                continue
            stats.add(one)
        if len(failures) == len(records) > 3 and len({r for _, r in failures}) == 1:
            raise StoreError(f"store {store.redacted_url()}: every record of a batch failed: {failures[0][1]}")
        if final:
            final(conn)
    for rec, reason in failures:
        on_bad(rec, f"the store refused it: {reason}")


def ingest(store: Store, records: Iterable[Record], *, seen_at_ts: int, on_bad: OnBad | None = None) -> IngestStats:
    """Upsert ``records`` in batched transactions. With ``on_bad``, a batch the store refuses is retried
    record by record and each refused record is handed to ``on_bad`` (the collector quarantines it)."""
    from auditor.store import meta
    from auditor.store.stats import IngestStats

    stats = IngestStats()
    allocs: list[Allocation] = []
    resv: list[Reservation] = []
    inv: list[GpuInventory] = []
    buckets: list[GpuBucket] = []
    queue: list[GpuWait | GpuQuota] = []
    events: list[NodeEvent] = []
    snapshots: list[RunningSnapshot] = []
    inference: list[InferenceBucket] = []  # vLLM/TGI/SGLang/Triton buckets (auditor.store.inference)
    nodes: list[NodeBucket] = []  # host telemetry (auditor.store.node)
    ports: list[PortBucket] = []  # InfiniBand ports (auditor.store.node)
    jobs: list[KubeJob] = []  # Kubernetes Jobs (auditor.store.kube_jobs)
    bad: list[tuple[Any, str]] = []
    cache: dict[tuple, int] = {}
    clusters: set[str] = set()

    def flush(final: bool = False) -> None:
        if inference:  # their own set-based upsert; a refused one is quarantined like any record
            from auditor.store.inference import ingest_inference

            stats.inference += _flush_side(store, inference, stats, seen_at_ts, on_bad, ingest_inference)
        if nodes:  # host telemetry: likewise (fine buckets of rolled-up hours dropped, as GPU buckets)
            from auditor.store.node import ingest_nodes

            stats.nodes += _flush_side(store, nodes, stats, seen_at_ts, on_bad, lambda conn, recs, bad_: ingest_nodes(
                conn, recs, bad_, meta.rolled_up_before(conn)))
        if ports:  # likewise
            from auditor.store.node import ingest_ports

            stats.ports += _flush_side(store, ports, stats, seen_at_ts, on_bad, lambda conn, recs, bad_: ingest_ports(
                conn, recs, bad_, meta.rolled_up_before(conn)))
        if jobs:  # their own upsert: a Job's counts stand apart from its pods' rows
            from auditor.store.kube_jobs import ingest_kube_jobs

            with store.begin() as conn:
                stats.jobs += ingest_kube_jobs(conn, jobs, seen_at_ts)
            jobs.clear()
        if bad:  # quarantined, not stored: one bad record never costs the others or the audit
            if on_bad is not None:
                for rec, why in bad:
                    on_bad(rec, why)
            else:
                with store.begin() as conn:
                    conn.execute(insert(schema.quarantined_records), quarantine_rows(bad, seen_at_ts))
            stats.quarantined += len(bad)
            bad.clear()
        saved = dict(cache)
        batch = IngestStats()

        def finish(conn: Connection) -> None:
            _finish(conn, snapshots, clusters, seen_at_ts, batch)

        try:
            with store.begin() as conn:
                _write(conn, allocs, resv, inv, buckets, events, seen_at_ts, cache, batch, queue)
                if final:
                    finish(conn)
        except Exception:
            if on_bad is None:
                raise
            cache.clear()
            cache.update(saved)  # ids created by the rolled-back transaction are gone
            batch = IngestStats()
            _row_by_row(store, [*allocs, *resv, *inv, *buckets, *events, *queue], seen_at_ts, cache, batch,
                        on_bad, finish if final else None)
        stats.add(batch)
        for buf in (allocs, resv, inv, buckets, events, queue):
            buf.clear()

    for rec in records:
        if isinstance(rec, GpuBucket):
            buckets.append(rec)
            clusters.add(rec.cluster)
            if len(buckets) >= store.batch_rows:
                flush()
        elif isinstance(rec, Allocation | Reservation) and (why := money_problem(rec)):
            bad.append((rec, why))
        elif isinstance(rec, Allocation):
            allocs.append(rec)
            clusters.add(rec.cluster)
            if len(allocs) >= ALLOC_BATCH:
                flush()
        elif isinstance(rec, Reservation):
            resv.append(rec)
        elif isinstance(rec, GpuInventory):
            inv.append(rec)
            clusters.add(rec.cluster)
        elif isinstance(rec, GpuWait | GpuQuota):
            queue.append(rec)
            clusters.add(rec.cluster)
        elif isinstance(rec, NodeEvent):
            events.append(rec)
            clusters.add(rec.cluster)
        elif isinstance(rec, RunningSnapshot):
            snapshots.append(rec)
        elif isinstance(rec, KubeJob):
            jobs.append(rec)
            clusters.add(rec.cluster)
        elif isinstance(rec, InferenceBucket):
            inference.append(rec)
            clusters.add(rec.cluster)
            if len(inference) >= store.batch_rows:
                flush()
        elif isinstance(rec, NodeBucket):
            nodes.append(rec)
            clusters.add(rec.cluster)
            if len(nodes) >= store.batch_rows:
                flush()
        elif isinstance(rec, PortBucket):
            ports.append(rec)
            clusters.add(rec.cluster)
            if len(ports) >= store.batch_rows:
                flush()
        else:
            raise TypeError(f"not a record: {type(rec).__name__}")
    flush(final=True)
    return stats


def _flush_side(store: Store, recs: list[Any], stats: IngestStats, seen_at_ts: int, on_bad: OnBad | None,
                write: Callable[[Connection, list[Any], Callable[[Any, str], None]], int]) -> int:
    """One batch of a side table's records (inference or node buckets: their own set-based upsert ``write``)
    in one transaction; each record it refuses is quarantined (through ``on_bad`` when given, else a
    quarantine row described as :func:`auditor.store.guard.describe` says). Empties ``recs``; returns the
    rows written."""
    from auditor.store.guard import describe

    refused: list[tuple[Any, str]] = []
    with store.begin() as conn:
        written = write(conn, recs, lambda rec, why: refused.append((rec, why)))
        if refused and on_bad is None:
            conn.execute(insert(schema.quarantined_records), [
                {"collected_ts": seen_at_ts, "cluster": r.cluster[:128], "source": type(r).__name__,
                 "location": describe(r)[0][:255], "reason": why, "excerpt": repr(r)[:200]} for r, why in refused])
    for rec, why in refused if on_bad is not None else ():
        on_bad(rec, why)
    stats.quarantined += len(refused)
    recs.clear()
    return written
