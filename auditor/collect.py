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

from sqlalchemy import insert

import connectors
from auditor import schema
from auditor.config import ClusterConfig, Config, SourceConfig
from auditor.errors import GpuAuditError, SourceError
from auditor.store import IngestStats, Store
from auditor.timeutil import ceil_to, floor_to, from_epoch, to_epoch, utcnow
from connectors.base import Context, Problems, Window

log = logging.getLogger("gpu_audit.collect")

RETRIES = 3
BACKOFF_S = 1.0

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


def source_key(role: str, index: int, src: SourceConfig) -> str:
    return f"{role}[{index}]:{src.kind}"


def plan_window(store: Store, cluster: ClusterConfig, key: str, bucket: int, now: datetime,
                since: datetime | None, until: datetime | None) -> Window:
    """The next window for one source: from its watermark minus the overlap, aligned to buckets."""
    end = floor_to(min(until or now, now), bucket)
    if since is not None:
        start = since
    else:
        wm = store.watermark(cluster.name, key)
        start = (from_epoch(wm) - timedelta(minutes=cluster.overlap_minutes)) if wm is not None \
            else end - timedelta(days=cluster.initial_days)
    start = floor_to(start, bucket)
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


def collect_source(store: Store, cfg: Config, cluster: ClusterConfig, role: str, index: int,
                   src: SourceConfig, window: Window, base_dir: Path,
                   sleep: Callable[[float], None] = time.sleep, progress: Progress | None = None) -> SourceResult:
    key = source_key(role, index, src)
    res = SourceResult(cluster.name, key, False, window.since.isoformat(), window.until.isoformat())
    t0 = time.monotonic()
    for attempt in range(1, RETRIES + 1):
        res.attempts = attempt
        problems = Problems()
        try:
            conn = connector_for(cluster.name, role, index, src, base_dir)
            seen = to_epoch(min(window.until, utcnow()))
            records = _counted(conn.collect(window, problems), f"{cluster.name} {key}", progress)
            stats: IngestStats = store.ingest(records, seen_at_ts=seen)
            with store.begin() as c:
                _quarantine(c, cluster.name, problems)
                store.set_watermark(c, cluster.name, key, to_epoch(window.until) or 0)
            res.ok, res.error = True, ""
            res.stats = asdict(stats)
            res.skipped, res.clamped = problems.total, sum(problems.clamped.values())
            break
        except SourceError as exc:
            res.error = str(exc)
            if exc.transient and attempt < RETRIES:
                log.warning("%s %s: %s (attempt %d of %d, retrying)", cluster.name, key, exc, attempt, RETRIES)
                sleep(BACKOFF_S * 2 ** (attempt - 1))
                continue
            break
        except GpuAuditError as exc:
            res.error = str(exc)
            break
    res.seconds = round(time.monotonic() - t0, 3)
    if not res.ok:
        log.error("%s %s failed: %s", cluster.name, key, res.error)
    return res


def _quarantine(conn: Any, cluster: str, problems: Problems) -> None:
    if not problems.items:
        return
    now = int(utcnow().timestamp())
    conn.execute(insert(schema.quarantined_records), [
        {"collected_ts": now, "cluster": cluster, "source": s[:255], "location": loc[:255], "reason": reason,
         "excerpt": excerpt} for s, loc, reason, excerpt in problems.items])


def collect(store: Store, cfg: Config, *, base_dir: Path, clusters: list[str] | None = None,
            since: datetime | None = None, until: datetime | None = None, now: datetime | None = None,
            progress: Progress | None = None) -> CollectSummary:
    """Collect every configured source once (allocations first, then telemetry), per cluster."""
    now = now or utcnow()
    summary = CollectSummary()
    bucket = cfg.store.bucket_seconds
    from auditor import meta

    with store.engine.connect() as conn:
        meta.check_config_width(conn, bucket)  # a changed width would double count: refuse up front
    known = {c.name for c in cfg.clusters}
    for name in clusters or []:
        if name not in known:
            raise GpuAuditError(f"unknown cluster {name!r} (configured: {', '.join(sorted(known)) or 'none'})")
    for cluster in cfg.clusters:
        if clusters and cluster.name not in clusters:
            continue
        for role in ("allocations", "telemetry"):
            for i, src in enumerate(getattr(cluster, role)):
                key = source_key(role, i, src)
                try:
                    window = plan_window(store, cluster, key, bucket, now, since, until)
                except GpuAuditError as exc:
                    summary.results.append(SourceResult(cluster.name, key, False, "", "", str(exc)))
                    continue
                summary.results.append(collect_source(store, cfg, cluster, role, i, src, window, base_dir,
                                                      progress=progress))
    return summary
