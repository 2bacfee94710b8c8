"""Per-cluster audits in parallel processes (``store.audit_processes``, PostgreSQL).

PostgreSQL runs one query on one core, and one Python process holds one audit's findings. The clusters of a
site are disjoint (their allocations, GPUs, queues, quotas and reservations), so one audit run can be split
by cluster: each group of clusters is attributed, judged and turned into usage, per-allocation totals and
findings in its own process on its own connection (:mod:`auditor.audit.clusters`), bounded in memory by its
own allocations, and hands back its part of the run summary (:class:`auditor.audit.findings.Part`), which
the audit's own process merges.

Each group works under a run id of its own (a "part" row in audit_runs), so every query over "the run's
usage" reads its own clusters' rows only, as in a whole-fleet audit: first every process judges and commits
its usage; then the audit's own process refreshes the statistics of ``usage_gpu`` (the rules' plans need
them: without, PostgreSQL took minutes per query at 100,000 GPUs); then every process writes its totals and
findings and commits. Last, in one transaction, the audit relabels all parts' rows with the run's id and
marks it ok: a report never sees a partial run. A process that fails fails the run with one line naming its
clusters; the parts' rows are deleted. Figures are those of a one-process audit of the same store, row for
row; the run summary's totals are sums of the processes' sums (the last bits of a float total can differ from
a one-process audit's). SQLite has one writer at a time: it audits in one process.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import time
from typing import Any

from sqlalchemy import Connection, insert, text, update

from auditor.audit import timing
from auditor.audit.judging import DEFAULT, Judging
from auditor.config import Config, Thresholds
from auditor.errors import GpuAuditError
from auditor.store import schema
from auditor.store.engine import Store

#: the store's tables that name clusters; a cluster found in any is audited by one process
_CLUSTERS = ("SELECT cluster, SUM(n) AS n FROM (SELECT a.cluster, COUNT(*) AS n FROM allocations a JOIN "
             "allocated_gpus ag ON ag.allocation_id = a.id WHERE a.start_ts < :horizon AND "
             "(a.end_ts IS NULL OR a.end_ts > :since) GROUP BY a.cluster "
             + "".join(f"UNION ALL SELECT DISTINCT cluster, 0 FROM {t} " for t in (
                 "telemetry_gpus", "gpu_inventory", "reservations", "gpu_quotas", "node_events", "gpu_waits"))
             + ") c GROUP BY cluster ORDER BY cluster")
_OUTPUT = (schema.usage_gpu, schema.usage_allocation, schema.findings)


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


def _peak_mib() -> float:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _phase(url: str, batch_rows: int, cfg: Config, th: Thresholds, part_id: int, window: tuple[int, int, int, int],
           clusters: list[str], judge: bool, judging: Judging) -> dict[str, Any]:
    """One process's phase for its clusters, in one committed transaction under its part's run id: judging
    (``judge``), else totals and findings (with that part of the run summary)."""
    from auditor.audit import clusters as scope
    from auditor.audit import infra
    from auditor.audit.usage import setup_pg

    t0, c0 = time.perf_counter(), _cpu()
    store = Store.open(url, batch_rows)
    steps = timing.start()
    out: dict[str, Any] = {}
    try:
        with store.begin() as conn:
            if judge:
                scope.judge_clusters(conn, th, part_id, window, clusters, steps, judging)
            else:
                setup_pg(conn)
                infra.prepare(conn, th, window[0], window[2], allocated=False)  # _infra, for the rules
                out["part"], out["refused"] = scope.find_in_clusters(conn, cfg, th, part_id, window, clusters,
                                                                          judging)
            infra.finish(conn)
    finally:
        store.engine.dispose()
    out.update(wall_s=time.perf_counter() - t0, cpu_s=_cpu() - c0, peak_rss_mib=_peak_mib(), steps=steps.seconds,
               pid=os.getpid())
    return out


def _parts(conn: Connection, run_id: int, n: int, th: Thresholds, window: tuple[int, int, int, int]) -> list[int]:
    """``n`` part rows in audit_runs (what-if, "running": never a report's run) for the groups of run ``run_id``."""
    s, u, _h, now = window
    return [conn.execute(insert(schema.audit_runs).values(
        started_ts=now, since_ts=s, until_ts=u, status="running", what_if=True, thresholds=th.model_dump(),
        summary={"part_of": run_id})).inserted_primary_key[0] for _ in range(n)]


def drop_parts(conn: Connection, parts: list[int]) -> None:
    """Delete the parts' rows and their audit_runs rows (a failed run, or after relabelling)."""
    if parts:
        for t in _OUTPUT:
            conn.execute(t.delete().where(t.c.run_id.in_(parts)))
        conn.execute(schema.audit_runs.delete().where(schema.audit_runs.c.id.in_(parts)))


def relabel(conn: Connection, run_id: int, parts: list[int]) -> None:
    """Move the parts' usage, totals and findings to the run (one transaction with its "ok")."""
    for t in _OUTPUT:
        conn.execute(update(t).where(t.c.run_id.in_(parts)).values(run_id=run_id))
    conn.execute(schema.audit_runs.delete().where(schema.audit_runs.c.id.in_(parts)))


def run(store: Store, cfg: Config, th: Thresholds, run_id: int, window: tuple[int, int, int, int],
        cluster_groups: list[list[str]], steps: timing.Steps, judging: Judging = DEFAULT
        ) -> tuple[list[Any], int, list[dict[str, Any]], list[int]]:
    """Audit each group of clusters in its own process, all at once, under a part run id each (see the
    module); returns their summary parts (in group order), the allocations they refused, per process its
    clusters, wall and CPU seconds and peak RSS, and the part ids (:func:`relabel` them into the run, or
    :func:`drop_parts`). The slowest process's seconds of each step go into ``steps`` (the critical path). Any
    process failing raises :class:`GpuAuditError` naming its clusters, after the others ended; the parts'
    rows are deleted then."""
    with store.begin() as conn:
        part_ids = _parts(conn, run_id, len(cluster_groups), th, window)
    ctx = mp.get_context("spawn")  # a fresh interpreter: no engine, thread or lock inherited from this one
    stats: list[dict[str, Any]] = [{"clusters": g, "wall_s": 0.0, "cpu_s": 0.0, "peak_rss_mib": 0.0}
                                   for g in cluster_groups]
    try:
        with ctx.Pool(len(cluster_groups)) as pool:
            judged = _all(pool, store, cfg, th, part_ids, window, cluster_groups, True, stats, steps,
                          "clusters: judging wall", judging)
            with steps.step("clusters: statistics"), \
                    store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
                c.execute(text("ANALYZE usage_gpu"))  # committed parts: every process's plans see them
            found = _all(pool, store, cfg, th, part_ids, window, cluster_groups, False, stats, steps,
                         "clusters: totals and findings wall", judging)
    except BaseException:
        with store.begin() as conn:
            drop_parts(conn, part_ids)
        raise
    del judged
    return [f["part"] for f in found], sum(f["refused"] for f in found), stats, part_ids


def _all(pool: Any, store: Store, cfg: Config, th: Thresholds, part_ids: list[int], window: tuple[int, int, int, int],
         cluster_groups: list[list[str]], judge: bool, stats: list[dict[str, Any]], steps: timing.Steps,
         name: str, judging: Judging) -> list[dict[str, Any]]:
    with steps.step(f"{name} ({len(cluster_groups)} processes)"):
        pending = [pool.apply_async(_phase, (store.engine.url.render_as_string(hide_password=False),
                                             store.batch_rows, cfg, th, pid, window, g, judge, judging))
                   for pid, g in zip(part_ids, cluster_groups, strict=True)]
        results, failed = [], []
        for g, res in zip(cluster_groups, pending, strict=True):
            try:
                results.append(res.get())
            except Exception as exc:  # noqa: BLE001 - every failure fails the run, named by its clusters
                failed.append((g, exc))
    if failed:
        g, exc = failed[0]
        raise GpuAuditError(f"audit of cluster(s) {', '.join(g)} failed: {type(exc).__name__}: {exc}"[:2000]) from exc
    for st, r in zip(stats, results, strict=True):
        st["wall_s"] += r["wall_s"]
        st["cpu_s"] += r["cpu_s"]
        st["peak_rss_mib"] = max(st["peak_rss_mib"], r["peak_rss_mib"])
        for k, sec in r["steps"].items():
            steps.seconds[k] = max(steps.seconds.get(k, 0.0), sec)
    return results
