"""Per-cluster audits in parallel processes (``store.audit_processes``, PostgreSQL).

PostgreSQL runs one query on one core, and one Python process holds one audit's findings. The clusters of a
site are disjoint (their allocations, GPUs, queues, quotas and reservations), so one audit run can be split
by cluster: each process attributes, judges and writes the usage, per-allocation totals and findings of its
clusters on its own connection (:func:`auditor.audit.clusters.audit_clusters`), bounded in memory by its own
allocations, and hands back its part of the run summary (:class:`auditor.audit.findings.Part`); the audit's
own process merges the parts and marks the run ok only when every process succeeded. A process that fails
fails the run: the rows the others committed are deleted (:func:`auditor.audit.run.run_audit`), so a report
never reads a partial total.

Every process reads the store as of one moment: each opens a REPEATABLE READ transaction, takes its snapshot
and waits at a barrier until all have, so no process sees rows another committed (a query over "the run's
usage" reads its own clusters' only, as in a whole-fleet audit). Figures are those of a one-process audit of
the same store, row for row; the run summary's totals are sums of the processes' sums (the last bits of a
float total can differ from a one-process audit's). SQLite has one writer at a time: it audits in one process.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import threading
import time
from typing import Any

from sqlalchemy import text

from auditor.audit import timing
from auditor.config import Config, Thresholds
from auditor.errors import GpuAuditError
from auditor.store.engine import Store

#: the store's tables that name clusters; a cluster found in any is audited by one process
_CLUSTERS = ("SELECT cluster, SUM(n) AS n FROM (SELECT a.cluster, COUNT(*) AS n FROM allocations a JOIN "
             "allocated_gpus ag ON ag.allocation_id = a.id WHERE a.start_ts < :horizon AND "
             "(a.end_ts IS NULL OR a.end_ts > :since) GROUP BY a.cluster "
             + "".join(f"UNION ALL SELECT DISTINCT cluster, 0 FROM {t} " for t in (
                 "telemetry_gpus", "gpu_inventory", "reservations", "gpu_quotas", "node_events", "gpu_waits"))
             + ") c GROUP BY cluster ORDER BY cluster")
#: how long a process waits for the others to take their snapshots
BARRIER_S = 600


def wanted(cfg: Config) -> int:
    """Processes asked for (``store.audit_processes``; 0 = one per CPU core, at most 8)."""
    n = cfg.store.audit_processes
    return n if n > 0 else max(1, min(8, os.cpu_count() or 1))


def groups(store: Store, cfg: Config, clusters: list[str] | None, since: int, horizon: int) -> list[list[str]]:
    """The clusters of the audit split into at most ``store.audit_processes`` groups of about equal allocated
    GPUs (largest first, each to the lightest group), one per process; [] when it runs in one process
    (SQLite, one process asked for, or one cluster)."""
    n = wanted(cfg)
    if n <= 1 or store.engine.dialect.name != "postgresql":
        return []
    with store.engine.connect() as conn:
        sizes = {r.cluster: int(r.n or 0) for r in conn.execute(text(_CLUSTERS), {"since": since, "horizon": horizon})
                 if not clusters or r.cluster in clusters}
    if len(sizes) <= 1:
        return []
    out: list[list[str]] = [[] for _ in range(min(n, len(sizes)))]
    load = [0] * len(out)
    for name, size in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        k = load.index(min(load))
        out[k].append(name)
        load[k] += size
    return [sorted(g) for g in out]


def _url(store: Store) -> str:
    return store.engine.url.render_as_string(hide_password=False)


def _peak_mib() -> float:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _worker(url: str, batch_rows: int, cfg: Config, th: Thresholds, run_id: int, window: tuple[int, int, int, int],
            clusters: list[str], barrier: Any) -> tuple[Any, int, dict[str, Any]]:
    """One process: the audit of ``clusters`` in one REPEATABLE READ transaction whose snapshot was taken
    before any process committed (the barrier); committed on success."""
    from auditor.audit.clusters import audit_clusters

    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    store = Store.open(url, batch_rows)
    steps = timing.start()
    try:
        with store.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                conn.execute(text("SELECT COUNT(*) FROM audit_runs WHERE id = :r"), {"r": run_id})  # the snapshot
                barrier.wait(BARRIER_S)
                conn.info["gpu_audit_processes"] = True  # no ANALYZE of shared tables (see audit_clusters)
                part, refused = audit_clusters(conn, cfg, th, run_id, window, clusters, steps)
    finally:
        store.engine.dispose()
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return part, refused, {"clusters": clusters, "wall_s": time.perf_counter() - t0,
                           "cpu_s": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime,
                           "peak_rss_mib": _peak_mib(), "steps": steps.seconds}


def run(store: Store, cfg: Config, th: Thresholds, run_id: int, window: tuple[int, int, int, int],
        cluster_groups: list[list[str]], steps: timing.Steps) -> tuple[list[Any], int, list[dict[str, Any]]]:
    """Audit each group of clusters in its own process, all at once; returns their summary parts (in group
    order), the allocations they refused and per process its clusters, wall and CPU seconds, peak RSS and
    steps. The slowest process's seconds of each step go into ``steps`` (the critical path). Any process
    failing raises :class:`GpuAuditError` naming its clusters, after the others ended."""
    ctx = mp.get_context("spawn")  # a fresh interpreter: no engine, thread or lock inherited from this one
    barrier = ctx.Manager().Barrier(len(cluster_groups))
    url = _url(store)
    with ctx.Pool(len(cluster_groups)) as pool, steps.step(f"clusters: wall ({len(cluster_groups)} processes)"):
        # a process that fails breaks the barrier, so none waits for it
        pending = [(g, pool.apply_async(_worker, (url, store.batch_rows, cfg, th, run_id, window, g, barrier),
                                        error_callback=lambda _exc: barrier.abort()))
                   for g in cluster_groups]
        results, failed = [], []
        for g, res in pending:
            try:
                results.append(res.get())
            except Exception as exc:  # noqa: BLE001 - every failure fails the run, named by its clusters
                failed.append((g, exc))
    if failed:  # the first to fail for a reason of its own, not because another broke the barrier
        g, exc = next(((g, e) for g, e in failed if not isinstance(e, threading.BrokenBarrierError)), failed[0])
        raise GpuAuditError(f"audit of cluster(s) {', '.join(g)} failed: {type(exc).__name__}: {exc}"[:2000]) from exc
    for _part, _n, w in results:
        for name, sec in w["steps"].items():
            steps.seconds[name] = max(steps.seconds.get(name, 0.0), sec)
    return [p for p, _n, _w in results], sum(n for _p, n, _w in results), [w for _p, _n, w in results]
