"""Collection: run each cluster's connectors over an incremental window and ingest what they return.

Fault isolation: a failing source is retried a bounded number of times when the failure is transient, then
reported; other sources and clusters go on. The watermark of a source moves only after everything it
returned is committed, so a crash or failure means the next run re-reads (ingest is idempotent).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert, text
from sqlalchemy.exc import SQLAlchemyError

import connectors
from auditor.config import ClusterConfig, Config, SourceConfig, source_key
from auditor.contract import Context, Problems, Window
from auditor.errors import GpuAuditError, StoreError
from auditor.records import NodeBucket, RunningSnapshot
from auditor.store import guard, schema
from auditor.store.engine import Store
from auditor.store.stats import IngestStats
from auditor.timeutil import ceil_to, floor_to, from_epoch, to_epoch, utcnow
from connectors import retry

#: Each collection re-reads this much before its watermark, so data that arrived late is picked up (ingest is
#: idempotent): a scrape or export delayed by minutes, never by more (a `clusters[]` setting until issue 45)
OVERLAP_MINUTES = 30

log = logging.getLogger("gpu_audit.collect")

RETRIES = retry.RETRIES  # the policy lives in connectors.retry (one for every source)
#: ``extra`` of the one log line that sums a source up (stats, failure, or why nothing was stored): the
#: daemon's record of it; ``gpu-audit collect`` prints the same as its own line and filters these out
SUMMARY = {"gpu_audit_summary": True}

#: Connector instances kept for the life of the process, so a daemon's connectors keep their state between
#: collections (a Kubernetes watch's resourceVersion, caches). Keyed by cluster, source and options.
_INSTANCES: dict[tuple[str, str, str, str], Any] = {}


def connector_for(cluster: str, role: str, index: int, src: SourceConfig, base_dir: Path) -> Any:
    import json

    key = (cluster, source_key(role, index, src), json.dumps(src.options(), sort_keys=True, default=str),
           str(base_dir))
    inst = _INSTANCES.get(key)
    if inst is None:
        inst = _INSTANCES[key] = connectors.build(src.kind, role, src.options(), Context(cluster, base_dir))
    return inst


@dataclass
class SourceResult:
    cluster: str
    source: str
    ok: bool
    since: str
    until: str
    error: str = ""
    attempts: int = 1
    seconds: float = 0.0
    skipped: int = 0
    clamped: int = 0
    stats: dict[str, int] = field(default_factory=dict)
    warning: str = ""  # e.g. a non-empty source that stored nothing: says why (issue 14 §4)
    #: what the source kept in a lesser form or could not store, one line each (GPUs with only unstored
    #: metrics, jobs whose GPU count came from slurmctld): shown under the source's line
    notes: list[str] = field(default_factory=list)


@dataclass
class CollectSummary:
    results: list[SourceResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def failed(self) -> list[SourceResult]:
        return [r for r in self.results if not r.ok]

    @property
    def skipped(self) -> int:
        return sum(r.skipped for r in self.results)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "skipped_records": self.skipped, "sources": [asdict(r) for r in self.results]}


def plan_window(store: Store, cluster: ClusterConfig, key: str, bucket: int, now: datetime,
                since: datetime | None, until: datetime | None, role: str = "telemetry") -> Window:
    """The next window for one source: from its watermark minus the overlap, aligned to buckets.
    Allocation windows end *now* (not at the last bucket boundary): jobs that started minutes ago are
    read on the first run, and "last seen" is the real sighting time, so a vanished job or pod is closed
    at its last sighting, never at a boundary before it (issue 14)."""
    def start_for(end: datetime) -> datetime:  # --since, else the watermark less the overlap, else initial_days
        if since is not None:
            return floor_to(since, bucket)
        wm = store.watermark(cluster.name, key)
        return floor_to((from_epoch(wm) - timedelta(minutes=OVERLAP_MINUTES)) if wm is not None
                        else end - timedelta(days=cluster.initial_days), bucket)

    if role == "allocations":
        end = min(until or now, now)
        start = start_for(end)
        return Window(start, max(end, start + timedelta(seconds=1)), bucket)
    end = floor_to(min(until or now, now), bucket)
    start = start_for(end)
    if start >= end:
        start = end - timedelta(seconds=bucket)
    return Window(start, ceil_to(end, bucket), bucket)


Progress = Callable[[str, int, bool], None]  # (source, records so far, finished)


def _counted(records: Iterable[Any], what: str, progress: Progress | None, every: int = 5000) -> Iterator[Any]:
    """Pass records through, reporting how many went by (for the CLI's progress line)."""
    n = 0
    for n, rec in enumerate(records, 1):
        if progress and n % every == 0:
            progress(what, n, False)
        yield rec
    if progress:
        progress(what, n, True)


def _guarded(records: Iterable[Any], source: str, problems: Problems) -> Iterator[Any]:
    """Records made storable (:mod:`auditor.store.guard`); one that cannot be is quarantined, the rest go on."""
    for rec in records:
        if isinstance(rec, RunningSnapshot):
            yield rec
            continue
        try:
            yield guard.clean(rec)
        except (guard.Unstorable, ValueError, TypeError, OverflowError, RecursionError) as exc:
            location, excerpt = guard.describe(rec)
            problems.skip(source, location, str(exc).splitlines()[0] if str(exc) else type(exc).__name__, excerpt)


def _attempt(store: Store, cluster: ClusterConfig, role: str, index: int, src: SourceConfig, window: Window,
             base_dir: Path, progress: Progress | None) -> tuple[IngestStats, Problems, str, list[str]]:
    """One attempt at a source: read, store (refused records quarantined), then quarantine + watermark;
    with why nothing was stored from a source that had input ("" otherwise) and the connector's notes."""
    key = source_key(role, index, src)
    problems = Problems()
    conn = connector_for(cluster.name, role, index, src, base_dir)
    seen = to_epoch(min(window.until, utcnow())) or 0

    def refused(rec: Any, reason: str) -> None:
        location, excerpt = guard.describe(rec)
        problems.skip(key, location, reason, excerpt)

    if role == "telemetry" and hasattr(conn, "gpu_holders"):
        conn.gpu_holders = _gpu_holders(store, cluster.name, window)
    hosts: set[str] = set()  # the nodes host telemetry named (matched against the known GPU nodes below)

    def noted(recs: Iterable[Any]) -> Iterator[Any]:
        for r in recs:
            if isinstance(r, NodeBucket):
                hosts.add(r.node)
            yield r

    records = _guarded(_counted(noted(conn.collect(window, problems)), f"{cluster.name} {key}", progress), key,
                       problems)
    stats: IngestStats = store.ingest(records, seen_at_ts=seen, on_bad=refused)
    _finish(store, cluster.name, key, problems, to_epoch(window.until) or 0)
    notes = list(getattr(conn, "notes", None) or ())
    unmatched = _unmatched_nodes(store, cluster.name, hosts, key)
    warning = _nothing_stored(conn, stats, problems)
    if unmatched.startswith("no node"):
        warning = f"{warning}; {unmatched}" if warning else unmatched
    elif unmatched:
        notes.append(unmatched)
    return stats, problems, warning, notes


def _gpu_holders(store: Store, cluster: str, window: Window) -> frozenset[str]:
    """``namespace/pod`` of the Kubernetes pods of the cluster that held GPUs during the window (its allocations
    are collected before its telemetry): never taken for an exporter's DaemonSet pods (connectors.workload)."""
    since, until = to_epoch(window.since) or 0, to_epoch(window.until) or 0
    with store.engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT DISTINCT account, name FROM allocations WHERE cluster = :c AND source = 'kubernetes' "
            "AND gpu_count > 0 AND start_ts IS NOT NULL AND start_ts < :u AND (end_ts IS NULL OR end_ts > :s)"),
            {"c": cluster, "s": since, "u": until})
        return frozenset(f"{r.account}/{r.name}" for r in rows)


def _unmatched_nodes(store: Store, cluster: str, hosts: set[str], key: str) -> str:
    """Host telemetry is tied to GPUs by node name (docs/node-telemetry.md): "" when the nodes it named match
    the GPU nodes the store knows (GPU telemetry, the schedulers' allocations and inventory) or there is
    nothing to match; else a line saying which did not and the settings that map them (issue 44: with the
    default mapping a site's host data went under ``127.0.0.1`` while collect said "ok")."""
    if not hosts:
        return ""
    with store.engine.connect() as c:
        known = {r[0] for r in c.execute(text(
            "SELECT host FROM telemetry_gpus WHERE cluster = :c UNION SELECT host FROM gpu_inventory WHERE "
            "cluster = :c UNION SELECT g.node FROM allocated_gpus g JOIN allocations a ON a.id = g.allocation_id "
            "WHERE a.cluster = :c"), {"c": cluster})}
    if not known:
        return ""
    miss = sorted(hosts - known)
    if not miss:
        return ""
    how = (f"map them with this source's options host_label (the label naming the node, default `instance`: "
           f"its host part) or strip_domain ({key}; docs/node-telemetry.md)")
    eg = ", ".join(miss[:3]) + (f" and {len(miss) - 3} more" if len(miss) > 3 else "")
    names = ", ".join(sorted(known)[:3])
    if len(miss) == len(hosts):
        return (f"no node matched: host telemetry named {len(hosts)} node(s) ({eg}), none of them a GPU node "
                f"of this cluster (e.g. {names}), so no GPU's host side can be read; {how}")
    return f"{len(miss)} of {len(hosts)} node(s) matched no GPU node ({eg}); {how}"


def collect_source(store: Store, cfg: Config, cluster: ClusterConfig, role: str, index: int,
                   src: SourceConfig, window: Window, base_dir: Path,
                   sleep: Callable[[float], None] = time.sleep, progress: Progress | None = None) -> SourceResult:
    """Collect one source under the retry policy (:mod:`connectors.retry`). Any error, expected or not, fails
    this source only: it is reported on one line and the other sources go on."""
    key = source_key(role, index, src)
    res = SourceResult(cluster.name, key, False, window.since.isoformat(), window.until.isoformat(), attempts=0)
    t0 = time.monotonic()

    def attempt() -> tuple[IngestStats, Problems, str, list[str]]:
        res.attempts += 1
        return _attempt(store, cluster, role, index, src, window, base_dir, progress)

    def before_retry(n: int, exc: BaseException, wait: float) -> None:
        log.warning("%s %s: %s (attempt %d of %d, retrying in %.0f s)", cluster.name, key, exc, n,
                    retry.RETRIES, wait)

    try:
        with retry.budget(retry.SOURCE_BUDGET_S):
            stats, problems, warning, res.notes = retry.call(attempt, sleep=sleep, before_retry=before_retry)
        res.ok, res.error = True, ""
        res.stats = asdict(stats)
        res.skipped, res.clamped = problems.total, sum(problems.clamped.values())
        res.warning = warning
    except GpuAuditError as exc:
        res.error = _one_line(str(exc))
    except SQLAlchemyError as exc:
        res.error = f"store: {_one_line(str(getattr(exc, 'orig', None) or exc))}"
    except Exception as exc:  # a reader bug must cost this source, not the run
        res.error = f"internal error reading the source ({type(exc).__name__}): {_one_line(str(exc))}"
        log.debug("%s %s: traceback", cluster.name, key, exc_info=True)
    res.attempts = max(res.attempts, 1)
    res.seconds = round(time.monotonic() - t0, 3)
    if res.ok and res.warning:
        log.warning("%s %s: %s", cluster.name, key, res.warning, extra=SUMMARY)
    elif res.ok:
        log.info("%s %s: %s; %d bad records quarantined; %.1f s", cluster.name, key,
                 ", ".join(f"{k} {v}" for k, v in res.stats.items() if v) or "nothing new", res.skipped,
                 res.seconds, extra=SUMMARY)
    else:
        log.error("%s %s failed: %s", cluster.name, key, res.error, extra=SUMMARY)
    return res


def _one_line(text: str) -> str:
    from auditor.logs import scrub

    text = text.strip()
    return scrub(text.splitlines()[0])[:500] if text else "(no message)"


QUARANTINE_TEXT = 2000  # characters kept of a quarantined record's source, location and reason


def _finish(store: Store, cluster: str, key: str, problems: Problems, watermark: int) -> None:
    """Quarantine rows and the watermark in one transaction. Quarantine rows the store refuses (it never
    should: NULs are removed, lengths capped) are logged and dropped rather than keep the watermark stuck
    and the source re-read forever."""
    try:
        with store.begin() as c:
            _quarantine(c, cluster, problems)
            store.set_watermark(c, cluster, key, watermark)
        return
    except (SQLAlchemyError, StoreError) as exc:
        if not problems.items:
            raise
        log.error("%s %s: %d quarantined records could not be stored (%s); they are in the log above only",
                  cluster, key, len(problems.items), _one_line(str(getattr(exc, "orig", None) or exc)))
    with store.begin() as c:
        store.set_watermark(c, cluster, key, watermark)


def _clip(text: object, n: int = QUARANTINE_TEXT) -> str:
    return str(text).replace("\x00", "")[:n]


def _nothing_stored(conn: Any, stats: IngestStats, problems: Problems) -> str:
    """Why a source that had input stored no record ("" when it stored some, or had nothing to read)."""
    if any(getattr(stats, k, 0) for k in ("allocations", "buckets", "reservations", "inventory", "closed", "events",
                                          "inference", "nodes", "ports", "jobs")):
        return ""
    why = getattr(conn, "empty_reason", "") or ""
    if problems.total:
        why = f"{why}; " if why else ""
        why += f"all {problems.total} records were bad (see the quarantine)"
    return f"0 records stored: {why}" if why else ""


def _quarantine(conn: Any, cluster: str, problems: Problems) -> None:
    if not problems.items:
        return
    now = int(utcnow().timestamp())
    conn.execute(insert(schema.quarantined_records), [
        {"collected_ts": now, "cluster": cluster, "source": _clip(s), "location": _clip(loc),
         "reason": _clip(reason), "excerpt": _clip(excerpt, 200)} for s, loc, reason, excerpt in problems.items])


def chosen_clusters(cfg: Config, clusters: list[str] | None = None) -> list[ClusterConfig]:
    """The configured clusters named in ``clusters`` (all when None); an unknown name is an error, raised
    before anything is opened."""
    known = {c.name for c in cfg.clusters}
    for name in clusters or []:
        if name not in known:
            raise GpuAuditError(f"unknown cluster {name!r} (configured: {', '.join(sorted(known)) or 'none'})")
    return [c for c in cfg.clusters if not clusters or c.name in clusters]


def has_sources(clusters: Iterable[ClusterConfig]) -> bool:
    """Whether any of ``clusters`` has a source to collect (a collection without one does nothing)."""
    return any(c.allocations or c.telemetry for c in clusters)


def collect(store: Store, cfg: Config, *, base_dir: Path, clusters: list[str] | None = None,
            since: datetime | None = None, until: datetime | None = None, now: datetime | None = None,
            progress: Progress | None = None, parallel: int | None = None) -> CollectSummary:
    """Collect every configured source once (allocations first, then telemetry), per cluster; with
    ``parallel`` (default ``collect.parallel``) other than 1 and several clusters, each cluster in a worker
    process (:func:`collect_parallel`)."""
    now = now or utcnow()
    summary = CollectSummary()
    bucket = cfg.store.bucket_seconds
    from auditor.store import meta

    with store.engine.connect() as conn:
        meta.check_config_width(conn, bucket)  # a changed width would double count: refuse up front
    chosen = chosen_clusters(cfg, clusters)
    workers = workers_for(cfg.collect.parallel if parallel is None else parallel, len(chosen), store)
    if workers > 1:
        summary.results = collect_parallel(store, cfg, chosen, workers, base_dir=base_dir, since=since,
                                           until=until, now=now, progress=progress)
        return summary
    for cluster in chosen:
        summary.results += collect_cluster(store, cfg, cluster, base_dir=base_dir, since=since, until=until,
                                           now=now, progress=progress)
    return summary


def collect_cluster(store: Store, cfg: Config, cluster: ClusterConfig, *, base_dir: Path,
                    since: datetime | None, until: datetime | None, now: datetime,
                    progress: Progress | None = None) -> list[SourceResult]:
    """Every source of one cluster, allocations first, each failing alone."""
    out = []
    for role in ("allocations", "telemetry"):
        for i, src in enumerate(getattr(cluster, role)):
            key = source_key(role, i, src)
            try:
                window = plan_window(store, cluster, key, cfg.store.bucket_seconds, now, since, until, role)
            except GpuAuditError as exc:
                out.append(SourceResult(cluster.name, key, False, "", "", str(exc)))
                continue
            out.append(collect_source(store, cfg, cluster, role, i, src, window, base_dir, progress=progress))
    return out


def workers_for(parallel: int, clusters: int, store: Store) -> int:
    """Worker processes to use: ``parallel`` (0 = one per cluster up to the CPU count), never more than the
    clusters; 1 (in this process) for an in-memory SQLite store, which another process cannot open."""
    import os

    url = store.engine.url
    if url.get_backend_name() == "sqlite" and (url.database or ":memory:") == ":memory:":
        return 1
    n = parallel or os.cpu_count() or 1
    return max(1, min(n, clusters))


def _worker(send: Any, url: str, batch_rows: int, cfg: Config, name: str, base_dir: str,
            window: tuple[datetime | None, datetime | None, datetime], level: int) -> None:
    """A worker process (spawned): one cluster through its own store connection, records streamed in
    batches by Store.ingest; its results, or one line saying why it failed, go back through ``send``."""
    from auditor.logs import setup_logging

    setup_logging(level)
    store = Store.open(url, batch_rows)
    try:
        cluster = next(c for c in cfg.clusters if c.name == name)
        since, until, now = window
        send.send(collect_cluster(store, cfg, cluster, base_dir=Path(base_dir), since=since, until=until,
                                  now=now))
    except Exception as exc:  # anything else fails this cluster only
        send.send(f"{type(exc).__name__}: {_one_line(str(getattr(exc, 'orig', None) or exc))}")
    finally:
        store.engine.dispose()
        send.close()


def collect_parallel(store: Store, cfg: Config, clusters: list[ClusterConfig], workers: int, *,
                     base_dir: Path, since: datetime | None, until: datetime | None, now: datetime,
                     progress: Progress | None = None, target: Callable[..., None] = _worker
                     ) -> list[SourceResult]:
    """Each cluster in a spawned worker process, at most ``workers`` at a time. Memory per worker is one
    ingest batch (``store.batch_rows``), not a cluster's records. SQLite writers queue on the write lock
    (BEGIN IMMEDIATE and the busy timeout); PostgreSQL takes them concurrently. A cluster whose worker
    fails or dies gets one failed result; the others land. Results come back in configuration order."""
    import multiprocessing as mp
    from multiprocessing.connection import wait

    ctx = mp.get_context("spawn")
    url = store.engine.url.render_as_string(hide_password=False)
    level = logging.getLogger("gpu_audit").getEffectiveLevel()
    todo, running, done = list(clusters), {}, {}
    try:
        while todo or running:
            while todo and len(running) < workers:
                c = todo.pop(0)
                recv, send = ctx.Pipe(duplex=False)
                p = ctx.Process(target=target, name=f"gpu-audit collect {c.name}", daemon=True,
                                args=(send, url, store.batch_rows, cfg, c.name, str(base_dir),
                                      (since, until, now), level))
                p.start()
                send.close()
                running[recv] = (c, p)
            for recv in wait(list(running)):
                c, p = running.pop(recv)
                try:
                    got: Any = recv.recv()
                except EOFError:
                    got = None
                recv.close()
                p.join()
                if not isinstance(got, list):
                    why = got or f"the worker process died (exit code {p.exitcode})"
                    got = [SourceResult(c.name, "worker", False, "", "", f"collecting {c.name} failed: {why}")]
                    log.error("%s failed: %s", c.name, got[0].error, extra=SUMMARY)
                done[c.name] = got
                for r in got:
                    if progress and r.ok:
                        progress(f"{r.cluster} {r.source}", sum(v for v in r.stats.values()
                                                                if isinstance(v, int)), True)
    finally:
        for _, p in running.values():
            p.terminate()
    return [r for c in clusters for r in done[c.name]]
